"""Run metrics and analytics in the job's DuckDB file, ``metrics.duckdb``: written here only, by
the ``run_metrics`` and ``analytics`` assets and ``sparkbatch run`` (``sparkbatch sql`` reads an
in-memory copy, :mod:`.query`).

DuckDB allows one writing process per file, and several GPUs mean several processes: every
connection here is short-lived and retried while another process holds the lock. The file is
derived from the stats and attempt files: one DuckDB finds damaged (truncated, a checksum that
does not match) is set aside as ``metrics.duckdb.broken-<time>`` and rebuilt from them, never a
crash (:func:`writing`).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from ..errors import SparkbatchError
from ..home import FileLock, JobHome
from ..spec import JobSpec
from .records import AttemptRecord, ShardStats
from .reliability import BUCKETS, bucket_row
from .review_queue import threshold_of
from .shard_stats import read_stats
from .totals import Confidence, CostCheck, Headline, Prediction
from .views import define_views, fill

log = logging.getLogger("sparkbatch")
T = TypeVar("T")
#: What DuckDB says of a database file whose bytes are wrong (not of a lock, a path or a query).
_DAMAGED = ("not a valid duckdb database", "could not read enough bytes", "corrupt database file",
            "checksum", "serializ")

METRIC_COLUMNS = [
    ("partition", "VARCHAR"), ("version", "VARCHAR"), ("model", "VARCHAR"), ("rows", "BIGINT"),
    ("labeled", "BIGINT"), ("errors", "BIGINT"), ("input_tokens", "BIGINT"), ("output_tokens", "BIGINT"),
    ("wall_s", "DOUBLE"), ("engine_s", "DOUBLE"), ("tokens_per_hour", "DOUBLE"), ("cost_usd", "DOUBLE"),
    ("prefix_cache_hit_rate", "DOUBLE"), ("resumed_rows", "BIGINT"), ("deduplicated_rows", "BIGINT"),
    ("finished_at", "VARCHAR"), ("generated_requests", "BIGINT"), ("reused_rows", "BIGINT"),
    ("engine_start_s", "DOUBLE"), ("generation_cost_usd", "DOUBLE"), ("truncated_rows", "BIGINT"),
    ("reasoning_tokens", "BIGINT"),
]


@contextmanager
def connect(path: Path, timeout_s: float = 120.0) -> Iterator[Any]:
    """Open the DuckDB file, waiting (with jitter) while another process holds its lock."""
    import duckdb

    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    while True:
        try:
            con = duckdb.connect(str(path))
            break
        except duckdb.IOException as exc:
            if "lock" not in str(exc).lower() or time.monotonic() > deadline:
                raise SparkbatchError(f"cannot open {path}: {exc}") from exc
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 1.0)
    try:
        yield con
    finally:
        con.close()


def record(home: JobHome, stats: list[ShardStats]) -> None:
    """Upsert per-partition statistics into ``run_metrics``."""
    _upsert(home, "run_metrics", METRIC_COLUMNS, ("partition", "version"), [s.to_json() for s in stats])


def _upsert(home: JobHome, table: str, columns: list[tuple[str, str]], key: tuple[str, ...],
            rows: list[dict[str, Any]]) -> None:
    writing(home, lambda con: fill(con, table, columns, key, rows))


def writing(home: JobHome, work: Callable[[Any], T]) -> T:
    """``work(con)`` on ``metrics.duckdb`` opened for writing. A file DuckDB finds damaged (when
    opened, or only when a query reaches the bad bytes) is set aside (``.broken-<time>``, kept for a
    look) and a new one rebuilt from the stats and attempt files of every version, then ``work``
    runs on that."""
    path, damage = home.metrics_db, ""
    for attempt in range(3):
        seen = _identity(path)
        try:
            with connect(path) as con:
                if attempt:
                    _rebuild(home, con)
                return work(con)
        except Exception as exc:
            if not _damaged(exc):
                raise
            damage = str(exc.__cause__ or exc).splitlines()[0]
            _set_aside(home, seen, damage)
    raise SparkbatchError(f"{path} is damaged ({damage}) and stays so when made again: move it away (it is "
                          "derived from the stats files) and run again")


def _identity(path: Path) -> tuple[int, int] | None:
    """Which file is at ``path``: a set-aside moves it (its inode) away, and the new one is another."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def _damaged(exc: BaseException) -> bool:
    import duckdb

    cause = exc if isinstance(exc, duckdb.Error) else exc.__cause__
    return isinstance(cause, duckdb.Error) and any(w in str(cause).lower() for w in _DAMAGED)


