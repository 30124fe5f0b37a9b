"""The job's DuckDB views and tables, on any connection.

:func:`define_views` makes ``labeled`` (the committed output rows joined with their input, the
reviewers' labels over the model's, confidences by the newest calibration), ``label_distribution``,
``queued`` (every row the review cut selects or ever queued, :mod:`.review_members`), ``review``
(the queued rows no one has reviewed or dismissed yet) and ``reliability``; :func:`fill`
a table from records. Used on
``metrics.duckdb`` by its writers (:mod:`.metrics`: for dagster-duckdb and other readers of that
file) and on ``sparkbatch sql``'s in-memory database (:mod:`.query`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import SparkbatchError
from ..home import JobHome
from ..inputs.shard_files import damaged_shards
from ..inputs.shards import quote_ident
from ..spec import JobSpec
from . import human_labels, review_members
from .calibration_map import confidence_sql, stored
from .checkpoint import WITH_CONFIDENCE, WITH_REASONING, WITH_REVIEW
from .reliability import BUCKET_SQL, BUCKETS
from .review_marks import job_labels
from .review_queue import threshold_of
from .truth import truth_sql


def sql_path(p: Path) -> str:
    return "'" + str(p).replace("'", "''") + "'"


def define_views(con: Any, spec: JobSpec, home: JobHome, version: str, keys: list[str]) -> list[Path]:
    """The four views over the committed shards ``keys`` of ``version`` (by name, not a glob: a file
    no commit names is not output); returns the files they read. A shard file found damaged stops
    here, naming it and the fix (it is derived from the input: the next sharding makes it again)."""
    damaged = damaged_shards(home, keys)
    if damaged:
        raise SparkbatchError(f"{damaged[0]}: `sparkbatch run` (or materializing input_shards) makes it "
                              "again from the input")
    files = [home.labeled_path(version, k) for k in keys]
    shards = [home.shard_path(k) for k in keys]
    # A blank or null gold cell is no truth, and a gold column of another type is compared as text
    # (run/truth.py: the estimate's sample reads gold the same way).
    gold = truth_sql(f"s.{quote_ident(spec.gold_column)}") if spec.gold_column else "NULL::VARCHAR"
    people = human_labels.load(home, job_labels(spec))
    _human_table(con, people)
    raw = "coalesce(o.raw_confidence, o.confidence)"  # files written before calibration: the model's own
    sure = confidence_sql(stored(home.calibration_dir, job_labels(spec)), raw, "o.model")
    said = "CASE WHEN o.reviewed_by IS NULL THEN o.output ELSE o.model_output END"  # the model's own answer
    # The newest reviewer's label wins over the model's (and over one a run already wrote); the
    # confidence is the newest calibration of the model's own; files written before confidences
    # (thinking), calibrations or reviews were kept have no such columns: null there.
    con.execute(
        "CREATE OR REPLACE VIEW labeled AS SELECT o.* REPLACE ("
        "CASE WHEN h.row_id IS NULL THEN o.output ELSE h.label END AS output, "
        "CASE WHEN h.row_id IS NULL THEN o.error END AS error, "
        f"{sure} AS confidence, {raw} AS raw_confidence, "
        f"CASE WHEN h.row_id IS NULL THEN o.model_output ELSE {said} END AS model_output, "
        "coalesce(h.reviewed_by, o.reviewed_by) AS reviewed_by, "
        "coalesce(h.reviewed_at, o.reviewed_at) AS reviewed_at), "
        f"{gold} AS gold, "
        f"coalesce(h.label, CASE WHEN o.reviewed_by IS NOT NULL THEN o.output END, {gold}) AS truth, "
        f"({said}) = coalesce(h.label, CASE WHEN o.reviewed_by IS NOT NULL THEN o.output END, {gold}) "
        "AS model_correct "
        f"FROM (FROM read_parquet([{', '.join(map(sql_path, files))}], union_by_name = true) "
        f"{WITH_CONFIDENCE} {WITH_REASONING} {WITH_REVIEW}) o "
        f"JOIN read_parquet([{', '.join(map(sql_path, shards))}]) s USING (row_id) "
        "LEFT JOIN human_labels h USING (row_id)"
    )
    con.execute(
        "CREATE OR REPLACE VIEW label_distribution AS SELECT output AS label, count(*) AS rows "
        "FROM labeled WHERE error IS NULL GROUP BY ALL ORDER BY rows DESC, label"
    )
    _queue_views(con, spec, home)
    # Right is the model's own answer against the truth (a reviewer's label, else the gold column),
    # counted over the rows that have a truth only (``truth_rows``): a row nobody knows the answer
    # of is neither right nor wrong.
    con.execute(
        "CREATE OR REPLACE VIEW reliability AS "
        f"SELECT printf('%.1f-%.1f', b / {BUCKETS}, (b + 1) / {BUCKETS}) AS bucket, b / {BUCKETS} AS low, "
        f"(b + 1) / {BUCKETS} AS high, count(*) AS rows, count(model_correct) AS truth_rows, "
        "CASE WHEN count(model_correct) > 0 THEN count(*) FILTER (WHERE model_correct) END AS correct, "
        "round(count(*) FILTER (WHERE model_correct) / nullif(count(model_correct), 0), 4) AS accuracy, "
        "round(avg(confidence), 4) AS mean_confidence "
        f"FROM (SELECT *, {BUCKET_SQL} AS b FROM labeled WHERE confidence IS NOT NULL) "
        "GROUP BY b ORDER BY b"
    )
    return [*files, *shards]


def _queue_views(con: Any, spec: JobSpec, home: JobHome) -> None:
    """``queued``: every row the cut in force selects (a share of rows least sure first, or a
    threshold) or that was ever queued (:mod:`.review_members`), with its ``review_rank`` and
    ``review_state`` (waiting, reviewed, dismissed); ``review``: the waiting ones, least sure first."""
    import pyarrow as pa

    cut = threshold_of(spec, home)
    seen = review_members.members(home)
    for name, ids in (("review_queued", seen.queued), ("review_dismissed", seen.dismissed)):
        _table(con, name, pa.table({"row_id": pa.array(sorted(ids), pa.string())}))
    # Ties on the calibrated confidence (a constant or stepped map) are broken by the model's own,
    # then by row id, so a share is that many rows; floor(x + 0.5) is review_budget.cut's rounding.
    selects = (f"review_rank <= floor({float(cut.share)!r} * sb_rows + 0.5 + 1e-9)" if cut.share is not None
               else f"confidence < {float(cut.threshold)!r}")
    con.execute(
        "CREATE OR REPLACE VIEW queued AS SELECT * EXCLUDE (sb_rows), "
        "CASE WHEN reviewed_by IS NOT NULL THEN 'reviewed' WHEN row_id IN (FROM review_dismissed) THEN 'dismissed' "
        "ELSE 'waiting' END AS review_state FROM (SELECT *, row_number() OVER (ORDER BY confidence, raw_confidence, "
        "row_id) AS review_rank, count(*) OVER () AS sb_rows FROM labeled "
        f"WHERE confidence IS NOT NULL) WHERE {selects} OR row_id IN (FROM review_queued) ORDER BY review_rank"
    )
    con.execute(
        "CREATE OR REPLACE VIEW review AS SELECT * EXCLUDE (review_state) FROM queued "
        "WHERE review_state = 'waiting' ORDER BY confidence, raw_confidence, row_id"
    )


def _human_table(con: Any, labels: dict[str, human_labels.HumanLabel]) -> None:
    """The reviewers' labels as a table the ``labeled`` view joins (rebuilt with the views)."""
    import pyarrow as pa

    rows = list(labels.values())
    table = pa.table({"row_id": [h.row_id for h in rows], "label": [h.label for h in rows],
                      "reviewed_by": [h.reviewer for h in rows], "reviewed_at": [h.reviewed_at for h in rows]},
                     schema=pa.schema([(n, pa.string()) for n in ("row_id", "label", "reviewed_by", "reviewed_at")]))
    _table(con, "human_labels", table)


