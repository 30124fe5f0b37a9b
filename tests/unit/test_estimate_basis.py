"""Where each price's speed comes from (measured / projected / unknown), the roofline projection,
--hourly-rate's 'this machine', and precisions as candidates (parsed, sized, listed when this
platform cannot run them). The fake engine; machines are simulated by naming their kind."""

import json

import pytest

from sparkbatch_dagster import ConfigError
from sparkbatch_dagster.estimate.choice import advise, choose
from sparkbatch_dagster.estimate.forecast import predict
from sparkbatch_dagster.estimate.machine import Machine, cannot_run, kind_of_gpu, sample_machine
from sparkbatch_dagster.estimate.roofline import ModelShape, Workload, model_shape, project
from sparkbatch_dagster.estimate.sample import Sample, Timing
from sparkbatch_dagster.inputs.shards import build_shards
from sparkbatch_dagster.spec import PRESETS, THIS_MACHINE, EstimateSpec, ModelCandidate, NodeOption
from sparkbatch_dagster.testing import FakeVLLMResource
from testkit import make_spec

CPU = Machine("cpu", "2-core x86_64 CPU")
SAMPLE = Sample(rows=[{}] * 50, warmup=[], total_rows=10_000, distinct_prompts=10_000)
TIMING = Timing(model="m@1", engine_start_s=60.0, seconds=10.0, rows=50, prompt_tokens=10_000, output_tokens=400,
                errors=0, correct=25, requests=50)
SHAPE_1B = ModelShape(params=1e9, bytes_per_param=2.0, kv_bytes_per_token=32768)


def test_the_roofline_on_a_hand_computed_case():
    # 1,000 requests x (200 prompt + 8 output tokens), 1B params in bf16, 32 KiB of KV per token, one H200.
    p = project(Workload(1000, 200_000, 8_000, 1024), SHAPE_1B, PRESETS["h200"])
    assert p.prefill_s == pytest.approx(2e9 * 2e5 / 989e12)  # 0.404 s: compute-bound
    # 1,000 sequences at once (fewer requests than max_num_seqs), 8 steps; a step reads 2 GB of weights
    # + 1,000 x 204 x 32 KiB of KV (1.81 ms at 4.8 TB/s) but computes 2e12 FLOPs (2.02 ms): compute wins.
    assert p.concurrency == 1000
    assert p.decode_s == pytest.approx(8 * 2e9 * 1000 / 989e12)
    peak = 2e9 * 2e5 / 989e12 + 8 * 2e9 * 1000 / 989e12
    assert (p.low_s, p.high_s) == (pytest.approx(peak / 0.8), pytest.approx(peak / 0.3))
    # Long outputs on a bandwidth-poor Spark: the step reads more than it computes, and the slow
    # end takes the Spark's low bf16 figure.
    spark = project(Workload(1000, 200_000, 128_000, 1024), SHAPE_1B, PRESETS["dgx-spark"])
    read = (2e9 + 1000 * (200 + 64) * 32768) / 273e9
    assert spark.decode_s == pytest.approx(128 * read)
    assert spark.high_s == pytest.approx((2e9 * 2e5 / 62e12 + 128 * read) / 0.3)


def test_the_kv_cache_caps_the_concurrency_a_projection_assumes():
    huge = ModelShape(params=1e9, bytes_per_param=2.0, kv_bytes_per_token=1e6)  # 1 MB a token
    p = project(Workload(1000, 1_000_000, 100_000, 1024), huge, PRESETS["h200"])
    assert p.concurrency == int((141e9 * 0.9 - 2e9) / (1e6 * 1100))  # 113 sequences of 1,100 tokens fit


