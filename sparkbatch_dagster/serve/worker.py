"""The worker behind ``sparkbatch serve-batch``: it validates each new batch, then runs the batches
one after another (:mod:`.app` is the HTTP side, :mod:`.store` the files on disk).

A batch is first ``validating`` (:mod:`.validate`: a file OpenAI would refuse fails the
batch, line by line), then ``in_progress`` until its turn comes and it has run, ``finalizing``
while its result files are written, then ``completed``. Each batch is a batch-file job
(:func:`..definitions.batch_files.batch_file_job`) run by a ``sparkbatch run-batch`` child
process, one batch at a time (one engine on the box). The child is killed by the kernel if the
server dies (its engine's watchdog ends the engine); on the next start every batch that was not
over is queued again and its run resumes from its checkpoints (rows already answered are not
asked again). A cancel interrupts the child,
then the rows finished so far become the batch's result files (:mod:`.ending`).

An Anthropic Message Batch (:mod:`.anthropic_batches`, ``format`` ``anthropic_batch``) is checked
when it is created, so it skips ``validating``; it is queued and run as any batch is, on the same
answer store.
"""

from __future__ import annotations

import contextlib
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ..definitions.batch_files import batch_counts, batch_file_job, export_batch
from ..definitions.resource import VLLMResource
from ..engines.platform.processes import kill_group_late, spawn_owned
from ..run.batch_export import ExportSummary
from ..spec import SamplingSpec
from .ending import NOTHING_RAN, counts_of, ended, usage_fields
from .openai_models import BatchErrors, RequestCounts
from .record import MESSAGE_BATCH, BatchRecord, Changes, Ending
from .store import Store, now
from .validate import validate_file

__all__ = ["STOP_GRACE_S", "Store", "Worker"]

#: Seconds a cancelled run gets to stop on its own before its process group is killed.
STOP_GRACE_S = 60.0
#: Seconds between two looks for batches past their ``expires_at``.
EXPIRY_CHECK_S = 30.0


