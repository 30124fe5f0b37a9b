"""A cascade of models (``JobSpec.cascade``): the first stage answers every row, the rows it is
unsure of go to the next. Fake engines here (their confidence a hash of model and prompt); the
real engines (SmolLM2 then Gemma 3 270M) in test_cascade_real.py."""


import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance, materialize

from testkit import label_defs_yaml, label_then_metrics, make_rows, make_spec, one_shard, yaml_job_spec
from sparkbatch_dagster import ConfigError, EngineError, build_batch_assets
from sparkbatch_dagster.engines import FakeEngine
from sparkbatch_dagster.run.cascade import CascadeEngine, Stage
from sparkbatch_dagster.run.result_store import open_store
from sparkbatch_dagster.run.runner import label_shard
from sparkbatch_dagster.testing import FakeVLLMResource

CASCADE = [{"below": 0.5}, {"model": "big"}]


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


def test_a_crash_in_a_later_stage_resumes_without_asking_the_first_again(tmp_path):
    spec, home = one_shard(tmp_path, make_rows(40), cascade=CASCADE, checkpoint_rows=1)
    version = "00000000000000ca"

    def engine(big: FakeEngine) -> tuple[CascadeEngine, FakeEngine]:
        small = FakeEngine("small")
        stages = [Stage("small", lambda: small, lambda: None, 0.5, open_store(spec, home, "small")),
                  Stage("big", lambda: big, lambda: None, None, open_store(spec, home, "big"))]
        return CascadeEngine("cascade(small<0.5, big)", stages, spec), small

    broken, small = engine(FakeEngine("big", fail_after=3))
    with pytest.raises(EngineError):
        label_shard(spec, home, version, "shard-00000", broken)
    assert small.requests_seen > 0
    healed, small = engine(FakeEngine("big"))
    stats = label_shard(spec, home, version, "shard-00000", healed)
    assert small.requests_seen == 0  # its answers were stored as it gave them
    assert stats["rows"] == 40 and stats["resumed_rows"] > 0
    out = pq.read_table(home.labeled_path(version, "shard-00000")).to_pylist()
    assert sorted(r["row_id"] for r in out) == sorted(r["id"] for r in make_rows(40))  # each row once
    assert all(r["model"] == "big" or r["confidence"] >= 0.5 for r in out)


@pytest.mark.parametrize("cascade, says", [
    ([{"below": 0.5}], "one stage"),
    ([{"model": "a"}, {"model": "b"}], "below=None"),
    ([{"below": 0.5}, {"model": "b", "below": 0.2}], "nothing comes after it"),
    ([{"below": 1.5}, {"model": "b"}], "0 < below <= 1"),
    ([{"below": 0.5}, {"below": 0.5}, {}], "more than one"),
])
def test_a_wrong_cascade_stops_with_what_to_fix(tmp_path, cascade, says):
    with pytest.raises(ConfigError, match=says):
        make_spec(tmp_path, cascade=cascade)


def test_free_text_cannot_cascade(tmp_path):
    with pytest.raises(ConfigError, match="confidence"):
        make_spec(tmp_path, cascade=CASCADE, output={"kind": "text"})


def test_a_cascade_needs_the_confidence_on(tmp_path):
    with pytest.raises(ConfigError, match="output.confidence=True"):
        make_spec(tmp_path, cascade=CASCADE, output={"kind": "label", "labels": ["a", "b"], "confidence": False})


def test_a_cascade_travels_from_a_defs_yaml(tmp_path):
    text = label_defs_yaml(tmp_path, """\
        cascade:
          - below: 0.8
          - model: gemma-3-270m@quantization=fp8
    """)
    first, second = yaml_job_spec(text).cascade
    assert first.model is None and first.below == 0.8
    assert second.candidate().model == "gemma-3-270m" and second.candidate().engine_kwargs == {"quantization": "fp8"}


def test_shards_commit_as_the_run_goes_not_at_its_end(tmp_path):
    """Rounds of requests go through both stages in turn: the first shard is committed (and billed)
    before the first stage has seen the last shard's rows."""
    from sparkbatch_dagster.home import JobHome
    from sparkbatch_dagster.inputs.shards import build_shards
    from sparkbatch_dagster.run.runner import ShardRun

    spec = make_spec(tmp_path, n=80, shards=4, cascade=CASCADE)
    home = JobHome(spec.home_path)
    keys = build_shards(spec, home)["keys"]
    small, big = FakeEngine("small"), FakeEngine("big")
    stages = [Stage("small", lambda: small, lambda: None, 0.5), Stage("big", lambda: big, lambda: None, None)]
    engine = CascadeEngine("cascade(small<0.5, big)", stages, spec)
    engine.round = 10
    seen_at_commit = [small.requests_seen for _ in ShardRun(spec, home, "00000000000000cb", engine).stream(keys)]
    assert len(seen_at_commit) == 4 and seen_at_commit[0] < seen_at_commit[-1]
    assert big.requests_seen > 0  # and the second stage answered along the way
