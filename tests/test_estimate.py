"""The estimate with the fake engine: sampling, extrapolation, node options, advice, the asset,
predicted vs actual in run_metrics, the CLI's last JSON line. The real engine: test_real_estimate."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import DagsterInstance, materialize

from conftest import fake_resource, make_rows, make_spec, write_parquet
from sparkbatch_dagster import ConfigError, VLLMResource, build_batch_assets
from sparkbatch_dagster.cli import RANGE_END, RANGE_START
from sparkbatch_dagster.estimate import Sample, Timing, advise, choose, draw_sample, nodes_needed, predict
from sparkbatch_dagster.model import weights_gb
from sparkbatch_dagster.shards import build_shards
from sparkbatch_dagster.spec import EstimateSpec, NodeOption
from sparkbatch_dagster.store import JobHome

ROOT = Path(__file__).resolve().parents[1]
OPTIONS = EstimateSpec().options


def _varied_rows(n: int) -> list[dict]:
    rows = make_rows(n)
    for i, r in enumerate(rows):  # lengths from a few characters to a few hundred
        r["text"] = r["text"] + " more" * (i % 40) * 3
    return rows


def test_sample_spreads_over_length_bands_and_is_repeatable(tmp_path):
    src = write_parquet(tmp_path / "in" / "rows.parquet", _varied_rows(400))
    spec = make_spec(tmp_path, input=str(src), shards=4)
    home = JobHome(spec.home_path)
    build_shards(spec, home)
    est = EstimateSpec(sample_rows=40, strata=4, warmup_rows=6)
    s1, s2 = draw_sample(spec, home, est), draw_sample(spec, home, est)
    assert [r["row_id"] for r in s1.rows] == [r["row_id"] for r in s2.rows]
    assert len(s1.rows) == 40 and len(s1.warmup) == 6 and s1.total_rows == 400
    assert not {r["row_id"] for r in s1.rows} & {r["row_id"] for r in s1.warmup}
    lengths = sorted(len(r["text"]) for r in _varied_rows(400))
    quartiles = [lengths[100], lengths[200], lengths[300]]
    bands = [sum(1 for r in s1.rows if lo <= len(r["text"]) < hi)
             for lo, hi in zip([0, *quartiles], [*quartiles, 10**9], strict=True)]
    assert all(6 <= b <= 14 for b in bands), bands  # about 10 per length quartile
    assert {"gold", "text", "row_id"} <= set(s1.rows[0])
    other = draw_sample(spec, home, est.model_copy(update={"seed": 1}))
    assert [r["row_id"] for r in other.rows] != [r["row_id"] for r in s1.rows]


def test_distinct_prompts_count_per_shard_duplicates(tmp_path):
    spec = make_spec(tmp_path, n=140, shards=1)  # every 7th text repeats ("A apple." ...)
    home = JobHome(spec.home_path)
    build_shards(spec, home)
    sample = draw_sample(spec, home, EstimateSpec(sample_rows=20))
    assert sample.distinct_prompts == len({r["text"] for r in make_rows(140)}) < 140


def _timing(**kw):
    base = dict(model="m@1", engine_start_s=60.0, seconds=10.0, rows=50, prompt_tokens=9000,
                output_tokens=1000, errors=0, correct=25)
    return Timing(**{**base, **kw})


def test_prediction_scales_the_measured_rate_to_the_job_and_prices_each_option():
    sample = Sample(rows=[{}] * 50, warmup=[], total_rows=10_000, distinct_prompts=9_000)
    p = predict(sample, _timing(), OPTIONS, weights_gb=0.3)
    assert p["predicted_tokens"] == 200 * 9_000  # 10,000 tokens / 50 rows x distinct prompts
    assert p["predicted_tokens_per_hour"] == 1000 * 3600
    assert p["predicted_wall_s"] == pytest.approx(1800.0)
    one, two = p["options"]
    assert one["wall_s"] == 1800.0 and two["wall_s"] == 900.0
    assert one["cost_usd"] == pytest.approx(0.79 * (1800 + 60) / 3600, abs=1e-4)
    assert two["cost_usd"] == pytest.approx(1.79 * (900 + 60) / 3600, abs=1e-4)
    assert p["accuracy"] == 0.5 and 0.1 < p["accuracy_ci95"] < 0.2


def test_advice_says_one_node_is_cheaper_for_a_model_that_fits():
    sample = Sample(rows=[{}] * 50, warmup=[], total_rows=100_000, distinct_prompts=100_000)
    p = predict(sample, _timing(), OPTIONS, weights_gb=16.0)
    text = " ".join(advise(p, p, EstimateSpec(), 50, batch=1024, on_gpu=True, has_gold=True))
    assert "fits one node" in text and "raise the cost" in text
    assert re.search(r"\+1[34]%", text)  # 1.79 / (2 x 0.79): 13% more per generated token, start aside
    assert "smaller than one batch" in text  # 50 rows cannot fill 1024 GPU sequences
    assert "Smallest model that clears" in text


def test_a_model_too_big_for_one_node_needs_tensor_parallelism(tmp_path):
    cfg = {"hidden_size": 8192, "num_hidden_layers": 80, "intermediate_size": 28672, "vocab_size": 128256,
           "num_attention_heads": 64, "num_key_value_heads": 8, "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    size = weights_gb(str(tmp_path))
    assert size is not None and 135 < size < 150  # a 70B model in bf16
    assert nodes_needed(size, 128.0) == 2 and nodes_needed(0.3, 128.0) == 1
    sample = Sample(rows=[{}] * 50, warmup=[], total_rows=1000, distinct_prompts=1000)
    p = predict(sample, _timing(), OPTIONS, weights_gb=size)
    one, two = p["options"]
    assert not one["fits"] and one["cost_usd"] is None
    assert two["fits"] and two["tensor_parallel_size"] == 2 and two["wall_s"] == p["predicted_wall_s"]
    text = " ".join(advise(p, None, EstimateSpec(), 50, batch=64, on_gpu=False, has_gold=True))
    assert "does not fit one node" in text and "tensor_parallel_size=2" in text
    assert "No candidate reaches" in text


def test_choose_names_the_smallest_model_that_clears_the_bar():
    models = [{"model": "big", "weights_gb": 16.0, "accuracy": 0.9, "predicted_wall_s": 10},
              {"model": "small", "weights_gb": 0.3, "accuracy": 0.4, "predicted_wall_s": 5},
              {"model": "mid", "weights_gb": 2.0, "accuracy": 0.7, "predicted_wall_s": 7}]
    assert choose(models, 0.3)["model"] == "small"
    assert choose(models, 0.5)["model"] == "mid"
    assert choose(models, 0.95) is None


def test_bad_estimate_settings_name_the_value(tmp_path):
    with pytest.raises(ConfigError, match=r"estimate\.sample_rows"):
        EstimateSpec(sample_rows=5)
    with pytest.raises(ConfigError, match=r"estimate\.options"):
        EstimateSpec(options=[])
    with pytest.raises(ConfigError, match=r"estimate\.options\.0\.hourly_usd"):
        make_spec(tmp_path, estimate={"options": [{"name": "x", "hourly_usd": -1}]})
    assert EstimateSpec(options=[NodeOption(name="x", hourly_usd=1.0)]).options[0].nodes == 1


def test_estimate_asset_then_run_metrics_show_predicted_vs_actual(tmp_path):
    spec = make_spec(tmp_path, n=300, shards=3, estimate=EstimateSpec(sample_rows=30, warmup_rows=4))
    job = build_batch_assets(spec=spec)
    res = {"vllm": fake_resource(delay_s=0.005)[0]}
    inst = DagsterInstance.get()
    result = materialize(job.assets, selection=[job.keys["input_shards"], job.keys["estimate"]],
                         resources=res, instance=inst)
    assert result.success
    md = result.asset_materializations_for_node("things__estimate")[0].metadata
    assert md["sample_rows"].value == 30 and md["total_rows"].value == 300
    assert md["predicted_wall_s"].value > 0 and md["predicted_tokens_per_hour"].value > 0
    assert md["cost_usd 1 node"].value > 0 and md["cost_usd 2-node cluster"].value > 0
    chart = Path(md["chart"].value)
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and chart.stat().st_size > 5000
    report = json.loads(Path(md["report"].value).read_text())
    assert report["chosen_model"] == "fake-model" and len(report["models"]) == 1
    keys = inst.get_dynamic_partitions(job.partitions_def.name)
    run = materialize(job.assets, selection=[job.keys["labeled_outputs"], job.keys["run_metrics"]], resources=res,
                      instance=inst, tags={RANGE_START: keys[0], RANGE_END: keys[-1]})
    mm = run.asset_materializations_for_node("things__run_metrics")[0].metadata
    predicted, actual = mm["predicted_wall_s"].value, mm["actual_wall_s"].value
    # The seconds shown are rounded to 0.1 s; the percentage comes from the unrounded values.
    assert mm["prediction_error_pct"].value == pytest.approx((predicted - actual) / actual * 100, abs=8)
    assert actual / 3 < predicted < actual * 3  # the fake engine's fixed delay per request


def test_estimate_config_from_the_launchpad_is_validated(tmp_path):
    job = build_batch_assets(spec=make_spec(tmp_path, n=60, shards=2))
    res = {"vllm": fake_resource()[0]}
    result = materialize(job.assets, selection=[job.keys["input_shards"], job.keys["estimate"]], resources=res,
                         run_config={"ops": {"things__estimate": {"config": {"sample_rows": 3}}}},
                         raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    assert "estimate.sample_rows" in str(failure.step_failure_data.error)


DEFS = """
from dagster import Definitions
from sparkbatch_dagster import JobSpec, OutputSpec, VLLMResource, build_batch_assets
spec = JobSpec(name="things", input={src!r}, id_column="id", text_columns=["text"], user_template="{{{{ text }}}}?",
               output=OutputSpec(kind="label", labels=["fruit", "vehicle", "animal"]), shard_count=3,
               gold_column="gold", home={home!r})