def _table(con: Any, name: str, table: Any) -> None:
    """``table`` (pyarrow) as the database's table ``name``, replaced: a copy, so the views that read
    it stay valid once the Arrow data is gone."""
    con.register("sb_arrow", table)
    try:
        con.execute(f"CREATE OR REPLACE TABLE {name} AS FROM sb_arrow")
    finally:
        con.unregister("sb_arrow")


def fill(con: Any, table: str, columns: list[tuple[str, str]], key: tuple[str, ...],
         rows: list[dict[str, Any]]) -> None:
    """Create ``table`` if absent (adding columns a table of an older release lacks) and upsert ``rows``."""
    cols = ", ".join(f'"{c}" {t}' for c, t in columns)
    con.execute(f"CREATE TABLE IF NOT EXISTS {table} ({cols}, PRIMARY KEY ({', '.join(key)}))")
    for c, t in columns:
        con.execute(f'ALTER TABLE {table} ADD COLUMN IF NOT EXISTS "{c}" {t}')
    if rows:
        names = [c for c, _ in columns]
        con.executemany(
            f"INSERT OR REPLACE INTO {table} ({', '.join(quote_ident(n) for n in names)}) "
            f"VALUES ({', '.join('?' for _ in names)})",
            [[r.get(c) for c in names] for r in rows],
        )
