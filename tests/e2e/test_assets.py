"""The Dagster assets end to end with a fake engine: partitions, gap filling, metrics, checks."""

import duckdb
import pyarrow.parquet as pq
from dagster import DagsterInstance, Definitions, materialize

from sparkbatch_dagster import build_batch_assets
from sparkbatch_dagster.cli.commands import RANGE_END, RANGE_START
from testkit import fake_resource, make_spec


def _setup(tmp_path, **kw):
    spec = make_spec(tmp_path, n=200, shards=4, **kw)
    job = build_batch_assets(spec=spec)
    res = {"vllm": fake_resource()[0]}
    inst = DagsterInstance.get()
    assert materialize(job.assets, selection=[job.keys["input_shards"]], resources=res, instance=inst).success
    return spec, job, res, inst


def _label(job, res, inst, start, end):
    """labeled_outputs, then run_metrics in its own run (as a backfill runs them)."""
    tags = {RANGE_START: start, RANGE_END: end}
    result = materialize(job.assets, selection=[job.keys["labeled_outputs"]], resources=res, instance=inst, tags=tags)
    if result.success:
        assert materialize(job.assets, selection=[job.keys["run_metrics"]], resources=res, instance=inst,
                           tags=tags).success
    return result


def test_partitions_are_registered_and_one_run_labels_them_all(tmp_path):
    spec, job, res, inst = _setup(tmp_path)
    keys = inst.get_dynamic_partitions(job.partitions_def.name)
    assert keys == ["shard-00000", "shard-00001", "shard-00002", "shard-00003"]
    assert _label(job, res, inst, keys[0], keys[-1]).success
    resource = res["vllm"]
    assert job.done_partitions(resource) == keys
    materialized = inst.get_materialized_partitions(job.keys["labeled_outputs"])
    assert materialized == set(keys)
    with duckdb.connect(str(job.home.metrics_db)) as con:
        assert con.execute("SELECT count(*), sum(rows) FROM run_metrics").fetchone() == (4, 200)


def test_done_partitions_are_never_recomputed_and_gaps_are_filled(tmp_path):
    spec, job, res, inst = _setup(tmp_path)
    keys = inst.get_dynamic_partitions(job.partitions_def.name)
    assert _label(job, res, inst, keys[0], keys[1]).success
    first = res["vllm"].get_engine().requests_seen
    assert first > 0
    # A run over all partitions computes only the two that are missing.
    res["vllm"], engine = fake_resource()
    result = _label(job, res, inst, keys[0], keys[-1])
    assert result.success
    mats = result.asset_materializations_for_node("things__labeled_outputs")
    assert [m.metadata["computed_in_this_run"].value for m in mats] == [False, False, True, True]
    done_before = {k: job.home.labeled_path(job.output_version(res["vllm"]), k).stat().st_mtime_ns for k in keys[:2]}
    assert engine.requests_seen > 0
    # Everything again: nothing is sent to the engine, no file is rewritten.
    res["vllm"], engine = fake_resource()
    assert _label(job, res, inst, keys[0], keys[-1]).success
    assert engine.requests_seen == 0
    version = job.output_version(res["vllm"])
    assert {k: job.home.labeled_path(version, k).stat().st_mtime_ns for k in keys[:2]} == done_before


def test_changed_prompt_is_a_new_version_and_never_mixes(tmp_path):
    spec, job, res, inst = _setup(tmp_path)
    keys = inst.get_dynamic_partitions(job.partitions_def.name)
    assert _label(job, res, inst, keys[0], keys[-1]).success
    old_version = job.output_version(res["vllm"])
    job2 = build_batch_assets(spec=make_spec(tmp_path, n=200, shards=4, user_template="Kind? {{ text }}"))
    new_version = job2.output_version(res["vllm"])
    assert new_version != old_version and job2.done_partitions(res["vllm"]) == []
    assert _label(job2, res, inst, keys[0], keys[-1]).success
    assert len(job.done_partitions(res["vllm"])) == 4  # the old version is still whole, separately


def test_error_rate_check_fails_the_partition_run(tmp_path):
    spec, job, res, inst = _setup(tmp_path, max_error_rate=0.1)
    res["vllm"] = fake_resource(answer="not a label")[0]
    result = _label(job, res, inst, "shard-00000", "shard-00000")
    evals = [e for e in result.get_asset_check_evaluations() if e.check_name == "error_rate"]
    assert len(evals) == 1 and evals[0].passed is False and evals[0].partition == "shard-00000"
    assert evals[0].metadata["error_rate"].value == 1.0


def test_analytics_reports_accuracy_and_distribution(tmp_path):
    spec, job, res, inst = _setup(tmp_path)
    keys = inst.get_dynamic_partitions(job.partitions_def.name)
    assert _label(job, res, inst, keys[0], keys[-1]).success
    result = materialize(job.assets, selection=[job.keys["analytics"]], resources=res, instance=inst)
    md = result.asset_materializations_for_node("things__analytics")[0].metadata
    assert md["rows"].value == 200 and md["errors"].value == 0
    # Accuracy from the files themselves: labeled rows against the input's gold column.
    version = job.output_version(res["vllm"])
    out = {r["row_id"]: r["output"] for k in keys for r in pq.read_table(job.home.labeled_path(version, k)).to_pylist()}
    gold = {r["id"]: r["gold"] for r in pq.read_table(spec.input).to_pylist()}
    expected = sum(out[i] == g for i, g in gold.items()) / 200
    assert md["accuracy"].value == round(expected, 4) and 0.1 < expected < 0.6  # the fake answers by hash
    with duckdb.connect(str(job.home.metrics_db)) as con:
        assert con.execute("SELECT sum(rows) FROM label_distribution").fetchone()[0] == 200


def test_definitions_load_with_the_fake_engine(tmp_path):
    spec = make_spec(tmp_path)
    job = build_batch_assets(spec=spec)
    defs = Definitions(assets=job.assets, resources={"vllm": fake_resource()[0]})
    repo = defs.get_repository_def()
    # input_shards, labeled_outputs, run_metrics, analytics, estimate; review_queue, human_labels
    assert {k.path[-1] for k in repo.assets_defs_by_key} == {"input_shards", "labeled_outputs", "run_metrics",
                                                             "analytics", "estimate", "review_queue", "human_labels"}
