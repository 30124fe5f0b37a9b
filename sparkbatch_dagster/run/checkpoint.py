"""Row-level checkpoints: finished rows leave memory in small Parquet part files, and a shard
is finalized only when every input row is present exactly once.
"""

from __future__ import annotations

import logging
import queue
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq

from ..engines.platform.spans import Spans
from ..errors import IncompleteShardError
from ..home import atomic_write_parquet, failpoint
from .records import OutputRow

log = logging.getLogger("sparkbatch")

#: The columns of every output row. ``prompt_key`` names the rendered prompt in the result
#: store (null for rows that never had one: input errors); ``reused`` marks answers taken from
#: the store instead of the engine; ``fingerprint`` is the output version; ``finish_reason`` is
#: the engine's (null for rows it did not answer), ``truncated`` marks an answer cut at
#: ``max_tokens``; ``confidence`` is how sure the model was of the answer (``engines/answers/confidence.py``);
#: ``reasoning`` is a reasoning model's thinking (only when ``output.keep_reasoning``) and
#: ``reasoning_tokens`` its tokens, which ``output_tokens`` counts too (``engines/answers/reasoning.py``);
#: ``extra`` is what a batch file's line asked beyond the text (``engines/answers/extras.py``' JSON).
#: ``confidence`` is calibrated on gold rows where a calibration of the model exists, and
#: ``raw_confidence`` is the model's own; where a reviewer's label replaced the model's answer,
#: ``output`` is the reviewer's and ``model_output``, ``reviewed_by``, ``reviewed_at`` say what and who.
#: Files written before the last ten existed read with them null.
OUTPUT_SCHEMA = pa.schema(
    [
        ("row_id", pa.string()),
        ("output", pa.string()),
        ("error", pa.string()),
        ("prompt_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("cached_tokens", pa.int64()),
        ("deduplicated", pa.bool_()),
        ("reused", pa.bool_()),
        ("prompt_key", pa.string()),
        ("fingerprint", pa.string()),
        ("model", pa.string()),
        ("finish_reason", pa.string()),
        ("truncated", pa.bool_()),
        ("confidence", pa.float64()),
        ("reasoning", pa.string()),
        ("reasoning_tokens", pa.int64()),
        ("extra", pa.string()),
        ("raw_confidence", pa.float64()),
        ("model_output", pa.string()),
        ("reviewed_by", pa.string()),
        ("reviewed_at", pa.string()),
    ]
)


#: Appended to a DuckDB ``FROM read_parquet(..., union_by_name = true)``: a ``confidence``
#: column even when no file read has one (all written before it existed); null there.
WITH_CONFIDENCE = "UNION ALL BY NAME SELECT NULL::DOUBLE AS confidence WHERE false"
#: The same for ``reasoning`` (the result store's, and the output rows'): null in older files.
WITH_REASONING = "UNION ALL BY NAME SELECT NULL::VARCHAR AS reasoning WHERE false"
#: The same for the result store's ``extra`` (what a batch line asked beyond the text).
WITH_EXTRA = "UNION ALL BY NAME SELECT NULL::VARCHAR AS extra WHERE false"
#: The same for the result store's ``truncated`` (an answer cut at max_tokens) and ``finish_reason``.
WITH_TRUNCATED = "UNION ALL BY NAME SELECT NULL::BOOLEAN AS truncated, NULL::VARCHAR AS finish_reason WHERE false"
#: The same for the calibration's and the review's columns of output rows.
WITH_REVIEW = ("UNION ALL BY NAME SELECT NULL::DOUBLE AS raw_confidence, NULL::VARCHAR AS model_output, "
               "NULL::VARCHAR AS reviewed_by, NULL::VARCHAR AS reviewed_at WHERE false")


def rows_table(rows: list[OutputRow]) -> pa.Table:
    """Output rows as a table of ``OUTPUT_SCHEMA``, built column by column: the run's hot loop pays
    less than for a dict a row (``OutputRow``'s fields are the schema's, in its order)."""
    columns = list(zip(*map(msgspec.structs.astuple, rows), strict=True)) or [()] * len(OUTPUT_SCHEMA)
    return pa.Table.from_arrays([pa.array(c, f.type) for c, f in zip(columns, OUTPUT_SCHEMA, strict=True)],
                                schema=OUTPUT_SCHEMA)


class CheckpointWriter:
    """Buffers finished rows and appends them to part files every ``every_rows`` rows or
    ``every_seconds`` seconds, whichever comes first. A crash loses at most that much.

    Thread-safe: the run adds rows while its flush timer (:class:`FlushTimer`) writes out any
    shard whose rows have waited ``every_seconds``, whether or not more rows come for it.
    """

    def __init__(self, parts_dir: Path, every_rows: int, every_seconds: float, tag: str | None = None) -> None:
        self.parts_dir = parts_dir
        #: Appended to part names (the attempt's id), so parts of attempts on two boxes never collide.
        self.tag = tag
        #: Hears each part file as it lands: with a bucket home, its upload.
        self.on_part: Callable[[Path], None] = lambda _: None
        self.every_rows = every_rows
        self.every_seconds = every_seconds
        self._lock = threading.Lock()
        self._buffer: list[OutputRow] = []
        self.on_flush: Callable[[], None] = lambda: None  # the attempt's heartbeat: "alive at this checkpoint"
        self._last_flush = time.monotonic()
        self._seq = 0
        self.rows_written = 0
        self.flushes = 0
        #: The step's parts: a part file written on the run's thread is named there (``parts``).
        self.spans: Spans | None = None
        #: The part files this writer wrote or read, by name: what :meth:`existing` does not read again.
        self.tables: dict[str, pa.Table] = {}

    def existing(self) -> pa.Table:
        """Rows already checkpointed by earlier attempts (temporary files of a crash ignored)."""
        if not self.parts_dir.exists():
            return OUTPUT_SCHEMA.empty_table()
        for stale in self.parts_dir.glob(".part-*"):
            stale.unlink(missing_ok=True)
        files = sorted(self.parts_dir.glob("part-*.parquet"))
        if not files:
            return OUTPUT_SCHEMA.empty_table()
        self._seq = max(int(f.stem.split("-")[1]) for f in files)
        tables = []
        for f in files:
            known = self.tables.get(f.name)
            if known is not None:  # written (or read) here: the same bytes, no second read
                tables.append(known)
                continue
            try:
                tables.append(table := pq.read_table(f, schema=OUTPUT_SCHEMA))
                self.tables[f.name] = table
            except Exception as exc:  # truncated by a disk crash: its rows are simply not done yet
                log.warning("checkpoint %s is unreadable (%s): its rows will be recomputed", f, exc)
                f.unlink(missing_ok=True)
        return pa.concat_tables(tables) if tables else OUTPUT_SCHEMA.empty_table()

    def add(self, row: OutputRow) -> None:
        with self._lock:
            self._buffer.append(row)
            if self._due():
                self._flush()

    def due(self) -> bool:
        with self._lock:
            return self._due()

    def flush(self) -> None:
        with self._lock:
            self._flush()

    def flush_if_due(self) -> bool:
        """Flush when rows have waited long enough (or are many enough); True if it wrote."""
        with self._lock:
            if not self._due():
                return False
            self._flush()
            return True

    def discard(self) -> None:
        """Drop the buffered rows and this writer's own part files (another box owns the shard
        now): parts of other attempts stay, they are that box's to use."""
        with self._lock:
            self._buffer.clear()
            self.tables.clear()
            if self.tag and self.parts_dir.exists():
                for part in self.parts_dir.glob(f"part-*-{self.tag}.parquet"):
                    part.unlink(missing_ok=True)

    def _due(self) -> bool:
        if not self._buffer:
            return False
        return (
            len(self._buffer) >= self.every_rows
            or time.monotonic() - self._last_flush >= self.every_seconds
        )

    def _flush(self) -> None:
        self._last_flush = time.monotonic()
        if not self._buffer:
            return
        if self.spans is None:
            self._write_part()
            return
        with self.spans.span("parts"):  # counted when on the run's thread (the timer's writes overlap it)
            self._write_part()

    def _write_part(self) -> None:
        self._seq += 1
        table = rows_table(self._buffer)
        name = f"part-{self._seq:06d}-{self.tag}" if self.tag else f"part-{self._seq:06d}"
        path = self.parts_dir / f"{name}.parquet"
        atomic_write_parquet(path, table, point="write:part")
        self.tables[path.name] = table
        self.on_part(path)
        self.rows_written += len(self._buffer)
        self.flushes += 1
        self._buffer.clear()
        self.on_flush()


class FlushTimer:
    """Checkpoints every open writer whose rows have waited ``every_seconds``, from a thread:
    with several shards in flight, a shard waiting on its slow tail (or an engine that goes
    quiet) would otherwise hold finished rows until its next result. ``check()`` re-raises, in
    the run's thread, a write that failed here."""

    def __init__(self, every_seconds: float, on_tick: Callable[[], None] = lambda: None) -> None:
        self.writers: list[CheckpointWriter] = []
        self._on_tick = on_tick  # the attempt's heartbeat
        self._interval = min(max(0.02, every_seconds / 4), 1.0)  # also the heartbeat's clock
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="sparkbatch-flush", daemon=True)

    def __enter__(self) -> FlushTimer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._jobs.put(None)  # after the jobs handed over so far: each is done before the run ends
        self._thread.join()

    def later(self, job: Callable[[], None]) -> None:
        """Run ``job`` in the timer's thread, in order, soon (before the timer stops); a failure
        is raised in the run's thread by :meth:`check`."""
        self._jobs.put(job)

    def _loop(self) -> None:
        tick = time.monotonic() + self._interval
        while True:
            try:
                job = self._jobs.get(timeout=max(tick - time.monotonic(), 0.0))
            except queue.Empty:
                job = lambda: None  # noqa: E731 - the interval passed: a tick
            if job is None:
                return
            try:
                job()
                if time.monotonic() >= tick:
                    for writer in list(self.writers):
                        writer.flush_if_due()
                    self._on_tick()
                    tick = time.monotonic() + self._interval
            except BaseException as exc:  # a full disk: the run's thread raises it
                self._error = exc
                return

    def check(self) -> None:
        if self._error is not None:
            raise self._error


