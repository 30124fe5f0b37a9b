"""The tests of tests/unit/test_resource_config.py that start processes: the CLI, Dagster runs (their
log capture), servers, kills. That file says what they cover."""

from __future__ import annotations

import pyarrow.parquet as pq
from dagster import DagsterInstance, materialize

from sparkbatch_dagster import build_batch_assets
from sparkbatch_dagster.cli.commands import RANGE_END, RANGE_START
from sparkbatch_dagster.testing import FakeVLLMResource
from testkit import make_spec


def test_the_fake_resource_labels_a_job_through_dagster(tmp_path):
    job = build_batch_assets(spec=make_spec(tmp_path, n=40, shards=2))
    res = {"vllm": FakeVLLMResource(answer="fruit")}
    inst = DagsterInstance.get()
    assert materialize(job.assets, selection=[job.keys["input_shards"]], resources=res, instance=inst).success
    keys = inst.get_dynamic_partitions(job.partitions_def.name)
    assert materialize(job.assets, selection=[job.keys["labeled_outputs"]], resources=res, instance=inst,
                       tags={RANGE_START: keys[0], RANGE_END: keys[-1]}).success
    version = job.output_version(res["vllm"])
    rows = [r for k in keys for r in pq.read_table(job.home.labeled_path(version, k)).to_pylist()]
    assert len(rows) == 40 and {r["output"] for r in rows} == {"fruit"}
    assert {r["model"] for r in rows} == {res["vllm"].model_identity()}
