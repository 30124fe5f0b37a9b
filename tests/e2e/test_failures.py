"""The tests of tests/unit/test_failures.py that start processes: the CLI, Dagster runs (their
log capture), servers, kills. That file says what they cover."""


from dagster import DagsterInstance, materialize

from sparkbatch_dagster import VLLMResource, build_batch_assets
from testkit import make_spec


def test_bad_model_fails_the_run_before_any_work(tmp_path):
    spec = make_spec(tmp_path)
    job = build_batch_assets(spec=spec)
    res = {"vllm": VLLMResource(model=str(tmp_path / "nope"))}
    inst = DagsterInstance.get()
    assert materialize(job.assets, selection=[job.keys["input_shards"]], resources=res, instance=inst).success
    result = materialize(job.assets, selection=[job.keys["labeled_outputs"]], resources=res, instance=inst,
                         partition_key="shard-00000", raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert "does not exist" in str(failure.event_specific_data.error)
    assert not (job.home.root / "out").exists() or not list((job.home.root / "out").rglob("part-*"))
