"""The job's DuckDB views and tables, on any connection.

:func:`define_views` makes ``labeled`` (the committed output rows joined with their input),
``label_distribution``, ``review`` and ``reliability``; :func:`fill` a table from records. Used on
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
from .checkpoint import WITH_CONFIDENCE, WITH_REASONING
from .reliability import BUCKET_SQL, BUCKETS


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
    gold = f", s.{quote_ident(spec.gold_column)} AS gold" if spec.gold_column else ", NULL AS gold"
    # Files written before confidences (thinking) were kept have no such column: null there.
    con.execute(
        f"CREATE OR REPLACE VIEW labeled AS SELECT o.*{gold} "
        f"FROM (FROM read_parquet([{', '.join(map(sql_path, files))}], union_by_name = true) "
        f"{WITH_CONFIDENCE} {WITH_REASONING}) o "
        f"JOIN read_parquet([{', '.join(map(sql_path, shards))}]) s USING (row_id)"
    )
    con.execute(
        "CREATE OR REPLACE VIEW label_distribution AS SELECT output AS label, count(*) AS rows "
        "FROM labeled WHERE error IS NULL GROUP BY ALL ORDER BY rows DESC, label"
    )
    con.execute(
        f"CREATE OR REPLACE VIEW review AS SELECT * FROM labeled WHERE confidence < {float(spec.review_below)!r} "
        "ORDER BY confidence, row_id"
    )
    # Without a gold column nothing says what was right: correct and accuracy are null.
    right = ("count(*) FILTER (WHERE output = gold)" if spec.gold_column else "NULL::BIGINT")
    con.execute(
        "CREATE OR REPLACE VIEW reliability AS "
        f"SELECT printf('%.1f-%.1f', b / {BUCKETS}, (b + 1) / {BUCKETS}) AS bucket, b / {BUCKETS} AS low, "
        f"(b + 1) / {BUCKETS} AS high, count(*) AS rows, {right} AS correct, "
        f"round({right} / count(*), 4) AS accuracy, round(avg(confidence), 4) AS mean_confidence "
        f"FROM (SELECT *, {BUCKET_SQL} AS b FROM labeled WHERE confidence IS NOT NULL) "
        "GROUP BY b ORDER BY b"
    )
    return [*files, *shards]


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
