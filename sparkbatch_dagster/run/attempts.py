"""Every attempt billed: one record per run attempt of a version, whatever its end.

    <home>/out/<version>/attempts/<id>.json    started, ended, outcome, seconds, rows, cost

The box is rented for the whole attempt, so an attempt's ``cost_usd`` is its wall time (engine
start, generation, its end) at the hourly rate, whether it committed anything or not. Its
``committed_cost_usd`` is the part its committed shards carry in their stats; the difference is
``wasted_usd``: what a crash, a kill or a failure cost the user.

The file is written when the attempt starts, again at every heartbeat (``beat``: each checkpoint
interval and each commit) and when it ends (``succeeded`` / ``failed``). An attempt killed with
SIGKILL cannot write its end: it holds a lock while it runs, so a later reader finds the lock
free and the outcome still ``running``, and counts it ``killed``, ended at its last heartbeat;
the next run records that in its file. The files are the truth; ``metrics.sync`` mirrors them
into the ``attempts`` table of ``metrics.duckdb``.

With a bucket home the record is uploaded at its start, each commit, its end, and between them
every third of a lease (each upload is a billed request; the local file keeps its 1 s beat). A
record another box wrote has no lock here: it counts as killed once its last heartbeat is two
lease lengths old, which its box, had it lived, would have renewed several times.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import msgspec

from ..home import FileLock, JobHome, atomic_write_text
from .records import AttemptRecord, Bill, ShardStats

log = logging.getLogger("sparkbatch")

COLUMNS = [
    ("attempt", "VARCHAR"), ("version", "VARCHAR"), ("run_id", "VARCHAR"), ("started", "VARCHAR"),
    ("ended", "VARCHAR"), ("outcome", "VARCHAR"), ("error", "VARCHAR"), ("wall_s", "DOUBLE"),
    ("engine_start_s", "DOUBLE"), ("generation_s", "DOUBLE"), ("prompts_generated", "BIGINT"),
    ("rows_committed", "BIGINT"), ("partitions_committed", "BIGINT"), ("cost_usd", "DOUBLE"),
    ("committed_cost_usd", "DOUBLE"), ("wasted_usd", "DOUBLE"), ("engine_starts", "BIGINT"),
]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def folder(home: JobHome, version: str) -> Path:
    return home.version_dir(version) / "attempts"


@dataclass(frozen=True)
class AttemptProgress:
    """The run's own counters, read at each write of its attempt's record: prompts the engine
    answered, cold engine starts it paid (a warm engine reused is 0), their seconds, and where
    the step's time went (None: not named)."""

    prompts_generated: int = 0
    engine_starts: int = 0
    engine_start_s: float = 0.0
    timings_s: dict[str, float] | None = None