def test_on_the_cpu_spark_prices_are_projected_never_cpu_time_at_a_sparks_rate():
    p = predict(SAMPLE, TIMING, EstimateSpec().options, 2.0, machine=CPU, shape=SHAPE_1B, concurrency=1024)
    one, two = p.options
    assert one.speed_basis == two.speed_basis == "projected" and one.hardware == "DGX Spark (GB10)"
    cpu_price = 0.79 * (p.predicted_wall_s + 60) / 3600
    assert one.cost_usd != pytest.approx(cpu_price, rel=0.05)
    proj = project(Workload(10_000, 2_000_000, 80_000, 1024), SHAPE_1B, PRESETS["dgx-spark"])
    assert one.wall_s == round(proj.high_s, 1) and one.wall_low_s == round(proj.low_s, 1)
    assert one.cost_usd == pytest.approx(0.79 * (proj.high_s + 60) / 3600, abs=1e-6)  # the slow end is priced
    assert one.cost_low_usd < one.cost_usd and p.best_speed_basis == "projected"
    assert p.measured_on == "2-core x86_64 CPU" and p.measured_tokens_per_s == 1040.0
    text = " ".join(advise(p, p, EstimateSpec(), 50, batch=50, on_gpu=False, has_gold=True))
    assert "Measured on 2-core x86_64 CPU: 1,040 tokens/s of m@1" in text
    assert "not this machine's speed at its rate" in text
    assert f"projected for DGX Spark (GB10) from its declared figures: 0h00m{round(proj.low_s):02d}s" in text
    assert "the range's slow end" in text  # the choice says which number it picked on


def test_an_option_on_the_machine_the_sample_ran_on_is_measured():
    spark = Machine("dgx-spark", "NVIDIA GB10")
    p = predict(SAMPLE, TIMING, EstimateSpec().options, 2.0, machine=spark, shape=SHAPE_1B)
    assert [o.speed_basis for o in p.options] == ["measured", "measured"]
    assert p.options[0].cost_usd == pytest.approx(0.79 * (p.predicted_wall_s + 60) / 3600, abs=1e-6)
    h200 = NodeOption(name="H200", hourly_usd=3.5, hardware="h200")
    assert predict(SAMPLE, TIMING, [h200], 2.0, machine=spark, shape=SHAPE_1B).options[0].speed_basis \
        == "projected"


def test_without_hardware_or_a_model_size_an_option_is_not_priced():
    bare = NodeOption(name="some box", hourly_usd=1.0)
    p = predict(SAMPLE, TIMING, [bare, *EstimateSpec().options], 2.0, machine=CPU, shape=None)
    assert all(o.speed_basis == "unknown" and o.cost_usd is None for o in p.options)
    assert "no hardware declared" in p.options[0].why and "size is unknown" in p.options[1].why
    assert p.best_option is None and choose([p], 0.0) is None
    text = " ".join(advise(p, None, EstimateSpec(), 50, batch=50, on_gpu=False, has_gold=True))
    assert "'some box' is not priced: no hardware declared" in text


def test_hourly_rate_adds_this_machine_at_the_measured_speed(tmp_path):
    mine = NodeOption(name="this machine", hourly_usd=0.5, hardware=THIS_MACHINE)
    p = predict(SAMPLE, TIMING, [*EstimateSpec().options, mine], 2.0, machine=CPU, shape=None)
    this = p.options[-1]
    assert this.speed_basis == "measured" and this.hardware == "2-core x86_64 CPU"
    assert this.cost_usd == pytest.approx(0.5 * (p.predicted_wall_s + 60) / 3600, abs=1e-6)
    assert p.best_option == "this machine"
    job = _job(tmp_path)
    report = job.estimate(FakeVLLMResource(), EstimateSpec(sample_rows=20, fill_batch=False, hourly_rate_usd=0.5))
    assert report.primary.options[-1].name == "this machine" and report.primary.best_option == "this machine"
    assert EstimateSpec(sample_rows=20).hourly_rate_usd is None  # off unless asked for


