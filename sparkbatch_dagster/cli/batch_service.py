"""The state behind ``sparkbatch serve-batch``: uploaded files, batches, and the one worker that
runs them (:mod:`.serve_batch` is the HTTP side).

Everything lives under one folder, so a server killed at any moment and started again on the same
``--root`` carries on::

    files/<file-id>.jsonl, files/<file-id>.json     an uploaded file and its FileObject
    batches/<batch-id>.json                         the Batch object (status, file ids, times)
    batches/<batch-id>/home/                        the batch's job: shards, checkpoints, commits
    batches/<batch-id>/output.jsonl, errors.jsonl   its result files, written when it ends

Each batch is a batch-file job (:func:`..definitions.batch_files.batch_file_job`) run by a
``sparkbatch run-batch`` child process, one batch at a time (one engine on the box). The child is
stopped by the kernel if the server dies; on the next start every batch that was not over is
queued again and its run resumes from its checkpoints (rows already answered are not asked again).
A cancel interrupts the child, then the rows finished so far become the batch's result files.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ..definitions.batch_files import batch_counts, batch_file_job, export_batch
from ..definitions.resource import VLLMResource
from ..errors import ConfigError
from ..spec import SamplingSpec

#: A batch in one of these has not ended: a restarted server takes it up again.
OPEN = ("validating", "in_progress", "finalizing", "cancelling")
ENDPOINT = "/v1/chat/completions"
#: Seconds a cancelled run gets to stop on its own before its process group is killed.
STOP_GRACE_S = 60.0


def now() -> int:
    return int(time.time())


def write_json(path: Path, obj: dict[str, Any]) -> None:
    """``obj`` at ``path``, replaced whole: a reader (or a server killed mid-write) never sees half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