class Worker:
    """Runs queued batches one after another in ``sparkbatch run-batch`` children.

    ``engine``: the child's engine arguments (``--model M``, ``--engine-file F`` or none), whose
    settings ``resource`` holds; ``sampling``: what a line that sets none gets (its ``max_tokens``; its
    ``temperature`` only where given, else the hosted APIs' 1.0); ``shard_size``, ``hourly_rate``: as for
    ``run-batch``.
    """

    def __init__(self, store: Store, engine: list[str], resource: VLLMResource, sampling: SamplingSpec,
                 shard_size: int, hourly_rate: float) -> None:
        self.store, self.engine, self.resource = store, engine, resource
        self.sampling, self.shard_size = sampling, shard_size
        # One answer store for every batch: its answers are kept per model identity, sampling and
        # output (the store's context), so a request any earlier batch asked of this model is reused.
        self.answers = store.root / "answers"
        self.options = ["--max-tokens", str(sampling.max_tokens), "--shard-size", str(shard_size),
                        "--hourly-rate", str(hourly_rate), "--result-store", str(self.answers)]
        if "temperature" in sampling.model_fields_set:  # else the child's default, the APIs' 1.0 too
            self.options += ["--temperature", str(sampling.temperature)]
        self._jobs: dict[str, Any] = {}  # a batch's job, built once (a poll comes every second)
        self.checks: queue.Queue[str] = queue.Queue()  # batches to validate, then...
        self.queue: queue.Queue[str] = queue.Queue()  # ...to run, one at a time
        self.child: subprocess.Popen[bytes] | None = None
        self.running: str | None = None
        self.stopping: dict[str, Ending] = {}  # a batch being stopped -> how it ends: cancelled or expired
        self._progress: dict[str, float] = {}
        self._finishing = threading.Lock()

    def start(self) -> None:
        """Take up the batches a previous server left open, then serve the queues."""
        for batch in sorted(self.store.all_batches(), key=lambda b: b.created_at):
            if batch.status == "cancelling":
                self._finish(batch.id, "cancelled")
            elif batch.status == "validating":
                self.checks.put(batch.id)
            elif batch.is_open:
                self.queue.put(batch.id)
        threading.Thread(target=self._validate_loop, name="sparkbatch-validate", daemon=True).start()
        threading.Thread(target=self._expire_loop, name="sparkbatch-expire", daemon=True).start()
        threading.Thread(target=self._loop, name="sparkbatch-batches", daemon=True).start()

    def submit(self, batch: BatchRecord) -> None:
        """Validate a new batch (:func:`.validate.validate_file`), then queue it to run; a
        Message Batch, checked at create, is queued at once."""
        (self.checks if batch.status == "validating" else self.queue).put(batch.id)

    def _validate_loop(self) -> None:
        while True:
            bid = self.checks.get()
            try:
                self._validate(bid)
            except Exception as exc:  # noqa: BLE001 - one batch's failure must not stop the others
                self._finish(bid, "failed", f"{type(exc).__name__}: {exc}")

    def _validate(self, bid: str) -> None:
        """``validating`` -> ``failed`` with the file's problems line by line, or -> ``in_progress``
        (OpenAI's: a validated batch is in progress, whether or not its turn to run has come)."""
        batch = self.store.batch(bid)
        if batch is None or batch.status != "validating":
            return
        problems = validate_file(self.store.file_path(batch.input_file_id), batch.endpoint)
        with self.store.lock:
            if (current := self.store.batch(bid)) is None or current.status != "validating":  # cancelled meanwhile
                return
            if problems:
                # Nothing of it runs and no result file is written: no request is counted (OpenAI's).
                failed: Changes = {**usage_fields(NOTHING_RAN), "status": "failed", "failed_at": now(),
                                   "errors": BatchErrors(data=tuple(problems)),
                                   "request_counts": RequestCounts(total=0, completed=0, failed=0)}
                self.store.update(bid, **failed)
                return
            self.store.update(bid, status="in_progress", in_progress_at=now())
        self.queue.put(bid)

    def cancel(self, bid: str) -> BatchRecord:
        """``cancelling``, then ``cancelled``: a queued batch at once, a running one when its child
        has stopped; its requests not run become ``batch_cancelled`` error lines."""
        return self._stop(bid, "cancelled")

    def expire_due(self, at: int | None = None) -> list[str]:
        """End every open batch whose ``expires_at`` has passed (``at``: now) as ``expired``: its
        finished rows are its results, the rest ``batch_expired`` error lines. Returns their ids."""
        due = [b.id for b in self.store.all_batches() if b.is_open and b.status != "cancelling"
               and b.id not in self.stopping and b.expires_at <= (at if at is not None else now())]
        for bid in due:
            self._stop(bid, "expired")
        return due

    def _expire_loop(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # a store read racing a write: the next round sees it
                self.expire_due()
            time.sleep(EXPIRY_CHECK_S)

    def _stop(self, bid: str, ending: Ending) -> BatchRecord:
        with self.store.lock:
            batch = self.store.batch(bid)
            assert batch is not None
            if not batch.is_open or batch.status == "cancelling" or bid in self.stopping:
                return batch
            self.stopping[bid] = ending
            if ending == "cancelled":
                batch = self.store.update(bid, status="cancelling", cancelling_at=now())
            child = self.child if self.running == bid else None
        if child is None:  # queued, not running: it ends now, not when the batches before it have run
            self._finish(bid, ending)
            return self.store.batch(bid) or batch
        child.send_signal(signal.SIGINT)  # run-batch stops as on Ctrl-C, its finished rows kept
        # A child started with SIGINT ignored (a server run with `&` from a script) never sees
        # it: then its whole process group goes, engine included; its checkpoints stay.
        threading.Thread(target=kill_group_late, args=(child, STOP_GRACE_S), daemon=True).start()
        return batch

    def job(self, bid: str) -> Any:
        if bid not in self._jobs:
            batch = self.store.batch(bid)
            assert batch is not None
            self._jobs[bid], _ = batch_file_job(
                self.store.file_path(batch.input_file_id), batch.format, home=self.store.folder(bid) / "home",
                name=_job_name(bid), resource=self.resource, sampling=self.sampling,
                shard_size=self.shard_size, result_store=str(self.answers))
        return self._jobs[bid]

    def progress(self, bid: str) -> BatchRecord | None:
        """The batch as stored (None: gone), with ``request_counts`` from its finished rows
        (counted at most once a second while it runs)."""
        batch = self.store.batch(bid)
        if batch is None or batch.status != "in_progress" or time.monotonic() - self._progress.get(bid, 0) < 1:
            return batch
        self._progress[bid] = time.monotonic()
        try:
            counts = batch_counts(self.job(bid), self.resource)
        except Exception:  # noqa: BLE001 - not sharded yet: the counts stay as they were
            return batch
        with self.store.lock:
            batch = self.store.batch(bid) or batch
            if batch.status != "in_progress":
                return batch
            return self.store.update(bid, request_counts=counts_of(counts, batch))

    def _final_counts(self, batch: BatchRecord) -> Changes:
        """``request_counts`` from the finished rows, read now (none if they cannot be read)."""
        try:
            return {"request_counts": counts_of(batch_counts(self.job(batch.id), self.resource), batch)}
        except Exception:  # noqa: BLE001 - the export that follows says what is wrong
            return {}

    def _export(self, batch: BatchRecord) -> ExportSummary:
        folder = self.store.folder(batch.id)
        anthropic = batch.format == MESSAGE_BATCH
        errors = None if anthropic else folder / "errors.jsonl"  # Anthropic's: one results file
        # A Message Batch's requests file is the server's own: its errors cite the requests sent.
        return export_batch(self.job(batch.id), folder / "output.jsonl", errors, self.resource,
                            cite_requests=anthropic)

    def _loop(self) -> None:
        while True:
            bid = self.queue.get()
            batch = self.store.batch(bid)
            if batch is None or not batch.is_open:
                continue
            if bid in self.stopping or batch.status == "cancelling":
                self._finish(bid, self.stopping.get(bid, "cancelled"))
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
        errors = [] if batch.format == MESSAGE_BATCH else ["--errors", str(folder / "errors.jsonl")]
        cmd = [sys.executable, "-m", "sparkbatch_dagster.cli", "run-batch", "--format", batch.format,
               "-i", str(self.store.file_path(batch.input_file_id)), "--home", str(folder / "home"),
               "-o", str(folder / "output.jsonl"), *errors, "--job-name", _job_name(bid), *self.engine, *self.options]
        with self.store.lock:
            if bid in self.stopping:
                self._finish(bid, self.stopping[bid])
                return
            self.store.update(bid, status="in_progress", in_progress_at=batch.in_progress_at or now())
            # The child is killed when this server dies (a kill -9 too), not stopped as on Ctrl-C: a
            # partial export then would outlive the server, its engine with it. Its engine's
            # watchdog ends the engine; the next start resumes the batch from its checkpoints.
            with (folder / "run.log").open("ab") as log:
                self.child, self.running = spawn_owned(cmd, signal.SIGKILL, stdout=subprocess.DEVNULL, stderr=log,
                                                       cwd=str(self.store.root)), bid
        code = self.child.wait()
        with self.store.lock:
            self.child, self.running = None, None
        if bid in self.stopping:
            self._finish(bid, self.stopping[bid])
        elif code == 0:
            # The run is over, so its counts are final: a client polling ``finalizing`` sees them.
            final: Changes = {"status": "finalizing", "finalizing_at": now(),
                              **self._final_counts(self.store.batch(bid) or batch)}
            self.store.update(bid, **final)
            self._finish(bid, "completed")
        else:
            self._finish(bid, "failed", _last_line(folder / "run.log") or f"run-batch exited with code {code}")

    def _finish(self, bid: str, status: Ending, error: str | None = None) -> None:
        """End a batch: its finished rows become result files (all of them when completed, those
        done so far when cancelled, expired or failed; for the first two, each request not run is
        an error line too), registered as files the client can download."""
        with self._finishing:  # once: a cancel and the worker may both end a queued batch
            batch = self.store.batch(bid)
            if batch is not None and batch.is_open:
                self._end(batch, status, error)

    def _end(self, batch: BatchRecord, status: Ending, error: str | None) -> None:
        try:
            counts: ExportSummary | None = self._export(batch)
        except Exception as exc:  # noqa: BLE001 - nothing was sharded: no result files
            counts = None
            if status == "failed":
                error = error or f"{type(exc).__name__}: {exc}"
        self.store.update(batch.id, **ended(self.store, batch, status, counts, error))


def _job_name(bid: str) -> str:
    return "batch_" + bid.removeprefix("batch_")[:40]


def _last_line(path: Path) -> str | None:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return None
    return lines[-1][-2000:] if lines else None
