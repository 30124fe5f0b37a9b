"""The Dagster layer as the UI sees it: one materialization per partition as its shard commits,
with that partition's own numbers and checks; reruns record reused partitions at cost 0; a
crash leaves the instance agreeing with the disk; bad partition keys stop before any engine."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetCheckSeverity,
    DagsterEventType,
    DagsterInstance,
    EventRecordsFilter,
    materialize,
)

from sparkbatch_dagster import build_batch_assets
from sparkbatch_dagster.definitions.events import ERROR_RATE, EXACTLY_ONCE
from sparkbatch_dagster.errors import SparkbatchError
from sparkbatch_dagster.testing import FakeVLLMResource
from testkit import make_spec

RANGE = ("dagster/asset_partition_range_start", "dagster/asset_partition_range_end")


def _setup(tmp_path, n=90, shards=3, **fake):
    spec = make_spec(tmp_path, n=n, shards=shards)
    job = build_batch_assets(spec=spec)
    inst = DagsterInstance.get()
    res = {"vllm": FakeVLLMResource(**fake)}
    materialize([job.assets[0]], instance=inst, resources=res)
    keys = sorted(inst.get_dynamic_partitions(job.partitions_def.name))
    return job, inst, res, keys


def _label(job, inst, res, keys, **kw):
    return materialize([job.assets[1]], instance=inst, resources=res,
                       tags={RANGE[0]: keys[0], RANGE[1]: keys[-1]}, **kw)


def _materializations(inst, key):
    records = inst.fetch_materializations(key, limit=1000).records
    return sorted(records, key=lambda r: r.storage_id)


def test_each_partition_materializes_as_it_commits_with_its_own_numbers(tmp_path):
    job, inst, res, keys = _setup(tmp_path, delay_s=0.01)
    result = _label(job, inst, res, keys)
    assert result.success
    recs = _materializations(inst, job.keys["labeled_outputs"])
    assert [r.partition_key for r in recs] == keys  # one event per partition, no end-of-run duplicates
    md = [r.asset_materialization.metadata for r in recs]
    rows = [m["rows"].value for m in md]
    assert sum(rows) == 90 and len(set(rows)) > 1  # each partition's own rows, not the run's total
    for k, m in zip(keys, md, strict=True):
        stats = job.home.stats_path(m["version"].value, k)
        assert pq.read_metadata(job.home.labeled_path(m["version"].value, k)).num_rows == m["rows"].value
        assert stats.exists() and m["computed_in_this_run"].value is True
    # As it commits: each event was stored before the next shard's was (the events of one run
    # arrive in commit order, interleaved with the run's own log lines).
    logs = inst.all_logs(result.run_id)
    order = [e.dagster_event.event_type for e in logs if e.dagster_event and e.dagster_event.event_type in
             (DagsterEventType.ASSET_MATERIALIZATION, DagsterEventType.ASSET_CHECK_EVALUATION)]
    assert order == [DagsterEventType.ASSET_MATERIALIZATION, DagsterEventType.ASSET_CHECK_EVALUATION,
                     DagsterEventType.ASSET_CHECK_EVALUATION] * 3
    committed_lines = [e.user_message for e in logs if "committed:" in (e.user_message or "")]
    assert len(committed_lines) == 3
    for name in (EXACTLY_ONCE, ERROR_RATE):
        hist = inst.event_log_storage.get_asset_check_execution_history(
            AssetCheckKey(job.keys["labeled_outputs"], name), limit=10)
        parts = sorted(h.event.dagster_event.event_specific_data.partition for h in hist)
        assert parts == keys and all(h.status.value == "SUCCEEDED" for h in hist)


def test_a_rerun_records_reused_partitions_at_zero_cost(tmp_path):
    job, inst, res, keys = _setup(tmp_path)
    _label(job, inst, res, keys)
    first = _materializations(inst, job.keys["labeled_outputs"])
    _label(job, inst, res, keys)
    recs = _materializations(inst, job.keys["labeled_outputs"])
    again = recs[len(first):]
    assert [r.partition_key for r in again] == keys
    for r in again:
        md = r.asset_materialization.metadata
        assert md["computed_in_this_run"].value is False and md["cost_usd"].value == 0.0
        assert md["generated_requests"].value == 0 and md["reused_rows"].value == md["rows"].value
    bill = sum(r.asset_materialization.metadata["cost_usd"].value for r in recs)
    assert bill == pytest.approx(sum(r.asset_materialization.metadata["cost_usd"].value for r in first))


def test_a_crash_leaves_the_instance_agreeing_with_the_disk(tmp_path):
    job, inst, res, keys = _setup(tmp_path, n=90, shards=3, fail_after=50)
    result = _label(job, inst, res, keys, raise_on_error=False)
    assert not result.success
    version = job.current_version()
    on_disk = [k for k in keys if job.home.is_done(version, k)]
    assert 0 < len(on_disk) < 3
    assert inst.get_materialized_partitions(job.keys["labeled_outputs"]) == set(on_disk)


def test_a_partition_key_not_in_the_manifest_stops_before_the_engine(tmp_path):
    job, inst, res, keys = _setup(tmp_path, fail_after=0)  # a started engine would fail differently
    inst.add_dynamic_partitions(job.partitions_def.name, ["shard-99999"])
    with pytest.raises(SparkbatchError, match=r"shard-99999.*not shards of.*materialize .*input_shards"):
        materialize([job.assets[1]], instance=inst, resources=res, partition_key="shard-99999")


def test_downstream_assets_need_no_engine_and_follow_automatically(tmp_path):
    job, inst, res, keys = _setup(tmp_path)
    _label(job, inst, res, keys)
    run_metrics, analytics = job.assets[2], job.assets[3]
    assert "vllm" not in run_metrics.required_resource_keys | analytics.required_resource_keys
    for a in (run_metrics, analytics):
        assert a.automation_conditions_by_key[a.key] is not None
    result = materialize([run_metrics], instance=inst, tags={RANGE[0]: keys[0], RANGE[1]: keys[-1]})
    recs = _materializations(inst, job.keys["run_metrics"])
    assert sorted(r.partition_key for r in recs) == keys
    assert len({r.asset_materialization.metadata["rows"].value for r in recs}) > 1  # per partition
    assert result.success and materialize([analytics], instance=inst).success
    table = job.read_outputs()
    assert table.num_rows == 90 and set(table.column("row_id").to_pylist()) == {f"id-{i:05d}" for i in range(90)}


def test_analytics_is_not_built_on_a_failed_blocking_check(tmp_path):
    job, inst, res, keys = _setup(tmp_path)
    _label(job, inst, res, keys)
    inst.report_runless_asset_event(AssetCheckEvaluation(
        asset_key=job.keys["labeled_outputs"], check_name=EXACTLY_ONCE, passed=False, partition=keys[1],
        metadata={}, severity=AssetCheckSeverity.ERROR, blocking=True))
    with pytest.raises(SparkbatchError, match=rf"{keys[1]}.*{EXACTLY_ONCE}"):
        materialize([job.assets[3]], instance=inst)
    _label(job, inst, res, keys)  # the rerun checks the partition again from disk: it passes
    assert materialize([job.assets[3]], instance=inst).success


def test_a_model_switch_changes_the_code_version_and_pool(tmp_path):
    spec = make_spec(tmp_path)
    a = build_batch_assets(spec=spec, resource=FakeVLLMResource(model="a"))
    b = build_batch_assets(spec=spec, resource=FakeVLLMResource(model="b"))
    key = a.keys["labeled_outputs"]
    assert a.assets[1].code_versions_by_key[key] != b.assets[1].code_versions_by_key[key]
    assert build_batch_assets(spec=spec, pool=None).assets[1].op.pool is None
    assert a.assets[1].op.pool == "gpu" and a.assets[4].op.pool == "gpu"


def test_the_model_code_version_is_on_each_materialization(tmp_path):
    job, inst, res, keys = _setup(tmp_path)
    _label(job, inst, res, keys)
    key = job.keys["labeled_outputs"]
    for r in _materializations(inst, key):
        tags = r.asset_materialization.tags
        assert tags["dagster/code_version"] == job.assets[1].code_versions_by_key[key]
        assert tags["dagster/data_version"]
    assert inst.get_event_records(EventRecordsFilter(DagsterEventType.ASSET_MATERIALIZATION, asset_key=key))


def test_a_model_switch_shows_the_labeled_partitions_stale(tmp_path):
    from dagster import Definitions
    from dagster._core.definitions.data_version import CachingStaleStatusResolver, StaleStatus
    from dagster._core.loader import LoadingContextForTest

    spec = make_spec(tmp_path, n=30, shards=2)
    inst = DagsterInstance.get()
    res = FakeVLLMResource(model="a")
    job = build_batch_assets(spec=spec, resource=res)
    materialize([job.assets[0]], instance=inst, resources={"vllm": res})
    keys = sorted(inst.get_dynamic_partitions(job.partitions_def.name))
    _label(job, inst, {"vllm": res}, keys)
    materialize([job.assets[0]], instance=inst, resources={"vllm": res})  # same input: same data version

    def status(model: str) -> tuple[StaleStatus, list[str]]:
        other = FakeVLLMResource(model=model)
        defs = Definitions(assets=build_batch_assets(spec=spec, resource=other).assets, resources={"vllm": other})
        resolver = CachingStaleStatusResolver(inst, defs.get_repository_def().asset_graph, LoadingContextForTest(inst))
        key = job.keys["labeled_outputs"]
        return resolver.get_status(key, keys[0]), [str(c.reason) for c in resolver.get_stale_causes(key, keys[0])]

    assert status("a") == (StaleStatus.FRESH, [])
    assert status("b") == (StaleStatus.STALE, ["has a new code version"])


def test_labeled_outputs_and_run_metrics_never_share_a_run(tmp_path):
    from dagster import BackfillPolicy

    spec = make_spec(tmp_path)
    for policy in (None, BackfillPolicy.multi_run(1), BackfillPolicy.multi_run(1000)):
        job = build_batch_assets(spec=spec, backfill_policy=policy)
        labeled, metrics = job.assets[1].backfill_policy, job.assets[2].backfill_policy
        assert labeled == (policy or BackfillPolicy.single_run()) and metrics != labeled


def test_run_metrics_and_analytics_follow_new_labeled_partitions_by_themselves(tmp_path):
    from dagster import Definitions, evaluate_automation_conditions

    job, inst, res, keys = _setup(tmp_path)
    defs = Definitions(assets=job.assets, resources=res)
    result = evaluate_automation_conditions(defs, inst)  # the daemon's first tick: nothing new yet
    assert result.total_requested == 0
    _label(job, inst, res, keys[:2])  # two partitions land
    result = evaluate_automation_conditions(defs, inst, cursor=result.cursor)
    assert set(result.get_requested_partitions(job.keys["run_metrics"])) == set(keys[:2])
    assert result.get_num_requested(job.keys["labeled_outputs"]) == 0  # the GPU is never rented by itself
    assert result.get_num_requested(job.keys["estimate"]) == 0
    metrics_tags = {RANGE[0]: keys[0], RANGE[1]: keys[1]}
    assert materialize([job.assets[2]], instance=inst, tags=metrics_tags).success
    _label(job, inst, res, keys[2:])
    assert materialize([job.assets[2]], instance=inst, tags={RANGE[0]: keys[2], RANGE[1]: keys[-1]}).success
    result = evaluate_automation_conditions(defs, inst, cursor=result.cursor)
    assert result.get_num_requested(job.keys["analytics"]) == 1  # every partition labeled and measured
