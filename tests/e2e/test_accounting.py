"""The tests of tests/unit/test_accounting.py that start processes: the CLI, Dagster runs (their
log capture), servers, kills. That file says what they cover."""

import errno
import json
from pathlib import Path

import pytest
from dagster import DagsterInstance, materialize

from sparkbatch_dagster import OutputSpec, SamplingSpec, SparkbatchError, build_batch_assets
from sparkbatch_dagster.cli.commands import RANGE_END, RANGE_START, status
from sparkbatch_dagster.run import attempts, metrics
from sparkbatch_dagster.testing import FakeVLLMResource
from testkit import fake_resource, label_then_metrics, make_spec


def _run_all(job, res, inst=None):
    inst = inst or DagsterInstance.get()
    assert materialize(job.assets, selection=[job.keys["input_shards"]], resources=res, instance=inst).success
    keys = inst.get_dynamic_partitions(job.partitions_def.name)
    return label_then_metrics(job.assets, job.keys, res, inst, keys[0], keys[-1])


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


# --- no read ever deletes ------------------------------------------------------------------


def test_a_read_error_fails_status_naming_the_file_and_removes_nothing(tmp_path, monkeypatch):
    job = build_batch_assets(spec=make_spec(tmp_path, n=40, shards=2))
    res, _ = fake_resource()
    labeled, measured = _run_all(job, {"vllm": res})
    assert labeled.success and measured.success
    version = job.output_version(res)
    stats = job.home.stats_path(version, "shard-00001")
    before = _files(job.home.root)
    real_read = Path.read_text

    def flaky(self, *a, **kw):
        if self == stats:  # shared storage away for a moment: an I/O error, not a broken file
            raise OSError(errno.EIO, "Input/output error", str(self))
        return real_read(self, *a, **kw)

    monkeypatch.setattr(Path, "read_text", flaky)
    readers = (lambda: status(job, res), lambda: job.done_partitions(res), job.read_outputs,  # status: the CLI's
               lambda: metrics.committed_stats(job.home, version))
    for read in readers:
        with pytest.raises(SparkbatchError, match=r"cannot read .*shard-00001\.json .*Input/output error"):
            read()
    monkeypatch.setattr(Path, "read_text", real_read)
    assert _files(job.home.root) == before
    assert len(job.done_partitions(res)) == 2


def test_a_broken_commit_is_kept_by_readers_set_aside_by_the_run_and_recomputed_from_the_store(tmp_path):
    job = build_batch_assets(spec=make_spec(tmp_path, n=40, shards=2))
    res, engine = fake_resource()
    assert all(r.success for r in _run_all(job, {"vllm": res}))
    version = job.output_version(res)
    answers = lambda: sorted((r["row_id"], r["output"], r["error"]) for r in job.read_outputs().to_pylist())  # noqa: E731
    before = answers()
    stats = job.home.stats_path(version, "shard-00000")
    stats.write_text("")  # zero bytes, as after a power loss of the disk
    labeled = job.home.labeled_path(version, "shard-00000")
    assert job.done_partitions(res) == ["shard-00001"]  # status: not done...
    assert labeled.exists() and stats.exists()  # ...and nothing removed
    assert job.home.broken(version, "shard-00000").startswith("shard-00000.json")
    res, engine = fake_resource()
    assert all(r.success for r in _run_all(job, {"vllm": res}))
    assert engine.requests_seen == 0  # its answers came from the result store
    aside = sorted(p.name for p in labeled.parent.parent.rglob("*.broken-*"))
    assert [n.split(".broken-")[0] for n in aside] == ["shard-00000.json", "shard-00000.parquet"]
    assert answers() == before


