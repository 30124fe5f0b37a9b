"""The tests of tests/unit/test_engine_identity.py that start processes: the CLI, Dagster runs (their
log capture), servers, kills. That file says what they cover."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance, materialize

from sparkbatch_dagster import build_batch_assets
from sparkbatch_dagster.cli.commands import RANGE_END, RANGE_START
from sparkbatch_dagster.engines.platform import model
from sparkbatch_dagster.testing import FakeVLLMResource
from testkit import make_spec
from unit.test_engine_identity import model_folder, new_weights


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKBATCH_CACHE_DIR", str(tmp_path / "cache"))
    model._identity.cache_clear()


def _label(job, res, inst):
    assert materialize(job.assets, selection=[job.keys["input_shards"]], resources=res, instance=inst).success
    keys = sorted(inst.get_dynamic_partitions(job.partitions_def.name))
    result = materialize(job.assets, selection=[job.keys["labeled_outputs"]], resources=res, instance=inst,
                         tags={RANGE_START: keys[0], RANGE_END: keys[-1]}, raise_on_error=False)
    return result, keys


def test_rows_of_new_weights_come_from_an_engine_of_new_weights_with_keep_warm(tmp_path):
    """The break: a warm engine keyed by settings alone answered under the new identity."""
    folder = model_folder(tmp_path)
    job = build_batch_assets(spec=make_spec(tmp_path, n=30, shards=2))
    res = FakeVLLMResource(model=str(folder), keep_warm=True)
    res.shutdown()
    inst = DagsterInstance.get()
    try:
        first, keys = _label(job, {"vllm": res}, inst)
        assert first.success
        old = res.get_engine()  # the warm engine that labeled the first version
        res.close()
        answered = old.requests_seen
        old_version = job.output_version(res)
        new_weights(folder)
        second, _ = _label(job, {"vllm": res}, inst)
        assert second.success
        version = job.output_version(res)
        assert version != old_version
        rows = [r for k in keys for r in pq.read_table(job.home.labeled_path(version, k)).to_pylist()]
        assert len(rows) == 30 and {r["model"] for r in rows} == {res.model_identity()}
        assert old.requests_seen == answered and old.closed  # not one answer from the old weights
        new = res.get_engine()
        assert new is not old and new.model_id == res.model_identity() and new.requests_seen > 0
    finally:
        res.shutdown()


class _WeightsCopiedDuringStart(FakeVLLMResource):
    """New weights land after the run computed its identity, before its engine loads them (as
    when a copy finishes while the run waits for the GPU)."""

    def _start(self):  # type: ignore[no-untyped-def]
        new_weights(Path(str(self.model)))
        return super()._start()


def test_weights_changed_between_the_identity_and_the_start_stop_the_run_with_nothing_stored(tmp_path):
    folder = model_folder(tmp_path)
    job = build_batch_assets(spec=make_spec(tmp_path, n=30, shards=2))
    res = _WeightsCopiedDuringStart(model=str(folder))
    before = res.model_identity()
    result, keys = _label(job, {"vllm": res}, DagsterInstance.get())
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    message = failure.step_failure_data.error.to_string()  # the EngineError is its cause
    assert f"labels as {before}" in message and "Run again" in message
    assert job.home.read_current() is None  # no version got a committed partition
    written = [p for p in tmp_path.rglob("*.parquet") if "shards" not in p.parts and p.parent.name != "in"]
    assert written == [], written  # no row, no part file, no stored answer