def _set_aside(home: JobHome, seen: tuple[int, int] | None, damage: str) -> None:
    """Move the damaged file (and its write-ahead log) aside, unless it is not the one found damaged
    any more (another writer set that aside and made a new one since: ``seen`` was its identity)."""
    path = home.metrics_db
    with FileLock(home.root / ".metrics.lock").held():
        if seen is None or _identity(path) != seen:
            return
        stamp = time.strftime("%Y%m%dT%H%M%S")
        log.warning("%s is damaged (%s): set aside as %s.broken-%s and rebuilt from the stats files",
                    path, damage, path.name, stamp)
        for damaged in (path, path.with_name(path.name + ".wal")):
            if damaged.exists():
                damaged.rename(damaged.with_name(f"{damaged.name}.broken-{stamp}"))


def _rebuild(home: JobHome, con: Any) -> None:
    """``run_metrics`` and ``attempts`` of every version the home has, from their files."""
    from .attempts import COLUMNS, load

    out = home.root / "out"
    for folder in sorted(out.iterdir()) if out.exists() else []:
        if folder.is_dir() and len(folder.name) == 16:
            fill(con, "run_metrics", METRIC_COLUMNS, ("partition", "version"),
                 [s.to_json() for s in committed_stats(home, folder.name).values()])
            fill(con, "attempts", COLUMNS, ("attempt",), [r.to_json() for r in load(home, folder.name)])


def sync_attempts(home: JobHome, version: str) -> list[AttemptRecord]:
    """Mirror every attempt of ``version`` (``attempts.py``) into the ``attempts`` table; return them."""
    from .attempts import COLUMNS, load, record_killed

    record_killed(home, version)  # a killed attempt's own file (and object) says so from now on
    records = load(home, version)
    if records:
        _upsert(home, "attempts", COLUMNS, ("attempt",), [r.to_json() for r in records])
    return records


def committed_stats(home: JobHome, version: str) -> dict[str, ShardStats]:
    """Statistics of every committed shard of ``version``, by partition key."""
    stats_dir = home.version_dir(version) / "stats"
    return {p.stem: read_stats(p) for p in sorted(stats_dir.glob("shard-*.json")) if home.is_done(version, p.stem)}


def sync(home: JobHome, version: str) -> dict[str, ShardStats]:
    """Mirror every committed shard's stats file into ``run_metrics``; return those stats.

    The stats files are the source of truth; this makes the table whole again after a crash
    between a shard's commit and its metrics step.
    """
    stats = committed_stats(home, version)
    if stats:
        record(home, list(stats.values()))
    return stats


def prediction_check(home: JobHome, version: str, stats: list[ShardStats]) -> CostCheck | None:
    """The bill of the committed shards and, when an estimate was made, predicted vs actual
    generation time (None: no shard committed).

    The bill: ``cost_usd`` is everything the box was rented for, generation plus every engine
    start a run paid (each run charges its start to one shard's stats), the number the
    estimate's ``cost_usd`` predicts; ``generation_cost_usd`` and ``engine_start_s`` /
    ``engine_start_cost_usd`` split it. (Stats written before the start was recorded apart
    count it inside ``wall_s``.)

    The check compares like with like: generation time, engine start left out of both sides,
    over the same prompts. The estimate predicted the prompts a run sends to the engine (those
    whose answer the result store already held cost nothing and were not predicted); the
    prediction is scaled to the prompts the committed shards actually generated
    (``generated_requests``), so a partial run, a resumed shard or answers reused since the
    estimate still compare fairly. Estimates or stats from older releases scale by rows.
    """
    import json

    if not stats:
        return None
    total = sum(s.cost_usd for s in stats)
    generation = sum(s.generation_usd for s in stats)
    check = CostCheck(cost_usd=round(total, 6), generation_cost_usd=round(generation, 6),
                      engine_start_s=round(sum(s.engine_start_s for s in stats), 2),
                      engine_start_cost_usd=round(total - generation, 6))
    path = home.prediction_path(version)
    if not path.exists():
        return check
    # The estimate's prediction file (estimate/): read by its keys until it has a record of its own.
    pred = json.loads(path.read_text())
    actual = sum(s.wall_s for s in stats)
    generated = [s.generated_requests for s in stats]
    if pred.get("predicted_prompts") is not None and None not in generated:
        share = sum(g or 0 for g in generated) / pred["predicted_prompts"] if pred["predicted_prompts"] else 0.0
    else:
        share = sum(s.rows for s in stats) / max(pred["total_rows"], 1)
    predicted = pred["predicted_wall_s"] * share
    return CostCheck(check.cost_usd, check.generation_cost_usd, check.engine_start_s, check.engine_start_cost_usd,
                     Prediction(round(predicted, 1), round(actual, 1),
                                round((predicted - actual) / actual * 100, 1) if actual else None))