job = build_batch_assets(spec=spec)
fake = VLLMResource(engine="fake", engine_kwargs={{"delay_s": 0.01}})
defs = Definitions(assets=job.assets, resources={{"vllm": fake}})
"""


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    defs = tmp_path / "defs.py"
    if not defs.exists():
        src = write_parquet(tmp_path / "in" / "rows.parquet", make_rows(300))
        defs.write_text(DEFS.format(src=str(src), home=str(tmp_path / "home")))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "sparkbatch_dagster.cli", *args, "-f", str(defs)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_cli_estimate_prints_the_bill_then_run_shows_progress_and_the_check(tmp_path):
    est = json.loads(_cli(tmp_path, "estimate", "--sample-rows", "40").stdout.strip().splitlines()[-1])
    assert est["sample_rows"] == 40 and est["predicted_wall_s"] > 0 and est["predicted_tokens_per_hour"] > 0
    assert [o["name"] for o in est["options"]] == ["1 node", "2-node cluster"]
    assert all(o["cost_usd"] > 0 for o in est["options"])
    assert Path(est["chart"]).exists() and est["chosen_model"] == "fake-model"
    run = _cli(tmp_path, "run")
    bars = [line for line in run.stderr.splitlines() if line.startswith("[")]
    assert bars and "300/300 rows" in bars[-1] and "tok/s" in bars[-1] and "ETA" in bars[-1]
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert summary["predicted_wall_s"] > 0 and summary["prediction_error_pct"] is not None


def test_on_a_gpu_the_sample_fills_one_batch(tmp_path, monkeypatch):
    import sparkbatch_dagster.assets as assets_module

    monkeypatch.setattr(assets_module, "on_cpu", lambda: False)  # what vLLM reports on a GPU box
    job = build_batch_assets(spec=make_spec(tmp_path, n=300, shards=3))
    home = JobHome(job.spec.home_path)
    build_shards(job.spec, home)
    resource = VLLMResource(engine="fake", max_num_seqs=200)
    report = job.estimate(resource, EstimateSpec(sample_rows=40))
    assert report["sample_rows"] == 200 and not any("smaller than one batch" in a for a in report["advice"])
    small = job.estimate(resource, EstimateSpec(sample_rows=40, fill_batch=False))
    assert small["sample_rows"] == 40 and any("smaller than one batch (200 rows)" in a for a in small["advice"])
    tiny_job = job.estimate(VLLMResource(engine="fake", max_num_seqs=1024),
                            EstimateSpec(sample_rows=40, fill_batch=False))
    assert any("smaller than one batch (300 rows)" in a for a in tiny_job["advice"])  # the input is the limit


def test_a_candidate_that_cannot_load_is_reported_and_the_rest_compared(tmp_path, monkeypatch):
    # The job runs on the fake engine; the candidate is a real offline resource whose model is missing.
    monkeypatch.setattr(VLLMResource, "with_model", lambda self, model: VLLMResource(model=model))
    job = build_batch_assets(spec=make_spec(tmp_path, n=120, shards=2))
    build_shards(job.spec, JobHome(job.spec.home_path))
    est = EstimateSpec(sample_rows=20, models=[str(tmp_path / "no-such-model")])
    report = job.estimate(VLLMResource(engine="fake"), est)
    assert [m["model"] for m in report["models"]] == ["fake-model"] and report["chosen_model"] == "fake-model"
    [failed] = report["failed_models"]
    assert failed["model"].endswith("no-such-model") and "does not exist" in failed["error"]
    assert any("could not run, left out" in a for a in report["advice"])


def test_advice_tells_how_to_switch_to_the_chosen_model():
    sample = Sample(rows=[{}] * 50, warmup=[], total_rows=1000, distinct_prompts=1000)
    primary = predict(sample, _timing(model="big@1", correct=10), OPTIONS, weights_gb=16.0)
    small = {**predict(sample, _timing(model="small@2", correct=30), OPTIONS, weights_gb=0.5), "configured_as": "small"}
    assert choose([primary, small], 0.5) is small
    text = " ".join(advise(primary, small, EstimateSpec(accuracy_bar=0.5), 50, batch=64, on_gpu=False, has_gold=True))
    assert "clears accuracy 0.5: small@2 (0.6" in text and "set VLLMResource(model='small') to switch" in text