class Attempt:
    """One run attempt's record, kept current while it runs (``with Attempt(...) as a:``)."""

    def __init__(self, home: JobHome, version: str, hourly_rate_usd: float, run_id: str | None = None,
                 beat_every_s: float = 5.0) -> None:
        self.id = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
        self.path = folder(home, version) / f"{self.id}.json"
        self._lock = FileLock(folder(home, version) / f".{self.id}.lock")
        self.rate, self.beat_every_s = hourly_rate_usd, beat_every_s
        self._clock = time.monotonic()
        self._last_beat = 0.0
        self._mutex = threading.Lock()
        self.record = AttemptRecord(attempt=self.id, version=version, run_id=run_id, pid=os.getpid(), started=_now(),
                                    box=box(home))
        self._home, self._version = home, version
        remote = home.remote
        self._push_every_s = min(20.0, remote.lease_seconds / 3) if remote is not None else 0.0
        self._last_push = -1e9
        #: The run's own counters, read at each write (not pushed per row: the run's hot loop
        #: stays free of locks); None: the attempt has none (a test's, or before the run set it).
        self.progress: Callable[[], AttemptProgress] | None = None

    def __enter__(self) -> Attempt:
        record_killed(self._home, self._version)  # what an earlier attempt could not write itself
        self._lock.acquire(wait=True)
        self._write(push=True)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        error = self.record.error
        if kind is GeneratorExit:
            error = "stopped before its end by its caller"
        elif exc is not None:
            error = f"{type(exc).__name__}: {exc}"[:500]
        self._change(outcome="succeeded" if kind is None else "failed", error=error, ended=_now())
        try:
            self._write(push=True)
        except OSError as failed:
            if exc is None:
                raise
            # A full or read-only disk that failed the run fails this last write too: the run's
            # own error is the one to tell; the record stays "running", read later as killed,
            # billed to its last heartbeat.
            log.warning("cannot write the end of attempt %s (%s): %s", self.id, failed, self.path)
        finally:
            self._lock.release()

    def committed(self, stats: ShardStats) -> None:
        """A shard of this attempt committed (its stats): counted, and written at once."""
        with self._mutex:
            r = self.record
            self.record = msgspec.structs.replace(
                r, rows_committed=r.rows_committed + stats.rows, partitions_committed=r.partitions_committed + 1,
                committed_cost_usd=round(r.committed_cost_usd + stats.cost_usd, 6))
        self._write()  # in the bucket at the next push (a third of a lease at most), not a request a shard

    def cost_usd(self) -> float:
        """What this attempt has cost so far: its wall time at the hourly rate (the brake reads it)."""
        return (time.monotonic() - self._clock) / 3600 * self.rate

    def beat(self, force: bool = False) -> None:
        """Write the record now if a heartbeat is due (or ``force``): a kill loses at most one interval."""
        if force or time.monotonic() - self._last_beat >= self.beat_every_s:
            self._write()

    def _change(self, **fields: Any) -> None:
        with self._mutex:
            self.record = msgspec.structs.replace(self.record, **fields)

    def _write(self, push: bool = False) -> None:
        with self._mutex:
            r = self.record
            if self.progress is not None:
                p = self.progress()
                r = msgspec.structs.replace(r, prompts_generated=p.prompts_generated, engine_starts=p.engine_starts,
                                            engine_start_s=p.engine_start_s,
                                            timings_s=p.timings_s if p.timings_s is not None else r.timings_s)
            wall = time.monotonic() - self._clock
            cost = round(wall / 3600 * self.rate, 6)
            r = self.record = msgspec.structs.replace(
                r, wall_s=round(wall, 3), generation_s=round(max(wall - r.engine_start_s, 0.0), 3),
                last_beat=_now(), cost_usd=cost, wasted_usd=round(max(cost - r.committed_cost_usd, 0.0), 6))
            self._last_beat = time.monotonic()
            # Under the lock: the timer's heartbeat and a commit share one temporary file name.
            atomic_write_text(self.path, json.dumps(r.to_json(), indent=2), point="write:attempt")
            remote = self._home.remote
            if remote is not None and (push or self._last_push + self._push_every_s <= self._last_beat):
                self._last_push = self._last_beat
                remote.push_attempt(self.path)


def load(home: JobHome, version: str) -> list[AttemptRecord]:
    """Every attempt of ``version``, oldest first; one whose process died mid-run (its lock
    free, its outcome still ``running``) as ``killed``, ended at its last heartbeat."""
    out = []
    for path in sorted(folder(home, version).glob("*.json")) if folder(home, version).exists() else []:
        try:
            record = AttemptRecord.from_json(json.loads(path.read_text()))
        except ValueError:  # half a file cannot happen (atomic writes); a foreign one is not ours
            continue
        if record.outcome == "running" and _dead(path, record, home):
            record = msgspec.structs.replace(
                record, outcome="killed", ended=record.last_beat,
                error="the process was killed (no end was written): billed up to its last heartbeat")
        out.append(record)
    return sorted(out, key=lambda r: r.started)


def record_killed(home: JobHome, version: str) -> list[AttemptRecord]:
    """Write ``killed`` into the files of attempts that died without writing their end."""
    killed = [r for r in load(home, version) if r.outcome == "killed"]
    for r in killed:
        path = folder(home, version) / f"{r.attempt}.json"
        if json.loads(path.read_text()).get("outcome") == "running":
            atomic_write_text(path, json.dumps(r.to_json(), indent=2))
            home.publish(path)
    return killed


def box(home: JobHome) -> str:
    """This machine and cache, as an attempt record names where it ran."""
    return f"{socket.gethostname()}:{home.root}"


def _dead(path: Path, record: AttemptRecord, home: JobHome) -> bool:
    if home.remote is not None and (record.box or box(home)) != box(home):
        try:
            beat = datetime.fromisoformat(record.last_beat or record.started)
        except ValueError:
            return True
        age = (datetime.now(timezone.utc) - beat).total_seconds()
        return age > 2 * home.remote.lease_seconds
    lock = FileLock(path.with_name(f".{path.stem}.lock"))
    if not lock.acquire(wait=False):
        return False  # its process still holds it: running
    lock.release()
    return True


def bill(records: list[AttemptRecord]) -> Bill:
    """The totals a summary shows: attempts, what they cost, and what was paid for nothing."""
    return Bill.of(records)
