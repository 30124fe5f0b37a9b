"""Reads never change the home, and a damaged home heals (issue 49): ``sparkbatch sql`` on a locked
in-memory DuckDB that refuses every write, attach, install, setting and foreign file; each commit
records its labeled file's rows and sha256, and a file that is not what its commit recorded is not
done (recomputed from the result store); a damaged ``metrics.duckdb`` is set aside and rebuilt, a
damaged shard file made again from the input. In-process: fake engine, real Parquet and DuckDB.
(The same through the CLI: tests/e2e/test_damaged_home.py.)"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from sparkbatch_dagster import SparkbatchError, build_batch_assets
from sparkbatch_dagster.cli.commands import sql
from sparkbatch_dagster.engines import FakeEngine
from sparkbatch_dagster.inputs.shards import build_shards
from sparkbatch_dagster.run import metrics
from sparkbatch_dagster.testing import label_shard
from testkit import fake_resource, make_spec

N, SHARDS = 40, 2
KEYS = [f"shard-{i:05d}" for i in range(SHARDS)]


def _finished(tmp_path: Path):
    """A job whose every shard is committed, labeled in-process: (job, resource, version)."""
    job = build_batch_assets(spec=make_spec(tmp_path, n=N, shards=SHARDS))
    res, engine = fake_resource()
    build_shards(job.spec, job.home)
    version = job.output_version(res)
    for key in KEYS:
        label_shard(job.spec, job.home, version, key, engine)
    return job, res, version


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.name.endswith(".lock")}


def _distribution(job, res) -> dict[str, int]:
    return dict(map(tuple, sql(job, res, "FROM label_distribution")["rows"]))


# --- sql: a read, locked ---------------------------------------------------------------------


def test_sql_refuses_every_write_attach_install_setting_and_foreign_file(tmp_path):
    job, res, version = _finished(tmp_path)
    labeled = job.home.labeled_path(version, "shard-00000")
    outside = tmp_path / "outside"
    hostile = [
        "DROP VIEW labeled", "DROP TABLE run_metrics", "CREATE TABLE t AS SELECT 1",
        "INSERT INTO run_metrics (partition, version) VALUES ('x', 'y')", "DELETE FROM attempts",
        f"COPY (SELECT * FROM labeled LIMIT 1) TO '{labeled}' (FORMAT parquet)",
        # The file the view reads is allowed; without a temporary file DuckDB would write it in place.
        f"COPY (SELECT * FROM labeled LIMIT 1) TO '{labeled}' (FORMAT parquet, USE_TMP_FILE false)",
        f"EXPLAIN ANALYZE COPY (SELECT 1 AS a) TO '{labeled}' (FORMAT parquet, USE_TMP_FILE false)",
        f"COPY (SELECT 1 AS a) TO '{outside}.csv'", f"EXPORT DATABASE '{outside}'",
        f"ATTACH '{job.home.metrics_db}' AS m", f"ATTACH '{outside}.db' AS o",
        "INSTALL httpfs", "LOAD httpfs", "SET threads = 1", "RESET allowed_paths",
        "SET enable_external_access = true", "PRAGMA enable_profiling",
        "SELECT 1; DROP VIEW labeled",
        "SELECT * FROM read_text('/etc/hostname')", "SELECT * FROM read_csv('/etc/passwd')",
        f"SELECT * FROM read_text('{job.home.manifest_path}')",  # the home's, but no view reads it
        f"SELECT * FROM glob('{job.home.root}/*')",
    ]
    before = _digest(job.home.root)
    for query in hostile:
        with pytest.raises(SparkbatchError) as err:
            sql(job, res, query)
        message = str(err.value)
        assert message.startswith("query refused: ") and "\n" not in message, (query, message)
    assert _digest(job.home.root) == before  # metrics.duckdb included: a read makes none
    assert not job.home.metrics_db.exists()
    assert not list(tmp_path.glob("outside*"))
    assert pq.read_metadata(labeled).num_rows > 1


def test_sql_answers_every_view_and_table_and_writes_nothing(tmp_path):
    job, res, version = _finished(tmp_path)
    before = _digest(job.home.root)
    rows = [r for k in KEYS for r in pq.read_table(job.home.labeled_path(version, k)).to_pylist()]
    counts = {lab: sum(r["output"] == lab for r in rows) for lab in {r["output"] for r in rows}}
    assert _distribution(job, res) == counts and sum(counts.values()) == N
    assert sql(job, res, "SELECT count(*), count(gold) FROM labeled")["rows"] == [[N, N]]
    assert sql(job, res, "SELECT sum(rows), count(*) FROM run_metrics")["rows"] == [[N, SHARDS]]
    records = list((job.home.version_dir(version) / "attempts").glob("*.json"))
    assert sql(job, res, "SELECT count(*) FROM attempts")["rows"] == [[len(records)]] and records
    assert sql(job, res, "SELECT count(*) FROM review")["rows"][0][0] >= 0
    assert sql(job, res, "WITH r AS (FROM reliability) SELECT count(*) FROM r")["rows"][0][0] >= 0
    assert sql(job, res, "DESCRIBE labeled")["rows"]
    assert sql(job, res, f"SELECT count(*) FROM '{job.home.labeled_path(version, 'shard-00001')}'")["rows"][0][0] > 0
    with pytest.raises(SparkbatchError, match=r"^query failed: Catalog Error"):
        sql(job, res, "FROM no_such_view")
    assert _digest(job.home.root) == before and not job.home.metrics_db.exists()


# --- the commit record: what the labeled file must be ------------------------------------------


def test_each_commit_records_its_labeled_files_rows_and_sha256(tmp_path):
    job, _, version = _finished(tmp_path)
    for key in KEYS:
        labeled = job.home.labeled_path(version, key)
        stats = json.loads(job.home.stats_path(version, key).read_text())
        assert stats["labeled_sha256"] == hashlib.sha256(labeled.read_bytes()).hexdigest()
        assert stats["labeled_bytes"] == labeled.stat().st_size
        assert stats["rows"] == pq.read_metadata(labeled).num_rows


def test_a_labeled_file_replaced_after_its_commit_is_not_done_and_is_recomputed_from_the_store(tmp_path):
    job, res, version = _finished(tmp_path)
    labeled = job.home.labeled_path(version, "shard-00000")
    answers = lambda: sorted((r["row_id"], r["output"]) for k in KEYS  # noqa: E731
                             for r in pq.read_table(job.home.labeled_path(version, k)).to_pylist())
    before, whole = answers(), _distribution(job, res)
    table = pq.read_table(labeled)
    # The bug report's COPY: the committed shard replaced by one of its own rows.
    pq.write_table(table.slice(0, 1), labeled)
    assert job.done_partitions(res) == ["shard-00001"]
    assert "holds 1 rows, its commit recorded" in job.home.broken(version, "shard-00000")
    assert sum(_distribution(job, res).values()) < N  # sql counts the committed shard only
    # The same rows and size, other answers: only the hash tells.
    pq.write_table(table, labeled)
    data = labeled.read_bytes()
    assert b"animal" in data
    labeled.write_bytes(data.replace(b"animal", b"ANIMAL"))
    assert job.done_partitions(res) == ["shard-00001"]
    assert "sha256 differs" in job.home.broken(version, "shard-00000")
    engine = FakeEngine()
    label_shard(job.spec, job.home, version, "shard-00000", engine)  # the next run sets it aside
    assert engine.requests_seen == 0  # every answer came from the result store
    assert answers() == before and _distribution(job, res) == whole
    assert job.done_partitions(res) == KEYS
    assert [p.name.split(".broken-")[0] for p in sorted(labeled.parent.parent.rglob("*.broken-*"))] == \
        ["shard-00000.parquet", "shard-00000.json"]


def test_a_record_from_before_the_hash_is_checked_on_its_rows_only(tmp_path):
    job, res, version = _finished(tmp_path)
    stats_path, labeled = job.home.stats_path(version, "shard-00000"), job.home.labeled_path(version, "shard-00000")
    old = {k: v for k, v in json.loads(stats_path.read_text()).items() if not k.startswith("labeled_")}
    stats_path.write_text(json.dumps(old))
    assert job.done_partitions(res) == KEYS
    table = pq.read_table(labeled)
    pq.write_table(table.slice(0, table.num_rows - 1), labeled)
    assert job.done_partitions(res) == ["shard-00001"]


# --- a damaged home heals ----------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1000, 0.5])
def test_a_damaged_metrics_file_is_set_aside_and_rebuilt_by_the_next_writer(tmp_path, size):
    job, res, version = _finished(tmp_path)
    first = metrics.analytics(job.spec, job.home, version)
    with open(job.home.metrics_db, "r+b") as fh:  # 0.5: half, which DuckDB opens and fails on at a query
        fh.truncate(int(size * job.home.metrics_db.stat().st_size) if size < 1 else size)
    damaged = job.home.metrics_db.read_bytes()
    assert _distribution(job, res) == first.label_distribution  # sql never opens it...
    assert job.home.metrics_db.read_bytes() == damaged  # ...nor mends it: a read
    again = metrics.analytics(job.spec, job.home, version)
    assert again.rows == N and again.label_distribution == first.label_distribution
    assert [p.name.split(".broken-")[0] for p in tmp_path.joinpath("home").glob("metrics.duckdb.broken-*")] == \
        ["metrics.duckdb"]
    with duckdb.connect(str(job.home.metrics_db), read_only=True) as con:
        assert con.execute("SELECT sum(rows), count(*) FROM run_metrics").fetchone() == (N, SHARDS)
        assert con.execute("SELECT sum(rows) FROM label_distribution").fetchone()[0] == N


def test_a_metrics_file_damaged_inside_is_rebuilt_too(tmp_path):
    job, res, version = _finished(tmp_path)
    metrics.analytics(job.spec, job.home, version)
    with open(job.home.metrics_db, "r+b") as fh:  # a block whose checksum no longer matches
        fh.seek(4096)
        fh.write(b"\0" * 4096)
    metrics.record(job.home, [metrics.committed_stats(job.home, version)["shard-00000"]])
    with duckdb.connect(str(job.home.metrics_db), read_only=True) as con:
        assert con.execute("SELECT sum(rows), count(*) FROM run_metrics").fetchone() == (N, SHARDS)


def test_a_damaged_shard_file_is_named_by_sql_and_made_again_by_the_next_sharding(tmp_path):
    job, res, version = _finished(tmp_path)
    whole = _distribution(job, res)
    shard = job.home.shard_path("shard-00001")
    rows = pq.read_table(shard).to_pylist()
    with open(shard, "r+b") as fh:
        fh.truncate(100)
    with pytest.raises(SparkbatchError) as err:
        sql(job, res, "FROM label_distribution")
    assert str(err.value).startswith(f"{shard} is damaged") and "`sparkbatch run`" in str(err.value)
    assert "\n" not in str(err.value)
    manifest = build_shards(job.spec, job.home)
    assert manifest["reused"] is False and pq.read_table(shard).to_pylist() == rows
    assert job.output_version(res) == version and job.done_partitions(res) == KEYS  # nothing to label again
    assert _distribution(job, res) == whole
    assert build_shards(job.spec, job.home)["reused"] is True
