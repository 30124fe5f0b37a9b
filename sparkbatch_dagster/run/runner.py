"""Label shards: check rows, render prompts, dedupe them, answer what the result store already
holds, order the rest and stream them through one engine, checkpoint finished rows, store the
new answers, finalize each shard. Knows nothing of Dagster.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterator
from typing import Any

import msgspec
import pyarrow.parquet as pq

from ..engines.base import Engine
from ..engines.platform.heap import frozen_heap
from ..engines.platform.spans import Spans
from ..errors import PendingRowsError
from ..home import JobHome
from ..home.lease import LeaseLost
from ..spec import JobSpec
from . import review_marks
from .attempts import Attempt, AttemptProgress
from .brake import Brake, Position
from .checkpoint import FlushTimer
from .claims import Claims
from .feed import Feed
from .finish import ShardClock, write_shard
from .open_shard import OpenShard
from .pace import Pace
from .records import ProgressReport, ShardStats
from .result_store import open_store

ProgressFn = Callable[[ProgressReport], None]
log = logging.getLogger("sparkbatch")


class ShardRun:
    """Label several shards through one engine without draining it between shards.

    Requests of shard k+1 are queued behind those of shard k, so the engine keeps a full
    batch while shard k's last rows finish; each shard is finalized as soon as its own last
    row is in. ``on_done`` receives each shard's statistics as it finalizes. While the engine
    starts, the next shards are opened ahead, up to ``ahead_rows`` rows (:mod:`.feed`).
    ``spans``: the step's parts (default: the engine's, a LazyEngine's), where the run's own
    work is named (reading, rendering, store lookups, answers, commits, events).
    """

    #: Rows opened ahead while the engine starts: the offline engine's window at vLLM's default
    #: ``max_num_seqs`` on a GPU (1024 x 16), so memory stays within what the run holds anyway.
    ahead_rows = 16_384

    def __init__(self, spec: JobSpec, home: JobHome, version: str, engine: Engine,
                 progress: ProgressFn | None = None, progress_every_s: float = 1.0, run_id: str | None = None,
                 brake: Brake | None = None, engine_starts: Callable[[], int] = lambda: 0,
                 spans: Spans | None = None) -> None:
        self.spec, self.home, self.version, self.engine = spec, home, version, engine
        self.spans = spans or engine.spans or Spans(base="bookkeeping")
        self.progress, self.progress_every_s = progress, progress_every_s
        self.signature = (home.read_manifest() or {}).get("signature")
        self.store = open_store(spec, home, engine.model_id)
        self._pending_reason = ""
        self.shards: list[OpenShard] = []
        self.marks = review_marks.Marks()  # what rows are written with: read when the run starts (stream)
        self.stats: list[ShardStats] = []
        self.clock = ShardClock(lambda: engine.start_seconds)  # each shard's share of the run's time
        self._start_at_attempt = engine.start_seconds
        self._answered = 0  # prompts the engine answered in this attempt
        self._ready: list[ShardStats] = []  # shards finalized since the caller last heard
        self.pace = Pace()  # rows done and the rate: the progress line's ETA, the brake's forecast
        self._sizes: dict[str, int] = {}
        self._claims: Claims | None = None
        self._timer: FlushTimer  # made by stream(), with this attempt's heartbeat
        self.run_id = run_id
        self.attempt: Attempt | None = None
        #: Consulted before the first prompt and after every answer; it raises BudgetStop to stop.
        self.brake = brake
        self._engine_starts = engine_starts  # cold engine starts this attempt paid (a warm engine: 0)
        self._lost: list[str] = []  # shards another box took over (appended from the upload thread too)
        self.rechecked = False  # the store looked up again after a wait for the GPU (once)

    @property
    def committed_elsewhere(self) -> list[str]:
        """Keys of this run that another run (another box, with a bucket home) committed while this
        one waited for their lease: done, and not by this run."""
        return self._claims.committed_elsewhere if self._claims is not None else []

    def run(self, keys: list[str], on_done: Callable[[ShardStats], None] | None = None) -> list[ShardStats]:
        """Label ``keys``; raise :class:`SparkbatchError` at once if another process holds one."""
        for stats in self.stream(keys):
            if on_done:
                on_done(stats)
        return self.stats

    def stream(self, keys: list[str], optional: Collection[str] = (),
               before: Callable[[], None] | None = None) -> Iterator[ShardStats]:
        """Label ``keys``, yielding each shard's statistics as soon as it is committed (the engine
        keeps generating the next shards' rows meanwhile). A key of ``optional`` that another
        run is writing is left to it; any other such key stops the run before anything starts.
        ``before`` runs once the partitions are locked, inside this attempt (billed with it), before
        the first prompt: the timed sample of ``sparkbatch run --estimate``, on this run's engine."""
        # A bucket home's cache: a refresh by another command on this box must not swap the
        # shard files under this run (it skips them while this shared lock is held).
        # Time outside any named part of the run (claims, the attempt's record) is its bookkeeping.
        base, self.spans.base = self.spans.base, "bookkeeping"
        shards_lock = self.home.shards_lock() if self.home.remote is not None else None
        if shards_lock is not None:
            shards_lock.acquire(wait=True, shared=True)
        try:
            review_marks.pull(self.home)  # another box's calibrations and reviewers' labels, for the rows
            self.marks = review_marks.Marks.of(self.spec, self.home)  # read once: every shard writes with them
            yield from self._stream(keys, optional, before)
        finally:
            if shards_lock is not None:
                shards_lock.release()
            self.spans.base = "finish" if base == "prepare" else base

    def _stream(self, keys: list[str], optional: Collection[str], before: Callable[[], None] | None
                ) -> Iterator[ShardStats]:
        claims = self._claims = Claims(self.home, self.version, keys, optional)
        # The attempt is billed from here, whatever its end; its heartbeat rides the flush timer.
        attempt = self.attempt = Attempt(self.home, self.version, self.spec.hourly_rate_usd, self.run_id,
                                         beat_every_s=1.0)
        self._timer = FlushTimer(self.spec.checkpoint_seconds, on_tick=attempt.beat)
        try:
            mine, leased = claims.take()
            with attempt, self._timer:
                try:
                    self._sizes = {k: pq.read_metadata(self.home.shard_path(k)).num_rows for k in mine}
                    self.pace.rows_total = sum(self._sizes.values())
                    attempt.progress = self._attempt_progress
                    if before is not None:
                        self._before(before)
                    self._consult()  # before the first prompt: a refusal generates nothing
                    yield from self._generate(mine)
                    # Shards another box holds, after ours (each lock is released as its shard commits),
                    # and ours another box took over meanwhile: waited for one at a time, holding no
                    # lease, so two boxes can never wait on each other.
                    queue = leased + self._take_back()
                    while queue:
                        key = queue.pop(0)
                        if claims.wait_for(key):
                            self._sizes[key] = pq.read_metadata(self.home.shard_path(key)).num_rows
                            self.pace.rows_total += self._sizes[key]
                            yield from self._generate([key])
                        queue += self._take_back()
                except GeneratorExit:
                    raise
                except BaseException:
                    # A shard committed in the bucket as the run failed (from the upload thread) is
                    # still materialized: settle what is queued, yield what committed, then fail.
                    self._settle(quiet=True)
                    yield from self._drain()
                    raise
        finally:
            self._settle(quiet=True)
            claims.release_all()

    def _settle(self, quiet: bool) -> None:
        """Whatever stopped us, finished rows still in memory go to disk first (and to the
        bucket, with the commits queued behind them). ``quiet``: a failure here is logged, not
        raised (the run is already failing, or ending)."""
        try:
            for shard in self.shards:
                if not shard.abandoned:
                    shard.writer.flush()
            if self.home.remote is not None:
                self.home.remote.uploader.flush()
        except Exception as exc:
            if not quiet:
                raise
            log.warning("while stopping: %s: %s", type(exc).__name__, exc)

    def _take_back(self) -> list[str]:
        """The shards of this run another box took over (this box's lease lapsed: paused, or cut
        off from the store): their work so far is dropped and billed as waste; each is waited for
        like a shard another box holds, so it ends committed by that box (recorded here as
        reused) or, if that box died too, labeled here."""
        keys = list(dict.fromkeys(self._lost))
        self._lost.clear()
        for key in keys:
            for shard in self.shards:
                if shard.key == key and not shard.abandoned:
                    if shard.writer in self._timer.writers:
                        self._timer.writers.remove(shard.writer)
                    shard.abandon(self.home)
            if self._claims is not None:
                self._claims.release(key)
        return keys

    def _attempt_progress(self) -> AttemptProgress:
        return AttemptProgress(
            prompts_generated=self._answered, engine_starts=self._engine_starts(),
            engine_start_s=round(max(self.engine.start_seconds - self._start_at_attempt, 0.0), 3),
            timings_s=self.spans.rounded())

    def _before(self, before: Callable[[], None]) -> None:
        began, start_s = time.perf_counter(), self.engine.start_seconds
        before()
        # The sample's own generation is not the job's: the first shard's window keeps the engine
        # start it paid for (charged to that shard) but not the sample's seconds (the attempt's bill).
        self.clock.leave_out(time.perf_counter() - began - (self.engine.start_seconds - start_s))

    def _consult(self) -> None:
        """Let the brake look at where the run stands; it raises BudgetStop to stop here."""
        if self.brake is None or not self.brake.active or self.attempt is None:
            return
        pace = self.pace
        pos = Position(pace.rows_done, pace.rows_total, len(self.stats), len(self._sizes),
                       pace.brake_rate(self.spec.checkpoint_seconds), pace.longest_commit)
        if self._answered and pos.rows_done >= pos.rows_total:  # all in: stopping now would only lose the commit
            return
        self.brake.check(pos, self.attempt.cost_usd())

    def _drain(self) -> Iterator[ShardStats]:
        while self._ready:
            with self.spans.span("events"):  # the caller's turn: its Dagster events and log line
                yield self._ready.pop(0)

    def _generate(self, keys: list[str]) -> Iterator[ShardStats]:
        last_report = time.perf_counter()
        results = self.engine.generate(Feed(self, keys, self.ahead_rows), self.spec.sampling, self.spec.output)
        try:
            with frozen_heap():  # no full collection walks the process's heap while the engine works
                yield from self._consume(results, last_report)
        except LeaseLost:  # another box owns our shards now: stop generating them (taken back after)
            finished = {s.key for s in self.shards if s.finished and not s.abandoned}
            self._lost.extend(k for k in keys if k not in finished)  # started or not
        finally:  # a stop (the brake, an error) aborts what is still in flight, now, not when collected
            close = getattr(results, "close", None)
            if close is not None:
                close()
        if self.home.remote is not None:
            self.home.remote.uploader.flush()  # the last shards' commits in the bucket, then theirs events
        yield from self._drain()
        if self._lost:
            return  # the shards taken over are waited for by stream(); nothing is pending of them
        if self.progress and self.shards:
            with self.spans.span("progress"):
                self._report(self.shards[-1])
        pending = {s.key: s.pending for s in self.shards if s.pending}
        if pending:
            raise PendingRowsError(
                f"{sum(pending.values())} rows in {sorted(pending)} got only transient failures "
                f"({self._pending_reason[:200]}); nothing was committed for them: run again to retry exactly those rows"
            )

    def _consume(self, results: Iterator[Any], last_report: float) -> Iterator[ShardStats]:
        # Time waiting on the engine's next answer is generation; handling it, the run's own work.
        spans = self.spans
        spans.push("generation")
        try:
            for res in results:
                spans.switch("answers")
                shard = self._answer(res)
                if shard is not None:
                    now = time.perf_counter()
                    if self.progress and now - last_report >= self.progress_every_s:
                        last_report = now
                        with spans.span("progress"):
                            self._report(shard)
                    yield from self._drain()
                    self._check_leases()
                    self._consult()
                spans.switch("generation")
        finally:
            spans.pop()

    def _answer(self, res: Any) -> OpenShard | None:
        """Write one answer's rows, and commit its shard when it was the last; return the shard
        (None: another box took it over, and the answer is dropped)."""
        self.pace.answered()
        shard = self.shards[int(res.id.partition(":")[0])]
        if shard.abandoned:
            return None
        self._answered += 1
        self.pace.rows_done += shard.record(res, self.spec)
        if res.retryable:  # not the row's fault: nothing written, so the next run retries it
            self._pending_reason = res.error or "transient failure"
        self._timer.check()  # the other shards' rows are flushed on time by the timer
        if self.home.remote is not None:
            self.home.remote.uploader.check()  # a commit or upload that failed in its thread
        if shard.outstanding == 0 and shard.pending == 0:
            self.finish(shard)
        return shard

    def _check_leases(self) -> None:
        """After every answer, with a bucket home: raise LeaseLost when another box may have
        taken this run's shards over (its lease was fenced), or a commit found one taken."""
        if self._claims is not None and self.home.remote is not None and (self._lost or not self._claims.intact()):
            raise LeaseLost("this box's lease was fenced: its unfinished shards are another box's")

    def _report(self, shard: OpenShard) -> None:
        assert self.progress is not None
        report = self.pace.report(shard.key, sum(s.fresh_tokens for s in self.shards))
        self.progress(msgspec.structs.replace(report, partition_rows_done=shard.done,
                                              partition_rows_total=self._sizes.get(shard.key, 0)))

    def open(self, key: str) -> int:
        """Open shard ``key`` (read, rendered, looked up in the store); return its index."""
        shard = OpenShard(self.spec, self.home, self.version, self.engine.model_id, key, self.signature,
                          self.attempt, self.store, self.marks, self.spans)
        self.shards.append(shard)
        self._timer.writers.append(shard.writer)
        if self.attempt is not None:
            shard.writer.on_flush = self.attempt.beat
        self.count_free(len(shard.rows) - sum(len(ids) for _, ids in shard.groups.values()))
        return len(self.shards) - 1

    def count_free(self, rows: int) -> None:
        """Rows done without the engine (resumed, reused, error rows): not in the ETA's rate."""
        self.pace.count_free(rows)

    def finish(self, shard: OpenShard) -> None:
        """Assemble a shard whose every row is in, store its new answers, commit it."""
        with self.spans.span("commit"):
            self._finish(shard)

    def _finish(self, shard: OpenShard) -> None:
        began = time.perf_counter()
        stats = write_shard(self, shard, self._timer)
        key = shard.key

        def committed() -> None:  # where it counts: here, or (a bucket home) from the upload thread, later
            if self._claims is not None:
                self._claims.release(key)  # another run (or box) waiting for it may go on
            self.pace.longest_commit = max(self.pace.longest_commit, time.perf_counter() - began)
            if self.attempt is not None:
                self.attempt.committed(stats)
            self.stats.append(stats)
            self._ready.append(stats)  # yielded by the run's thread, at its next answer

        def not_committed(why: str) -> None:  # from the upload thread, with a bucket home
            if why == "lost":  # another box took the shard over first: stop, and never count it
                self._lost.append(key)
            elif self._claims is not None:  # another box's commit won: its output stands, recorded as reused
                self._claims.release(key)
                self._claims.committed_elsewhere.append(key)

        claims = self._claims
        self.home.publish_commit(self.version, key, self.attempt.id if self.attempt else "none", committed,
                                 still_mine=(lambda: claims.still_mine(key)) if claims is not None else None,
                                 not_committed=not_committed)
