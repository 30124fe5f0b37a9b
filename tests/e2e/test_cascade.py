"""The tests of tests/unit/test_cascade.py that start processes: the CLI, Dagster runs (their
log capture), servers, kills. That file says what they cover."""


import pyarrow.parquet as pq
from dagster import DagsterInstance, materialize

from sparkbatch_dagster import build_batch_assets
from sparkbatch_dagster.testing import FakeVLLMResource
from testkit import label_then_metrics, make_spec
from unit.test_cascade import CASCADE


def _run(tmp_path, cascade, n=60, shards=2, trace=None):
    spec = make_spec(tmp_path, n=n, shards=shards, cascade=cascade)
    res = {"vllm": FakeVLLMResource(model="small", trace_path=str(trace) if trace else None)}
    job = build_batch_assets(spec=spec)
    inst = DagsterInstance.get()
    assert materialize(job.assets, selection=[job.keys["input_shards"]], resources=res, instance=inst).success
    keys = inst.get_dynamic_partitions(job.partitions_def.name)
    labeled, _ = label_then_metrics(job.assets, job.keys, res, inst, keys[0], keys[-1])
    assert labeled.success
    version = job.output_version(res["vllm"])
    rows = {r["row_id"]: r for k in keys for r in pq.read_table(job.home.labeled_path(version, k)).to_pylist()}
    return job, res["vllm"], version, rows, labeled


def _alone(tmp_path, model, n=60):
    """Every row's answer from ``model`` alone (no cascade)."""
    spec = make_spec(tmp_path / model, n=n, shards=1)
    res = {"vllm": FakeVLLMResource(model=model)}
    job = build_batch_assets(spec=spec)
    inst = DagsterInstance.get()
    assert materialize(job.assets, selection=[job.keys["input_shards"]], resources=res, instance=inst).success
    keys = inst.get_dynamic_partitions(job.partitions_def.name)
    assert materialize(job.assets, selection=[job.keys["labeled_outputs"]], resources=res, instance=inst,
                       partition_key=keys[0]).success
    return {r["row_id"]: r for r in job.read_outputs().to_pylist()}


def test_rows_the_first_model_is_unsure_of_are_answered_by_the_next(tmp_path):
    job, res, version, rows, labeled = _run(tmp_path / "c", CASCADE)
    small, big = _alone(tmp_path, "small"), _alone(tmp_path, "big")
    assert len(rows) == 60  # every row once
    sure = {k for k, r in small.items() if r["confidence"] >= 0.5}
    assert 0 < len(sure) < 60  # some of each: the hash spreads confidences over (0, 1]
    for k, r in rows.items():
        want = small[k] if k in sure else big[k]
        assert (r["model"], r["confidence"], r["output"]) == (want["model"], want["confidence"], want["output"])
        if k not in sure and not r["deduplicated"]:  # what the row cost: both stages' tokens
            assert r["output_tokens"] == small[k]["output_tokens"] + big[k]["output_tokens"]
    assert {r["model"] for r in rows.values()} == {"small", "big"}
    md = [m.metadata for m in labeled.asset_materializations_for_node("things__labeled_outputs")]
    assert {m["model"].value for m in md} == {"cascade(small<0.5, big)"}  # the version's identity
    prompts = {name: len({r["prompt_key"] for r in rows.values() if r["model"] == name}) for name in ("small", "big")}
    logs = [e.user_message for e in DagsterInstance.get().all_logs(labeled.run_id)]
    assert f"cascade: rows answered in this run, by stage: small {prompts['small']}, big {prompts['big']}" in logs


def test_a_rerun_asks_nothing_and_a_new_last_stage_only_the_escalated_rows(tmp_path):
    trace = tmp_path / "trace"
    _, _, first, rows, _ = _run(tmp_path, CASCADE, trace=trace)
    escalated = sum(1 for r in rows.values() if r["model"] == "big" and not r["deduplicated"])
    asked = len(trace.read_text().split())
    _, _, again, _, _ = _run(tmp_path, CASCADE, trace=trace)
    assert again == first and len(trace.read_text().split()) == asked  # done: nothing asked

    _, _, other, rows2, _ = _run(tmp_path, [{"below": 0.5}, {"model": "bigger"}], trace=trace)
    assert other != first  # another cascade, another output version
    # The first stage's answers came from its store: only the escalated prompts were asked, of the new stage.
    assert len(trace.read_text().split()) - asked == escalated
    assert {r["model"] for r in rows2.values()} == {"small", "bigger"}
