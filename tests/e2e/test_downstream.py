"""Downstream assets the Dagster way: ``AssetIn`` on the job's outputs loads the committed rows
(the job's IO manager, outputs_io.py), and dagster-duckdb's DuckDBResource opens the job's
DuckDB file. Through the real Dagster instance, with the fake engine."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dagster import (
    AssetIn,
    DagsterInstance,
    Definitions,
    IOManager,
    SpecificPartitionsPartitionMapping,
    StaticPartitionsDefinition,
    asset,
    materialize,
)

from sparkbatch_dagster import build_batch_assets
from testkit import fake_resource, label_then_metrics, make_spec

KEYS = ["shard-00000", "shard-00001", "shard-00002", "shard-00003"]


def _job(tmp_path, **kw):
    job = build_batch_assets(spec=make_spec(tmp_path, n=200, shards=4, **kw))
    res = {"vllm": fake_resource()[0]}
    inst = DagsterInstance.get()
    assert materialize(job.assets, selection=[job.keys["input_shards"]], resources=res, instance=inst).success
    return job, res, inst


def _rows_on_disk(job, version, keys):
    return sorted(r["row_id"] for k in keys for r in pq.read_table(job.home.labeled_path(version, k)).to_pylist())


def _all_rows(job):
    @asset(ins={"labeled": AssetIn(key=job.keys["labeled_outputs"])})
    def all_rows(labeled: pa.Table) -> int:
        all_rows.seen = labeled  # type: ignore[attr-defined]
        return labeled.num_rows

    return all_rows


def _per_shard(job):
    @asset(partitions_def=job.partitions_def, ins={"labeled": AssetIn(key=job.keys["labeled_outputs"]),
                                                   "stats": AssetIn(key=job.keys["run_metrics"])})
    def per_shard(labeled: pa.Table, stats: pa.Table) -> int:
        per_shard.seen = (labeled, stats)  # type: ignore[attr-defined]
        return labeled.num_rows

    return per_shard


def test_unpartitioned_downstream_gets_every_committed_partition(tmp_path):
    job, res, inst = _job(tmp_path)
    labeled, measured = label_then_metrics(job.assets, job.keys, res, inst, KEYS[0], KEYS[2])  # 3 of 4
    assert labeled.success and measured.success
    down = _all_rows(job)
    # Definitions of the job's assets carry its IO manager; the user's own "io_manager" is untouched.
    mine = type("Mine", (IOManager,), {"handle_output": lambda s, c, o: None, "load_input": lambda s, c: None})()
    defs = Definitions(assets=[*job.assets, down], resources={**res, "io_manager": mine})
    assert {"io_manager", job.io_manager_key} <= set(defs.resolve_implicit_global_asset_job_def().resource_defs)
    result = materialize([*job.assets, down], selection=[down.key], resources={**res, "io_manager": mine},
                         instance=inst)
    assert result.success  # ("mine" loads None: the rows came from the job's IO manager)
    version = job.current_version()
    assert sorted(down.seen.column("row_id").to_pylist()) == _rows_on_disk(job, version, KEYS[:3])
    assert down.seen.num_rows == sum(pq.read_metadata(job.home.labeled_path(version, k)).num_rows for k in KEYS[:3])


def test_partitioned_downstream_gets_its_own_partition_and_fails_on_one_not_committed(tmp_path):
    job, res, inst = _job(tmp_path)
    labeled, measured = label_then_metrics(job.assets, job.keys, res, inst, KEYS[0], KEYS[1])
    assert labeled.success and measured.success
    down = _per_shard(job)
    result = materialize([*job.assets, down], selection=[down.key], partition_key=KEYS[1], resources=res,
                         instance=inst)
    assert result.success
    rows, stats = down.seen
    version = job.current_version()
    assert sorted(rows.column("row_id").to_pylist()) == _rows_on_disk(job, version, [KEYS[1]])
    assert stats.column("partition").to_pylist() == [KEYS[1]]
    assert stats.column("rows").to_pylist() == [rows.num_rows]
    # shard-00003 is registered but not labeled: the step fails, naming it and the fix.
    failed = materialize([*job.assets, down], selection=[down.key], partition_key=KEYS[3], resources=res,
                         instance=inst, raise_on_error=False)
    assert not failed.success
    message = str(failed.get_step_failure_events()[0].event_specific_data.error)
    assert KEYS[3] in message and "no committed output" in message and "materialize" in message


def test_a_partition_mapping_is_resolved_by_dagster(tmp_path):
    job, res, inst = _job(tmp_path)
    assert label_then_metrics(job.assets, job.keys, res, inst, KEYS[0], KEYS[-1])[0].success
    # A downstream on its own partitions reads the shards its mapping names (here: the last two).
    mapping = SpecificPartitionsPartitionMapping(KEYS[2:])

    @asset(partitions_def=StaticPartitionsDefinition(["second"]),
           ins={"labeled": AssetIn(key=job.keys["labeled_outputs"], partition_mapping=mapping)})
    def half(labeled: pa.Table) -> int:
        half.seen = labeled  # type: ignore[attr-defined]
        return labeled.num_rows

    assert materialize([*job.assets, half], selection=[half.key], partition_key="second", resources=res,
                       instance=inst).success
    assert sorted(half.seen.column("row_id").to_pylist()) == _rows_on_disk(job, job.current_version(), KEYS[2:])


def test_a_new_version_is_read_alone_once_it_has_a_commit(tmp_path):
    job, res, inst = _job(tmp_path)
    assert label_then_metrics(job.assets, job.keys, res, inst, KEYS[0], KEYS[-1])[0].success
    old = job.current_version()
    # The prompt changes: a new version; one partition of it committed makes it the current one.
    job2 = build_batch_assets(spec=make_spec(tmp_path, n=200, shards=4, user_template="Kind? {{ text }}"))
    assert label_then_metrics(job2.assets, job2.keys, res, inst, KEYS[0], KEYS[0])[0].success
    new = job2.current_version()
    assert new != old
    down = _all_rows(job2)
    assert materialize([*job2.assets, down], selection=[down.key], resources=res, instance=inst).success
    # Only the new version's one committed shard: not the old version's four, nor a mix.
    assert sorted(down.seen.column("row_id").to_pylist()) == _rows_on_disk(job2, new, [KEYS[0]])
    prompts = set(down.seen.column("prompt_key").to_pylist())
    assert prompts == set(pq.read_table(job2.home.labeled_path(new, KEYS[0])).column("prompt_key").to_pylist())
    assert not prompts & set(pq.read_table(job.home.labeled_path(old, KEYS[0])).column("prompt_key").to_pylist())


def test_the_other_assets_say_how_to_read_them(tmp_path):
    job, res, inst = _job(tmp_path)
    assert label_then_metrics(job.assets, job.keys, res, inst, KEYS[0], KEYS[-1])[0].success

    @asset(ins={"a": AssetIn(key=job.keys["analytics"])})
    def wrong(a: object) -> None:
        return None

    result = materialize([*job.assets, wrong], selection=[wrong.key], resources=res, instance=inst,
                         raise_on_error=False)
    message = str(result.get_step_failure_events()[0].event_specific_data.error)
    assert "deps=[...]" in message and "DuckDBResource" in message


def test_duckdb_resource_reads_the_views(tmp_path):
    dagster_duckdb = pytest.importorskip("dagster_duckdb")  # the dev extra installs it (Makefile)
    job, res, inst = _job(tmp_path)
    assert label_then_metrics(job.assets, job.keys, res, inst, KEYS[0], KEYS[-1])[0].success
    assert materialize(job.assets, selection=[job.keys["analytics"]], resources=res, instance=inst).success

    @asset(deps=[job.keys["analytics"]])
    def top_labels(duckdb: dagster_duckdb.DuckDBResource) -> dict:
        with duckdb.get_connection() as con:
            top_labels.seen = dict(con.execute("SELECT label, rows FROM label_distribution").fetchall())
            top_labels.runs = con.execute("SELECT count(*), sum(rows) FROM run_metrics").fetchone()
        return top_labels.seen

    duck = dagster_duckdb.DuckDBResource(database=job.duckdb_path)
    assert materialize([*job.assets, top_labels], selection=[top_labels.key], resources={**res, "duckdb": duck},
                       instance=inst).success
    table = job.read_outputs()
    expected = {}
    for out, err in zip(table.column("output").to_pylist(), table.column("error").to_pylist(), strict=True):
        if err is None:
            expected[out] = expected.get(out, 0) + 1
    assert top_labels.seen == expected and sum(expected.values()) > 0
    assert top_labels.runs == (4, 200)
    # The job's own next analytics run opens the file again: the resource left no lock behind.
    assert materialize(job.assets, selection=[job.keys["analytics"]], resources=res, instance=inst).success


def test_a_bucket_home_is_read_through_the_bucket_on_a_new_box(tmp_path, s3_bucket):
    url = f"s3://{s3_bucket}/jobs/things"
    job, res, inst = _job(tmp_path, home=url, cache_dir=str(tmp_path / "box-a"))
    assert label_then_metrics(job.assets, job.keys, res, inst, KEYS[0], KEYS[1])[0].success
    # A new box: an empty cache, the same bucket. Its downstream assets load what the bucket committed.
    box_b = build_batch_assets(spec=make_spec(tmp_path, n=200, shards=4, home=url, cache_dir=str(tmp_path / "box-b")))
    down, shard = _all_rows(box_b), _per_shard(box_b)
    assert materialize([*box_b.assets, down], selection=[down.key], resources=res, instance=inst).success
    version = job.current_version()
    assert sorted(down.seen.column("row_id").to_pylist()) == _rows_on_disk(job, version, KEYS[:2])
    assert materialize([*box_b.assets, shard], selection=[shard.key], partition_key=KEYS[0], resources=res,
                       instance=inst).success
    assert sorted(shard.seen[0].column("row_id").to_pylist()) == _rows_on_disk(job, version, [KEYS[0]])
    assert (tmp_path / "box-b").exists() and box_b.home.is_done(version, KEYS[0])  # pulled into box-b's cache