def test_candidates_with_engine_settings_parse_and_keep_a_name():
    est = EstimateSpec(models=["gemma-3-270m", "/models/qwen-8b@quantization=fp8+max_model_len=2048",
                               {"model": "/models/qwen-8b", "engine_kwargs": {"quantization": "awq"}, "name": "q4"}])
    plain, fp8, q4 = est.candidates()
    assert plain == ModelCandidate(model="gemma-3-270m") and plain.label == "gemma-3-270m"
    assert fp8.model == "/models/qwen-8b" and fp8.engine_kwargs == {"quantization": "fp8", "max_model_len": 2048}
    assert fp8.label == "/models/qwen-8b@max_model_len=2048+quantization=fp8" and q4.label == "q4"
    assert EstimateSpec(**est.model_dump()).candidates() == est.candidates()  # as the asset re-validates it
    with pytest.raises(ConfigError, match=r"estimate\.models.*not key=value"):
        EstimateSpec(models=["/models/qwen-8b@fp8"])
    with pytest.raises(ConfigError, match=r"estimate\.options\.0\.hardware.*unknown hardware preset 'dgx'"):
        EstimateSpec(options=[{"name": "x", "hourly_usd": 1.0, "hardware": "dgx"}])
    merged = FakeVLLMResource(engine_kwargs={"enforce_eager": True}).with_model("q", {"quantization": "fp8"})
    assert merged.model == "q" and merged.engine_kwargs == {"enforce_eager": True, "quantization": "fp8"}


def test_weights_follow_the_precision(tmp_path):
    cfg = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "vocab_size": 49152, "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    bf16, fp8 = model_shape(str(tmp_path)), model_shape(str(tmp_path), {"quantization": "fp8"})
    assert bf16 is not None and fp8 is not None and bf16.params == fp8.params
    assert 14 < bf16.weights_gb < 16 and fp8.weights_gb == pytest.approx(bf16.weights_gb / 2)
    assert bf16.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2  # k and v, 32 layers, 8 KV heads of 128, bf16
    assert model_shape(str(tmp_path / "nowhere")) is None


def test_the_machine_kind_is_read_from_the_gpu_name():
    assert kind_of_gpu("NVIDIA GB10") == "dgx-spark" and kind_of_gpu("NVIDIA H200") == "h200"
    assert kind_of_gpu("NVIDIA A100-SXM4-80GB") == "gpu"
    here = sample_machine(None, on_cpu=True)
    assert here.kind == "cpu" and here.description.endswith("CPU")
    assert sample_machine(None, on_cpu=True, remote=True).kind == "unknown"  # someone else's server
    assert sample_machine("h200", on_cpu=True) == Machine("h200", "H200")
    assert cannot_run({"quantization": "fp8"}, on_cpu=True).startswith("cannot run on this platform")
    assert cannot_run({"quantization": "fp8"}, on_cpu=False) is None and cannot_run({}, on_cpu=True) is None


def _job(tmp_path):
    from sparkbatch_dagster import build_batch_assets

    job = build_batch_assets(spec=make_spec(tmp_path, n=120, shards=2))
    build_shards(job.spec, job.home)
    return job


def test_a_precision_the_cpu_cannot_run_is_listed_before_any_engine_starts(tmp_path, monkeypatch):
    import sparkbatch_dagster.definitions.estimating as job_module

    monkeypatch.setattr(job_module, "on_cpu", lambda: True)
    started: list[str] = []
    real = FakeVLLMResource._start
    monkeypatch.setattr(FakeVLLMResource, "_start", lambda self: started.append(self.model_name()) or real(self))
    job = _job(tmp_path)
    est = EstimateSpec(sample_rows=20, fill_batch=False, sample_hardware="dgx-spark",
                       models=["fake-model@quantization=fp8", "fake-model@quantization=awq"])
    report = job.estimate(FakeVLLMResource(), est)
    assert report.to_json()["unrunnable_models"] == [{"model": "fake-model@quantization=fp8", "error": cannot_run(
        {"quantization": "fp8"}, on_cpu=True)}]
    assert started == ["fake-model", "fake-model"]  # the job's model and the awq candidate, never fp8
    primary, awq = report.models
    assert awq.model.endswith("(quantization=awq)") and awq.identity != primary.identity
    assert awq.engine_kwargs == {"quantization": "awq"}
    assert any("'fake-model@quantization=fp8' is listed, not timed: cannot run on this platform" in a
               for a in report.advice)
    with pytest.raises(ConfigError, match="quantization='fp8' needs a GPU"):
        job.estimate(FakeVLLMResource(engine_kwargs={"quantization": "fp8"}), est)
    assert len(started) == 2  # stopped before the job's own engine started