class Store:
    """The files and batches under ``root`` (see the module's docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files, self.batches = root / "files", root / "batches"
        self.files.mkdir(parents=True, exist_ok=True)
        self.batches.mkdir(parents=True, exist_ok=True)
        self.lock = threading.RLock()

    def add_file(self, data: bytes | Path, filename: str, purpose: str) -> dict[str, Any]:
        """Keep an uploaded file (or move a result file in); return its FileObject."""
        fid = f"file-{secrets.token_hex(12)}"
        path = self.files / f"{fid}.jsonl"
        if isinstance(data, Path):
            os.replace(data, path)
        else:
            path.write_bytes(data)
        meta = {"id": fid, "object": "file", "bytes": path.stat().st_size, "created_at": now(),
                "filename": filename, "purpose": purpose, "status": "processed", "expires_at": None,
                "status_details": None}
        write_json(self.files / f"{fid}.json", meta)
        return meta

    def file(self, fid: str) -> dict[str, Any] | None:
        return _read(self.files / f"{_safe(fid)}.json")

    def file_path(self, fid: str) -> Path:
        return self.files / f"{_safe(fid)}.jsonl"

    def batch(self, bid: str) -> dict[str, Any] | None:
        return _read(self.batches / f"{_safe(bid)}.json")

    def save(self, batch: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            write_json(self.batches / f"{batch['id']}.json", batch)
        return batch

    def update(self, bid: str, **fields: Any) -> dict[str, Any]:
        with self.lock:
            batch = self.batch(bid)
            assert batch is not None, bid
            return self.save({**batch, **fields})

    def all_batches(self) -> list[dict[str, Any]]:
        """Newest first, as the Batches API lists them."""
        found = [b for p in self.batches.glob("batch_*.json") if (b := _read(p)) is not None]
        return sorted(found, key=lambda b: (b["created_at"], b["id"]), reverse=True)

    def folder(self, bid: str) -> Path:
        return self.batches / _safe(bid)


def _safe(name: str) -> str:
    """An id as a file name: nothing that walks out of the folder."""
    if not name or "/" in name or "\\" in name or name.startswith("."):
        return "-invalid-"
    return name


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return None


class Worker:
    """Runs queued batches one after another in ``sparkbatch run-batch`` children.

    ``engine``: the child's engine arguments (``--model M``, ``--engine-file F`` or none), whose
    settings ``resource`` holds; ``max_tokens``, ``shard_size``, ``hourly_rate``: as for ``run-batch``.
    """

    def __init__(self, store: Store, engine: list[str], resource: VLLMResource, max_tokens: int, shard_size: int,
                 hourly_rate: float) -> None:
        self.store, self.engine, self.resource = store, engine, resource
        self.max_tokens, self.shard_size = max_tokens, shard_size
        self.options = ["--max-tokens", str(max_tokens), "--shard-size", str(shard_size),
                        "--hourly-rate", str(hourly_rate)]
        self._jobs: dict[str, Any] = {}  # a batch's job, built once (a poll comes every second)
        self.queue: queue.Queue[str] = queue.Queue()
        self.child: subprocess.Popen[bytes] | None = None
        self.running: str | None = None
        self.cancelled: set[str] = set()
        self._progress: dict[str, float] = {}
        self._finishing = threading.Lock()

    def start(self) -> None:
        """Take up the batches a previous server left open, then serve the queue."""
        for batch in sorted(self.store.all_batches(), key=lambda b: b["created_at"]):
            if batch["status"] == "cancelling":
                self._finish(batch["id"], "cancelled")
            elif batch["status"] in OPEN:
                self.queue.put(batch["id"])
        threading.Thread(target=self._loop, name="sparkbatch-batches", daemon=True).start()

    def submit(self, batch: dict[str, Any]) -> None:
        self.queue.put(batch["id"])

    def cancel(self, bid: str) -> dict[str, Any]:
        """Stop a batch: a queued one ends at once, a running one when its child has stopped."""
        with self.store.lock:
            batch = self.store.batch(bid)
            assert batch is not None
            if batch["status"] not in OPEN or batch["status"] == "cancelling":
                return batch
            self.cancelled.add(bid)
            batch = self.store.update(bid, status="cancelling", cancelling_at=now())
            child = self.child if self.running == bid else None
        if child is None:  # queued, not running: it ends now, not when the batches before it have run
            self._finish(bid, "cancelled")
            return self.store.batch(bid) or batch
        child.send_signal(signal.SIGINT)  # run-batch stops as on Ctrl-C, its finished rows kept
        # A child started with SIGINT ignored (a server run with `&` from a script) never sees
        # it: then its whole process group goes, engine included; its checkpoints stay.
        threading.Thread(target=_kill_late, args=(child, STOP_GRACE_S), daemon=True).start()
        return batch

    def job(self, bid: str) -> Any:
        if bid not in self._jobs:
            batch = self.store.batch(bid)
            assert batch is not None
            self._jobs[bid], _ = batch_file_job(
                self.store.file_path(batch["input_file_id"]), "openai_batch", home=self.store.folder(bid) / "home",
                name=_job_name(bid), resource=self.resource, sampling=SamplingSpec(max_tokens=self.max_tokens),
                shard_size=self.shard_size)
        return self._jobs[bid]

    def progress(self, bid: str) -> dict[str, Any]:
        """The batch as stored, with ``request_counts`` from its finished rows (counted at most
        once a second while it runs)."""
        batch = self.store.batch(bid)
        if batch is None or batch["status"] != "in_progress" or time.monotonic() - self._progress.get(bid, 0) < 1:
            return batch or {}
        self._progress[bid] = time.monotonic()
        try:
            counts = batch_counts(self.job(bid), self.resource)
        except Exception:  # noqa: BLE001 - not sharded yet: the counts stay as they were
            return batch
        with self.store.lock:
            batch = self.store.batch(bid) or batch
            if batch["status"] != "in_progress":
                return batch
            return self.store.update(bid, request_counts=_counts(counts, batch))

    def _export(self, bid: str) -> dict[str, Any]:
        folder = self.store.folder(bid)
        return export_batch(self.job(bid), folder / "output.jsonl", folder / "errors.jsonl", self.resource)

    def _loop(self) -> None:
        while True:
            bid = self.queue.get()
            batch = self.store.batch(bid)
            if batch is None or batch["status"] not in OPEN:
                continue
            if bid in self.cancelled or batch["status"] == "cancelling":
                self._finish(bid, "cancelled")
                continue
            try:
                self._run(bid)
            except Exception as exc:  # noqa: BLE001 - one batch's failure must not stop the others
                self._finish(bid, "failed", f"{type(exc).__name__}: {exc}")

    def _run(self, bid: str) -> None:
        folder = self.store.folder(bid)
        folder.mkdir(exist_ok=True)
        batch = self.store.batch(bid)
        assert batch is not None
        cmd = [sys.executable, "-m", "sparkbatch_dagster.cli", "run-batch", "--format", "openai_batch",
               "-i", str(self.store.file_path(batch["input_file_id"])), "--home", str(folder / "home"),
               "-o", str(folder / "output.jsonl"), "--errors", str(folder / "errors.jsonl"),
               "--job-name", _job_name(bid), *self.engine, *self.options]
        from ..engines.server_process import spawn_owned

        with self.store.lock:
            if bid in self.cancelled:
                self._finish(bid, "cancelled")
                return
            self.store.update(bid, status="in_progress", in_progress_at=batch.get("in_progress_at") or now())
            with (folder / "run.log").open("ab") as log:  # the child stops when this server dies
                self.child, self.running = spawn_owned(cmd, stdout=subprocess.DEVNULL, stderr=log,
                                                       cwd=str(self.store.root)), bid
        code = self.child.wait()
        with self.store.lock:
            self.child, self.running = None, None
        if bid in self.cancelled:
            self._finish(bid, "cancelled")
        elif code == 0:
            self.store.update(bid, status="finalizing", finalizing_at=now())
            self._finish(bid, "completed")
        else:
            self._finish(bid, "failed", _last_line(folder / "run.log") or f"run-batch exited with code {code}")

    def _finish(self, bid: str, status: str, error: str | None = None) -> None:
        """End a batch: its finished rows become result files (all of them when completed, those
        done so far when cancelled or failed), registered as files the client can download."""
        with self._finishing:  # once: a cancel and the worker may both end a queued batch
            batch = self.store.batch(bid)
            if batch is not None and batch["status"] in OPEN:
                self._end(bid, status, error)

    def _end(self, bid: str, status: str, error: str | None) -> None:
        folder = self.store.folder(bid)
        fields: dict[str, Any] = {"status": status, f"{status}_at": now()}
        try:
            counts = self._export(bid)
        except Exception as exc:  # noqa: BLE001 - nothing was sharded: no result files
            counts = None
            if status == "failed":
                error = error or f"{type(exc).__name__}: {exc}"
        if counts is not None:
            fields["request_counts"] = _counts(counts, self.store.batch(bid) or {})
            if counts["written"] or status == "completed":
                fields["output_file_id"] = self.store.add_file(folder / "output.jsonl", "output.jsonl",
                                                               "batch_output")["id"]
            if counts["errors"]:
                fields["error_file_id"] = self.store.add_file(folder / "errors.jsonl", "errors.jsonl",
                                                              "batch_output")["id"]
        if error is not None:
            fields["errors"] = {"object": "list", "data": [{"code": "run_failed", "message": error, "param": None,
                                                            "line": None}]}
        self.store.update(bid, **fields)


def _kill_late(child: subprocess.Popen[bytes], grace_s: float) -> None:
    try:
        child.wait(grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)


def _counts(summary: dict[str, Any], batch: dict[str, Any]) -> dict[str, int]:
    """``request_counts`` from an export's summary; before the job is sharded (no rows yet), the
    total stays the input's line count."""
    total = int(summary["rows"]) or int((batch.get("request_counts") or {}).get("total") or 0)
    return {"total": total, "completed": int(summary["written"]), "failed": int(summary["errors"])}


