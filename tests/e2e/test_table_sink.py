"""The table sink: the committed rows of the current version as a Delta Lake table, each row once,
through the real Dagster instance with the fake engine; read back with delta-rs and with DuckDB,
in a folder home and in a bucket home (moto's S3 server)."""

from __future__ import annotations

import json
import sys
from collections import Counter

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from dagster import DagsterInstance, EnvVar, materialize
from deltalake import DeltaTable, write_deltalake  # the dev extra has it (pyproject.toml)
from deltalake.exceptions import CommitFailedError

from sparkbatch_dagster import SinkSpec, build_batch_assets
from sparkbatch_dagster.cli.commands import RANGE_END, RANGE_START
from sparkbatch_dagster.errors import ConfigError
from sparkbatch_dagster.run.table_sink import open_table, sync_table, table_uri
from testkit import SUPPORT, fake_resource, make_spec, yaml_job_spec

N = 200


def _setup(tmp_path, **kw):
    kw.setdefault("sink", SinkSpec())
    spec = make_spec(tmp_path, n=N, shards=4, **kw)
    job = build_batch_assets(spec=spec)
    res = {"vllm": fake_resource()[0]}
    inst = DagsterInstance.get()
    assert materialize(job.assets, selection=[job.keys["input_shards"]], resources=res, instance=inst).success
    return spec, job, res, inst


def _label(job, res, inst, **kw):
    keys = inst.get_dynamic_partitions(job.partitions_def.name)
    tags = {RANGE_START: keys[0], RANGE_END: keys[-1]}
    return materialize(job.assets, selection=[job.keys["labeled_outputs"]], resources=res, instance=inst, tags=tags,
                       **kw)


def _analytics(job, res, inst):
    result = materialize(job.assets, selection=[job.keys["analytics"]], resources=res, instance=inst)
    assert result.success
    return {k: v.value for k, v in result.asset_materializations_for_node("things__analytics")[0].metadata.items()}


def _duckdb_rows(table, con=None):
    """The table read by DuckDB itself: its Parquet files, as delta-rs lists the live ones."""
    con = con or duckdb.connect()
    files = table.file_uris()
    return con.execute("SELECT version, shard, row_id, output FROM read_parquet(?) ORDER BY row_id", [files]).fetchall()


def _expected(job):
    """What the table must hold: every committed row of the current version, as the job reads it."""
    out = job.read_outputs()
    return sorted(zip(out.column("row_id").to_pylist(), out.column("output").to_pylist(), strict=True))


def test_the_table_holds_each_committed_row_once_and_a_replay_adds_nothing(tmp_path):
    spec, job, res, inst = _setup(tmp_path)
    assert _label(job, res, inst).success
    md = _analytics(job, res, inst)
    uri = table_uri(spec)
    assert uri == str(spec.home_path / "tables" / "labeled") and md["table_uri"] == uri
    assert md["table_rows"] == N and md["table_shards_added"] == 4
    table = DeltaTable(uri)
    rows = table.to_pyarrow_table().sort_by("row_id")
    assert rows.num_rows == N and len(set(rows.column("row_id").to_pylist())) == N
    assert sorted(zip(rows.column("row_id").to_pylist(), rows.column("output").to_pylist(), strict=True)) == \
        _expected(job)
    version = job.current_version()
    assert set(rows.column("version").to_pylist()) == {version}
    # Each shard's rows as many as its commit says.
    per_shard = Counter(rows.column("shard").to_pylist())
    keys = inst.get_dynamic_partitions(job.partitions_def.name)
    assert per_shard == {k: json.loads(job.home.stats_path(version, k).read_text())["rows"] for k in keys}
    # DuckDB over the same files: the same rows, once each.
    seen = _duckdb_rows(table)
    assert len(seen) == N and [(r[2], r[3]) for r in seen] == _expected(job)
    # A replay: analytics again, and the sync itself, write nothing (the table's version stays).
    before = table.version()
    md = _analytics(job, res, inst)
    assert md["table_shards_added"] == 0 and md["table_version"] == before and md["table_rows"] == N
    again = job.sync_table()
    assert again["shards_added"] == [] and again["table_version"] == before
    assert job.table().version() == before and job.table().to_pyarrow_table().num_rows == N


def test_a_crash_mid_run_then_resume_gives_each_row_once(tmp_path):
    spec, job, res, inst = _setup(tmp_path)
    res["vllm"] = fake_resource(fail_after=90)[0]  # the engine dies midway: some shards committed, not all
    assert not _label(job, res, inst, raise_on_error=False).success
    version = job.current_version()
    keys = inst.get_dynamic_partitions(job.partitions_def.name)
    done = [k for k in keys if job.home.is_done(version, k)]
    assert 0 < len(done) < len(keys)
    md = _analytics(job, res, inst)  # the sync sees the committed shards only
    table = open_table(spec)
    part = table.to_pyarrow_table()
    assert set(part.column("shard").to_pylist()) == set(done) and md["table_rows"] == part.num_rows
    assert part.num_rows == len(set(part.column("row_id").to_pylist())) == len(_expected(job))
    # Resume on a working engine: the rest commits, the next sync adds only what was missing.
    res["vllm"] = fake_resource()[0]
    assert _label(job, res, inst).success
    md = _analytics(job, res, inst)
    assert md["table_shards_added"] == len(keys) - len(done) and md["table_rows"] == N
    whole = open_table(spec).to_pyarrow_table()
    assert whole.num_rows == N and len(set(whole.column("row_id").to_pylist())) == N
    assert len(_duckdb_rows(open_table(spec))) == N


