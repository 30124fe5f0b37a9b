"""The files and batches of ``sparkbatch serve-batch`` on disk (:class:`Store`), and a new Batch
object (:func:`new_batch`); :mod:`.batch_service` runs the batches.

Everything lives under one folder, so a server killed at any moment and started again on the same
``--root`` carries on::

    files/<file-id>.jsonl, files/<file-id>.json     an uploaded file and its FileObject
    batches/<batch-id>.json                         the Batch object (status, file ids, times)
    batches/<batch-id>/home/                        the batch's job: shards, checkpoints, commits
    batches/<batch-id>/output.jsonl, errors.jsonl   its result files, written when it ends

Each object file is replaced whole (:func:`write_json`): a reader never sees half of one.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from pathlib import Path
from typing import Any

from ..errors import ConfigError

#: A batch in one of these has not ended: a restarted server takes it up again.
OPEN = ("validating", "in_progress", "finalizing", "cancelling")
ENDPOINT = "/v1/chat/completions"
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

    def all_files(self) -> list[dict[str, Any]]:
        """Every FileObject, oldest first (``files.list`` pages them either way): by ``created_at``,
        then by when its object was written (files made in the same second keep their order)."""
        found = [(f, _mtime(p)) for p in self.files.glob("file-*.json") if (f := _read(p)) is not None]
        return [f for f, _ in sorted(found, key=lambda fw: (fw[0]["created_at"], fw[1], fw[0]["id"]))]

    def delete_file(self, fid: str) -> None:
        """Forget a file: its object first (it is gone for every reader), then its bytes."""
        with self.lock:
            (self.files / f"{_safe(fid)}.json").unlink(missing_ok=True)
            self.file_path(fid).unlink(missing_ok=True)

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


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:  # deleted meanwhile
        return 0


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return None



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
