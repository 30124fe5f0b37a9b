"""A shard's end in a labeling run, up to its commit on this box: its rows assembled in input
order, its statistics, its new answers in the result store, then its labeled file. With a bucket
home the commit that counts is published after (:meth:`~.runner.ShardRun.finish`, ``docs/protocol.md``).

Shards overlap in the engine, so a shard's time is not its own: :class:`ShardClock` charges each
shard the time since the previous one finished (the first: since the run began), so per-shard wall
times add up to the run's, and an engine start during the run once, to the first shard finished
after it, whose window holds it (its statistics keep the start apart from generation)::

    clock = ShardClock(lambda: engine.start_seconds)
    wall_s, engine_start_s = clock.charge()   # as each shard finishes
"""

from __future__ import annotations

import functools
import json
import shutil
import time
from collections.abc import Callable
from typing import Protocol

import msgspec

from ..engines.base import Engine
from ..engines.platform.spans import Spans
from ..home import JobHome, atomic_write_text, failpoint
from ..home.atomic import atomic_write_bytes
from ..home.commit_record import parquet_bytes, record_of
from ..spec import JobSpec
from .attempts import Attempt
from .checkpoint import FlushTimer, assemble
from .open_shard import OpenShard, new_answers
from .records import ShardStats
from .result_store import ResultStore
from .shard_stats import ShardTime, ShardWork, shard_stats


class ShardClock:
    """Each finished shard's share of the run's wall time and of its engine start."""

    def __init__(self, start_seconds: Callable[[], float]) -> None:
        self._start_seconds = start_seconds
        self._last_end = time.perf_counter()
        self._start_paid = start_seconds()  # an engine started before this run is not this run's bill

    def charge(self) -> tuple[float, float]:
        """The finishing shard's wall seconds and engine-start seconds."""
        now, start = time.perf_counter(), self._start_seconds()
        wall, start_s = now - self._last_end, start - self._start_paid
        self._last_end, self._start_paid = now, start
        return wall, start_s

    def leave_out(self, seconds: float) -> None:
        """Seconds spent on something not the shards' (the timed sample of ``run --estimate``)."""
        self._last_end += seconds


class Run(Protocol):
    """What finishing a shard uses of its :class:`~.runner.ShardRun`."""

    spec: JobSpec
    home: JobHome
    version: str
    engine: Engine
    signature: str | None
    attempt: Attempt | None
    store: ResultStore
    spans: Spans
    clock: ShardClock


def write_shard(run: Run, shard: OpenShard, timer: FlushTimer) -> ShardStats:
    """Assemble ``shard``, whose every row is in, write its statistics, store its new answers and
    write its labeled file; return the statistics. A folder home's shard is committed then; a
    bucket home's parts stay until the bucket's commit (its mirror drops them)."""
    shard.writer.flush()
    timer.writers.remove(shard.writer)
    table = assemble(shard.writer.parts_dir, [r["row_id"] for r in shard.rows], shard.key, shard.writer)
    wall, start_s = run.clock.charge()
    engine_s = time.perf_counter() - shard.first_sent if shard.first_sent else 0.0
    work = ShardWork(shard.key, run.version, run.engine.model_id, resumed=shard.resumed, generated=len(shard.order),
                     fresh_tokens=shard.fresh_tokens)
    # The commit record holds what the labeled file must be (its rows are the stats' ``rows``): a
    # file replaced after its commit is found by every reader, not counted done.
    data = parquet_bytes(table)
    record = record_of(data)
    stats = msgspec.structs.replace(
        shard_stats(run.spec, work, ShardTime(wall, engine_s, start_s), table),
        # Which input it was read from: checks made after a re-shard compare with it.
        input_signature=run.signature or None,
        # Which attempt committed it (the bucket's commit names it too).
        attempt=run.attempt.id if run.attempt is not None else None,
        labeled_sha256=record["labeled_sha256"], labeled_bytes=record["labeled_bytes"])
    # Stats and new answers first, then the labeled file (the commit point): a done shard
    # always has stats, and its answers are in the store for any later layout or version.
    home = run.home
    atomic_write_text(home.stats_path(run.version, shard.key), json.dumps(stats.to_json(), indent=2),
                      point="write:stats")
    failpoint("finalize:stats")
    with run.spans.span("store_add"):
        run.store.add(new_answers(table))
    # The commit point (checkpoint.commit's, with the bytes hashed above): the parts stay until
    # the bucket's commit with a bucket home, else they go from the timer's thread below.
    atomic_write_bytes(home.labeled_path(run.version, shard.key), data, point="write:labeled")
    failpoint("finalize:committed")
    if home.remote is None:  # the parts go from the timer's thread
        timer.later(functools.partial(shutil.rmtree, shard.writer.parts_dir, ignore_errors=True))
    shard.release()
    shard.finished = True
    return stats