def _job_name(bid: str) -> str:
    return "batch_" + bid.removeprefix("batch_")[:40]


def _last_line(path: Path) -> str | None:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return None
    return lines[-1][-2000:] if lines else None


def new_batch(store: Store, body: dict[str, Any]) -> dict[str, Any]:
    """A Batch object for ``body`` (``batches.create``'s), checked: a ConfigError names what is wrong."""
    fid = body.get("input_file_id")
    if not isinstance(fid, str) or store.file(fid) is None:
        raise ConfigError(f"input_file_id {fid!r} is not a file on this server: upload it with files.create first")
    if body.get("endpoint") != ENDPOINT:
        raise ConfigError(f"endpoint {body.get('endpoint')!r} is not served here: use {ENDPOINT!r}")
    if body.get("completion_window", "24h") != "24h":
        raise ConfigError(f"completion_window {body.get('completion_window')!r}: use '24h'")
    lines = sum(1 for line in store.file_path(fid).read_bytes().splitlines() if line.strip())
    created = now()
    batch = {"id": f"batch_{secrets.token_hex(12)}", "object": "batch", "endpoint": ENDPOINT, "errors": None,
             "input_file_id": fid, "completion_window": "24h", "status": "validating", "output_file_id": None,
             "error_file_id": None, "created_at": created, "in_progress_at": None, "expires_at": created + 86400,
             "finalizing_at": None, "completed_at": None, "failed_at": None, "expired_at": None,
             "cancelling_at": None, "cancelled_at": None, "metadata": body.get("metadata"), "model": None,
             "request_counts": {"total": lines, "completed": 0, "failed": 0}, "usage": None}
    return store.save(batch)