def test_a_new_version_replaces_the_old_rows_and_the_old_table_stays_readable(tmp_path):
    spec, job, res, inst = _setup(tmp_path)
    assert _label(job, res, inst).success
    _analytics(job, res, inst)
    old_version, old_table = job.current_version(), open_table(spec).version()
    spec2 = make_spec(tmp_path, n=N, shards=4, sink=SinkSpec(), user_template="Kind? {{ text }}")
    job2 = build_batch_assets(spec=spec2)
    assert _label(job2, res, inst).success
    new_version = job2.current_version()
    assert new_version != old_version
    md = _analytics(job2, res, inst)
    assert md["table_rows"] == N
    table = open_table(spec2)
    rows = table.to_pyarrow_table()
    assert set(rows.column("version").to_pylist()) == {new_version} and rows.num_rows == N
    assert {r[0] for r in _duckdb_rows(table)} == {new_version}
    # Delta time travel: the table as it was before the new version came.
    then = DeltaTable(table_uri(spec2), version=old_table).to_pyarrow_table()
    assert set(then.column("version").to_pylist()) == {old_version} and then.num_rows == N
    # A version with nothing committed yet: no row of another version stays (one delete, one commit).
    empty = sync_table(spec2, job2.home, "0" * 16)
    assert empty["versions_replaced"] == [new_version] and empty["rows"] == 0
    assert open_table(spec2).version() == table.version() + 1


def test_a_table_of_another_job_or_of_nobody_is_refused(tmp_path):
    spec, job, res, inst = _setup(tmp_path)
    assert _label(job, res, inst).success
    other = spec.model_copy(update={"name": "other_job"})  # same home and table, another job
    assert job.sync_table()["rows"] == N
    with pytest.raises(ConfigError, match=r"is job 'things''s table, and a sync would replace its rows: give job "
                                          r"'other_job' a sink.uri of its own"):
        sync_table(other, job.home, job.current_version())
    foreign = tmp_path / "foreign"
    write_deltalake(str(foreign), pa.table({"x": [1]}))
    theirs = spec.model_copy(update={"sink": SinkSpec(uri=str(foreign))})
    with pytest.raises(ConfigError, match="not a table a sparkbatch job created"):
        sync_table(theirs, job.home, job.current_version())
    assert DeltaTable(str(foreign)).to_pyarrow_table().num_rows == 1  # untouched


def test_a_writer_that_lost_the_race_is_refused_and_the_next_sync_finds_the_rows(tmp_path):
    """What the sync relies on between boxes: a replace-where based on an older snapshot does not
    commit over rows another writer added meanwhile (delta-rs refuses it), so they are never doubled."""
    spec, job, res, inst = _setup(tmp_path)
    res["vllm"] = fake_resource(fail_after=90)[0]
    assert not _label(job, res, inst, raise_on_error=False).success
    version = job.current_version()
    first = sync_table(spec, job.home, version)
    stale = open_table(spec)  # what a second box read before the first box's next sync
    res["vllm"] = fake_resource()[0]
    assert _label(job, res, inst).success
    second = sync_table(spec, job.home, version)  # the first box adds the rest
    assert second["shards_added"] and second["table_version"] == first["table_version"] + 1
    keys = second["shards_added"]
    now = open_table(spec).to_pyarrow_table()
    theirs = now.filter(pc.is_in(now.column("shard"), value_set=pa.array(keys)))
    # The second box, late, writes the same shards from its older snapshot, as sync_table would.
    with pytest.raises(CommitFailedError, match="concurrent"):
        write_deltalake(stale, theirs, mode="overwrite",
                        predicate=f"version <> '{version}' OR shard IN ({', '.join(repr(k) for k in keys)})")
    assert open_table(spec).to_pyarrow_table().num_rows == N
    assert sync_table(spec, job.home, version)["shards_added"] == []