def analytics(spec: JobSpec, home: JobHome, version: str) -> Headline:
    """Refresh the DuckDB views over the labeled output and return the headline numbers.

    Views (:func:`.views.define_views`): ``labeled`` (output rows joined with their input),
    ``label_distribution``, ``review`` (rows whose confidence is under ``spec.review_below``,
    least sure first) and ``reliability`` (rows per confidence bucket, :mod:`.reliability`; with
    a gold column how many were right). The headline has ``confidence`` (mean, rows below
    ``review_below``) when rows have one, and ``reliability`` (a row per non-empty bucket) with a
    gold column.
    """
    committed = sync(home, version)
    sync_attempts(home, version)  # the bill as of now, whichever box ran (and a dead one's end recorded)
    if not committed:
        return Headline(label_distribution={})
    return writing(home, lambda con: _headline(con, spec, home, version, sorted(committed)))


#: Over the rows with a gold value: the model's own answer right (a reviewer's label does not count
#: for the model), and the output after review right (the reviewers' corrections count).
ACCURACY_SQL = ("SELECT count(gold), count(*) FILTER (WHERE gold IS NOT NULL AND model_output_or_none = gold), "
                "count(*) FILTER (WHERE gold IS NOT NULL AND error IS NULL AND output = gold), "
                "count(*) FILTER (WHERE gold IS NOT NULL AND reviewed_by IS NOT NULL) "
                "FROM (SELECT *, CASE WHEN reviewed_by IS NULL THEN output ELSE model_output END "
                "AS model_output_or_none FROM labeled)")


def _headline(con: Any, spec: JobSpec, home: JobHome, version: str, keys: list[str]) -> Headline:
    define_views(con, spec, home, version, keys)
    rows, errors = con.execute("SELECT count(*), count(error) FROM labeled").fetchone()
    gold, model_right, after_right, reviewed = con.execute(ACCURACY_SQL).fetchone()
    dist = dict(con.execute("SELECT label, rows FROM label_distribution").fetchall())
    sure, mean, review = con.execute(
        "SELECT count(confidence), avg(confidence), (SELECT count(*) FROM review) FROM labeled").fetchone()
    buckets = con.execute("SELECT low, rows, truth_rows, correct, mean_confidence FROM reliability").fetchall()
    cost = con.execute(
        "SELECT sum(cost_usd), sum(rows) FROM run_metrics WHERE version = ?", [version]
    ).fetchone() if _has_table(con, "run_metrics") else (None, None)
    cut = threshold_of(spec, home)
    known = bool(spec.gold_column) and gold > 0
    return Headline(
        rows=rows, labeled=rows - errors, errors=errors,
        accuracy=round(model_right / gold, 4) if known else None,
        accuracy_rows=gold if spec.gold_column else None,
        accuracy_after_review=round(after_right / gold, 4) if known else None,
        reviewed_gold_rows=reviewed if spec.gold_column else None,
        label_distribution=dist,
        cost_per_1k_rows_usd=round(cost[0] / cost[1] * 1000, 6) if cost[0] and cost[1] else None,
        confidence=Confidence(rows=sure, mean=round(mean, 4), review_below=cut.threshold, review_rows=review,
                              review_share=cut.share, review_cut=cut.describe(), review_note=cut.why)
        if sure else None,
        reliability=[bucket_row(round(b * BUCKETS), n, c, m, t) for b, n, t, c, m in buckets]
        if any(t for _, _, t, _, _ in buckets) and sure else None,
    )


def _has_table(con: Any, name: str) -> bool:
    return bool(con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = ?", [name]).fetchone()[0])