def assemble(parts_dir: Path, expected_ids: Iterable[str], name: str, writer: CheckpointWriter | None = None
             ) -> pa.Table:
    """Join the part files into the shard's output, in input order, every input row once.
    ``writer``: the shard's own, whose parts are not read back (those on disk it did not write
    or read are).

    Raises :class:`IncompleteShardError` naming missing or unexpected ids; the parts stay on
    disk so a rerun can complete them.
    """
    table = (writer or CheckpointWriter(parts_dir, 1, 1.0)).existing()
    ids = table.column("row_id").to_pylist()
    expected = list(expected_ids)
    first: dict[str, int] = {}
    for n, row_id in enumerate(ids):
        first.setdefault(row_id, n)  # a row written twice keeps its first copy
    missing = [i for i in expected if i not in first]
    extra = sorted(set(first) - set(expected))
    if missing or extra:
        raise IncompleteShardError(
            f"{name}: {len(missing)} rows missing (e.g. {missing[:5]}), "
            f"{len(extra)} not in the shard (e.g. {extra[:5]}); rerun the partition to fill the gap"
        )
    # Typed indices: an empty list would be a null-typed array, which take() refuses (an empty shard).
    return table.take(pa.array([first[row_id] for row_id in expected], pa.int64()))


def commit(parts_dir: Path, table: pa.Table, final_path: Path, keep_parts: bool = False) -> None:
    """The shard's commit point: the final file appears atomically, then the parts go.
    ``keep_parts``: with a bucket home, whose commit is the one that counts, the parts stay
    until that is made (the mirror drops them then), so a crash before it loses nothing."""
    atomic_write_parquet(final_path, table, point="write:labeled")
    failpoint("finalize:committed")
    if not keep_parts:
        shutil.rmtree(parts_dir, ignore_errors=True)


def finalize(parts_dir: Path, expected_ids: Iterable[str], final_path: Path) -> pa.Table:
    """:func:`assemble` then :func:`commit`."""
    table = assemble(parts_dir, expected_ids, final_path.stem)
    commit(parts_dir, table, final_path)
    return table