def test_the_table_in_the_bucket_home(tmp_path, s3_server, s3_bucket):
    home = f"s3://{s3_bucket}/jobs/things"
    spec, job, res, inst = _setup(tmp_path, home=home, cache_dir=str(tmp_path / "cache"),
                                  sink=SinkSpec(storage_options={"AWS_ALLOW_HTTP": "true"}))
    assert _label(job, res, inst).success
    md = _analytics(job, res, inst)
    assert md["table_uri"] == f"{home}/tables/labeled" and md["table_rows"] == N
    fs = s3_server.fs()
    assert fs.ls(f"{s3_bucket}/jobs/things/tables/labeled/_delta_log")  # in the bucket, not the cache
    assert not (tmp_path / "cache" / "tables").exists()
    table = DeltaTable(md["table_uri"], storage_options={"AWS_ALLOW_HTTP": "true"})
    rows = table.to_pyarrow_table()
    assert rows.num_rows == N and len(set(rows.column("row_id").to_pylist())) == N
    # DuckDB reads the bucket's files through s3fs (its httpfs extension cannot be installed offline).
    con = duckdb.connect()
    con.register_filesystem(fs)
    seen = _duckdb_rows(table, con)
    assert [(r[2], r[3]) for r in seen] == _expected(job)
    assert _analytics(job, res, inst)["table_shards_added"] == 0
    # Two boxes that read the same snapshot both rewrite shard-00000: S3's conditional write lets
    # one commit, and delta-rs refuses the other (it would have left the rows twice).
    options = {"AWS_ALLOW_HTTP": "true"}
    one, two = (DeltaTable(md["table_uri"], storage_options=options) for _ in range(2))
    shard = rows.filter(pc.equal(rows.column("shard"), "shard-00000"))
    predicate = f"version <> '{job.current_version()}' OR shard IN ('shard-00000')"
    write_deltalake(one, shard, mode="overwrite", predicate=predicate)
    with pytest.raises(CommitFailedError, match="concurrent"):
        write_deltalake(two, shard, mode="overwrite", predicate=predicate)
    after = DeltaTable(md["table_uri"], storage_options=options).to_pyarrow_table()
    assert after.num_rows == N and len(set(after.column("row_id").to_pylist())) == N


def test_bad_sink_settings_stop_with_the_fix(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"sink.uri 'ftp://x/t': delta-rs cannot write to ftp://"):
        make_spec(tmp_path, sink={"uri": "ftp://x/t"})
    with pytest.raises(ConfigError, match=r"format"):
        make_spec(tmp_path, sink={"format": "iceberg"})
    with pytest.raises(ConfigError, match=r"AWS_SECRET_ACCESS_KEY'\] is a secret written in the spec"):
        make_spec(tmp_path, sink={"storage_options": {"AWS_SECRET_ACCESS_KEY": "abc"}})
    spec = make_spec(tmp_path, sink={"uri": "s3://w/t", "storage_options": {"AWS_SECRET_ACCESS_KEY": EnvVar("W_S")}})
    assert table_uri(spec) == "s3://w/t" and "W_S" not in repr(spec)
    from sparkbatch_dagster.run.table_sink import _options

    with pytest.raises(ConfigError, match="W_S, which is not set"):
        _options(spec)
    monkeypatch.setenv("W_S", "s-1")
    assert _options(spec) == {"AWS_SECRET_ACCESS_KEY": "s-1"}
    assert table_uri(make_spec(tmp_path, sink={"uri": "t/labels"})) == str(tmp_path / "home" / "t" / "labels")
    # A machine without deltalake: the run stops before any engine starts, naming the extra.
    from sparkbatch_dagster.run.table_sink import check_sink

    monkeypatch.setitem(sys.modules, "deltalake", None)
    with pytest.raises(ConfigError, match=r"deltalake package is not installed: pip install '\S+\[delta\]'"):
        check_sink(spec)


def test_a_sink_in_yaml(tmp_path):
    spec = yaml_job_spec(f"""
type: sparkbatch_dagster.BatchInferenceComponent
attributes:
  name: things
  input: {tmp_path}/in.parquet
  text_columns: [text]
  user_template: "{{{{ text }}}}"
  sink:
    format: delta
    uri: s3://warehouse/labels/things
    storage_options:
      AWS_REGION: eu-west-1
      AWS_SECRET_ACCESS_KEY: {{env: WAREHOUSE_SECRET}}
""")
    assert spec.sink is not None and table_uri(spec) == "s3://warehouse/labels/things"
    assert spec.sink.storage_options["AWS_SECRET_ACCESS_KEY"] == {"env": "WAREHOUSE_SECRET"}


def test_a_job_with_a_sink_loads_without_deltalake(tmp_path):
    """The UI loads the code where deltalake is not installed: it is imported by the sync alone."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    code = (f"import sys; sys.path.insert(0, {str(SUPPORT)!r})\n"
            "from pathlib import Path\nfrom testkit import make_spec\n"
            "from sparkbatch_dagster import SinkSpec, build_batch_assets\n"
            f"job = build_batch_assets(spec=make_spec(Path({str(tmp_path)!r}), sink=SinkSpec()))\n"
            "print('deltalake' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.split()[-1] == "False"


def test_a_run_without_deltalake_stops_before_the_engine(tmp_path, monkeypatch):
    spec, job, res, inst = _setup(tmp_path)
    res["vllm"], engine = fake_resource()
    monkeypatch.setitem(sys.modules, "deltalake", None)  # as on a machine without the delta extra
    result = _label(job, res, inst, raise_on_error=False)
    assert not result.success and engine.requests_seen == 0
    failure = next(e for e in result.all_events if e.is_step_failure).step_failure_data.error
    assert "deltalake package is not installed: pip install 'sparkbatch-dagster[delta]'" in str(failure)