def test_truncation_reaches_the_partitions_metadata_run_metrics_and_the_log(tmp_path):
    spec = make_spec(tmp_path, n=30, shards=2, output=OutputSpec(kind="text"), sampling=SamplingSpec(max_tokens=2))
    job = build_batch_assets(spec=spec)
    res = FakeVLLMResource(answer="one two three")
    labeled, measured = _run_all(job, {"vllm": res})
    assert labeled.success and measured.success
    mats = labeled.asset_materializations_for_node("things__labeled_outputs")
    assert sum(m.metadata["truncated_rows"].value for m in mats) == 30
    logs = [e.user_message for e in DagsterInstance.get().all_logs(labeled.run_id)]
    assert any("30 answers hit max_tokens=2" in m or "answers hit max_tokens=2" in m for m in logs)
    assert any("raise sampling.max_tokens" in m for m in logs)
    with metrics.connect(job.home.metrics_db) as con:
        assert con.execute("SELECT sum(truncated_rows) FROM run_metrics").fetchone()[0] == 30


# --- downstream reads what was committed -----------------------------------------------------


def test_a_failed_run_under_new_settings_leaves_downstream_on_the_committed_version(tmp_path):
    job = build_batch_assets(spec=make_spec(tmp_path, n=40, shards=2))
    res, _ = fake_resource()
    assert all(r.success for r in _run_all(job, {"vllm": res}))
    first = job.current_version()
    rows = job.read_outputs().num_rows
    other = FakeVLLMResource(answer="fruit", fail_after=0)  # another model identity, dead at once
    inst = DagsterInstance.get()
    keys = inst.get_dynamic_partitions(job.partitions_def.name)
    tags = {RANGE_START: keys[0], RANGE_END: keys[-1]}
    labeled = materialize(job.assets, selection=[job.keys["labeled_outputs"]], resources={"vllm": other},
                          instance=inst, tags=tags, raise_on_error=False)
    assert not labeled.success
    assert materialize(job.assets, selection=[job.keys["analytics"]], resources={"vllm": other}, instance=inst).success
    with metrics.connect(job.home.metrics_db) as con:  # analytics is still the committed version's
        assert con.execute("SELECT count(*) FROM labeled").fetchone()[0] == 40
    assert job.current_version() == first and job.read_outputs().num_rows == rows == 40
    assert json.loads(job.home.current_path.read_text())["version"] == first


# --- every attempt billed -------------------------------------------------------------------


def test_a_failed_attempt_is_billed_and_the_rerun_shows_what_it_wasted(tmp_path):
    job = build_batch_assets(spec=make_spec(tmp_path, n=40, shards=2))
    inst = DagsterInstance.get()
    assert materialize(job.assets, selection=[job.keys["input_shards"]], resources={"vllm": FakeVLLMResource()},
                       instance=inst).success
    keys = inst.get_dynamic_partitions(job.partitions_def.name)
    tags = {RANGE_START: keys[0], RANGE_END: keys[-1]}
    dying = FakeVLLMResource(delay_s=0.02, fail_after=5)  # the engine dies before any shard commits
    failed = materialize(job.assets, selection=[job.keys["labeled_outputs"]], resources={"vllm": dying},
                         instance=inst, tags=tags, raise_on_error=False)
    assert not failed.success
    version = job.output_version(dying)
    [first] = attempts.load(job.home, version)
    assert first.outcome == "failed" and "fake engine died after 5 requests" in first.error
    assert first.run_id == failed.run_id and first.prompts_generated == 5 and first.rows_committed == 0
    assert first.cost_usd > 0 and first.wasted_usd == first.cost_usd  # paid, and nothing to show
    labeled, measured = label_then_metrics(job.assets, job.keys, {"vllm": FakeVLLMResource()}, inst, keys[0], keys[-1])
    assert labeled.success and measured.success
    records = attempts.load(job.home, version)
    assert [r.outcome for r in records] == ["failed", "succeeded"]
    assert records[1].rows_committed == 40 and records[1].partitions_committed == 2
    assert records[1].committed_cost_usd <= records[1].cost_usd
    md = measured.asset_materializations_for_node("things__run_metrics")[-1].metadata
    assert md["job_attempts"].value == 2 and md["job_wasted_usd"].value >= first.wasted_usd
    with metrics.connect(job.home.metrics_db) as con:
        rows = con.execute("SELECT outcome, rows_committed FROM attempts ORDER BY started").fetchall()
    assert rows == [("failed", 0), ("succeeded", 40)]
