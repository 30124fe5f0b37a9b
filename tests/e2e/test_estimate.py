"""The tests of tests/unit/test_estimate.py that start processes: the CLI, Dagster runs (their
log capture), servers, kills. That file says what they cover."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from dagster import DagsterInstance, materialize

from sparkbatch_dagster import build_batch_assets
from sparkbatch_dagster.cli.commands import RANGE_END, RANGE_START, summary
from sparkbatch_dagster.home import JobHome
from sparkbatch_dagster.inputs.shards import build_shards
from sparkbatch_dagster.run.totals import Status
from sparkbatch_dagster.spec import NodeOption
from sparkbatch_dagster.testing import FakeVLLMResource
from testkit import fake_resource, label_then_metrics, make_rows, make_spec, write_parquet
from unit.test_estimate import _slow_start, untimed

ROOT = Path(__file__).resolve().parents[2]


def test_estimate_asset_then_run_metrics_show_predicted_vs_actual(tmp_path):
    spec = make_spec(tmp_path, n=300, shards=3, estimate=untimed(sample_rows=30, warmup_rows=4, fill_batch=False,
                                                                  sample_hardware="dgx-spark"))
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
    assert md["cost_chart"].value.count("█") >= 2 and "1 node" in md["cost_chart"].value  # shown in the UI
    chart = Path(md["chart"].value)
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and chart.stat().st_size > 5000
    report = json.loads(Path(md["report"].value).read_text())
    assert report["chosen_model"] == "fake-model" and len(report["models"]) == 1
    keys = inst.get_dynamic_partitions(job.partitions_def.name)
    _, run = label_then_metrics(job.assets, job.keys, res, inst, keys[0], keys[-1])
    mm = run.asset_materializations_for_node("things__run_metrics")[0].metadata
    predicted, actual = mm["job_predicted_wall_s"].value, mm["job_actual_wall_s"].value
    # The seconds shown are rounded to 0.1 s; the percentage comes from the unrounded values.
    assert mm["job_prediction_error_pct"].value == pytest.approx((predicted - actual) / actual * 100, abs=8)
    # Both sides measured, no closeness asserted: how near the prediction comes depends on how busy
    # the machine was while the sample and the run were timed (benchmarks/estimate_accuracy.py measures it).
    assert predicted > 0 and actual > 0
    assert mm["job_cost_usd"].value >= mm["job_generation_cost_usd"].value > 0


DEFS = """
from dagster import Definitions
from sparkbatch_dagster import JobSpec, OutputSpec, VLLMResource, build_batch_assets
spec = JobSpec(name="things", input={src!r}, id_column="id", text_columns=["text"], user_template="{{{{ text }}}}?",
               output=OutputSpec(kind="label", labels=["fruit", "vehicle", "animal"]), shard_count=3,
               gold_column="gold", home={home!r})
job = build_batch_assets(spec=spec)
from sparkbatch_dagster.testing import FakeVLLMResource
fake = FakeVLLMResource(delay_s=0.01, max_num_seqs=32)
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
    proc = _cli(tmp_path, "estimate", "--sample-rows", "40", "--hourly-rate", "0.5")
    est = json.loads(proc.stdout.strip().splitlines()[-1])
    # 40 rows on the fake engine take well under min_sample_seconds (5 s): the sample doubles, up to a
    # quarter of the job's 300 rows (new rows only; duplicates of timed texts are not timed again).
    assert 40 < est["sample_rows"] <= 75 and est["predicted_wall_s"] > 0 and est["predicted_tokens_per_hour"] > 0
    # On this CPU: the Spark options are never priced at the CPU's speed; the fake model has no size to
    # project from, so they are unknown; --hourly-rate prices this machine as measured.
    assert [(o["name"], o["speed_basis"]) for o in est["options"]] == [
        ("1 node", "unknown"), ("2-node cluster", "unknown"), ("this machine", "measured")]
    assert [o["cost_usd"] is None for o in est["options"]] == [True, True, False]
    assert est["best_option"] == "this machine" and est["best_speed_basis"] == "measured"
    assert "CPU" in est["measured_on"] and est["measured_tokens_per_s"] > 0
    assert f"Measured on {est['measured_on']}" in proc.stderr and "'1 node' is not priced" in proc.stderr
    assert Path(est["chart"]).exists() and est["chosen_model"] == "fake-model"
    # Each model's calibration on the sample's gold rows is on the line too (the fake's confidences
    # are hash noise: whichever map wins, its held-out Brier is no worse than the raw one's).
    cal = est["models"][0]["calibration"]
    assert cal["rows"] == est["sample_rows"] and cal["brier_after"] <= cal["brier_before"]
    run = _cli(tmp_path, "run")
    bars = [line for line in run.stderr.splitlines() if line.startswith("[")]
    assert bars and "300/300 rows" in bars[-1] and "tok/s" in bars[-1] and "ETA" in bars[-1]
    bill = json.loads(run.stdout.strip().splitlines()[-1])
    assert bill["predicted_wall_s"] > 0 and bill["prediction_error_pct"] is not None
    assert bill["cost_usd"] == pytest.approx(bill["generation_cost_usd"] + bill["engine_start_cost_usd"], abs=2e-6)


def test_on_a_gpu_the_sample_fills_one_batch(tmp_path, monkeypatch):
    import sparkbatch_dagster.definitions.estimating as job_module

    monkeypatch.setattr(job_module, "on_cpu", lambda: False)  # what vLLM reports on a GPU box
    job = build_batch_assets(spec=make_spec(tmp_path, n=300, shards=3))
    home = JobHome(job.spec.home_path)
    build_shards(job.spec, home)
    resource = FakeVLLMResource(max_num_seqs=200)
    report = job.estimate(resource, untimed(sample_rows=40))
    assert report.sample_rows == 200 and not any("smaller than one batch" in a for a in report.advice)
    small = job.estimate(resource, untimed(sample_rows=40, fill_batch=False))
    assert small.sample_rows == 40 and any("smaller than one batch (200 rows)" in a for a in small.advice)
    tiny_job = job.estimate(FakeVLLMResource(max_num_seqs=1024),
                            untimed(sample_rows=40, fill_batch=False))
    assert any("smaller than one batch (300 rows)" in a for a in tiny_job.advice)  # the input is the limit


def test_with_two_engines_the_sample_fills_both_and_each_option_gets_its_own_speed(tmp_path):
    job = build_batch_assets(spec=make_spec(tmp_path, n=300, shards=3))
    build_shards(job.spec, JobHome(job.spec.home_path))
    options = [NodeOption(name="1 GPU", hourly_usd=1.0, hardware="h200"),
               NodeOption(name="2 GPUs", hourly_usd=2.0, gpus_per_node=2, hardware="h200")]
    resource = FakeVLLMResource(max_num_seqs=100, data_parallel_size=2)  # two fake engines in worker processes
    report = job.estimate(resource, untimed(sample_rows=40, options=options, sample_hardware="h200"))
    assert report.sample_rows == 200 and report.primary.sample_engines == 2  # a full batch on each engine
    one, two = report.primary.options
    assert two.engines == 2 and two.wall_s == report.primary.predicted_wall_s  # as sampled: two engines
    assert one.engines == 1 and one.wall_s == pytest.approx(2 * report.primary.predicted_wall_s, abs=0.2)


def test_the_estimate_predicts_only_prompts_the_store_does_not_hold(tmp_path):
    rows = make_rows(300)
    for r in rows:  # one prompt per row: no prompt shared between shards
        r["text"] = f"{r['text']} (#{r['id']})"
    src = write_parquet(tmp_path / "in" / "rows.parquet", rows)
    spec = make_spec(tmp_path, input=str(src), shards=3,
                     estimate=untimed(sample_rows=30, warmup_rows=4, sample_hardware="dgx-spark"))
    job = build_batch_assets(spec=spec)
    res = {"vllm": fake_resource(delay_s=0.002)[0]}
    inst = DagsterInstance.get()
    assert materialize(job.assets, selection=[job.keys["input_shards"]], resources=res, instance=inst).success
    keys = inst.get_dynamic_partitions(job.partitions_def.name)
    materialize(job.assets, selection=[job.keys["labeled_outputs"]], resources=res, instance=inst,
                tags={RANGE_START: keys[0], RANGE_END: keys[0]})
    version = job.output_version(res["vllm"])
    first = json.loads(job.home.stats_path(version, keys[0]).read_text())
    full = job.estimate(res["vllm"])
    report = full.primary
    assert report.stored_rows == first["rows"] and report.prompts_to_generate == 300 - first["rows"]
    _, rest = label_then_metrics(job.assets, job.keys, res, inst, keys[1], keys[-1])
    generated = sum(json.loads(job.home.stats_path(version, k).read_text())["generated_requests"] for k in keys[1:])
    assert report.prompts_to_generate == generated  # predicted and actual count the same prompts
    assert any("rows already have fake-model's answer in the result store" in a for a in full.advice)
    mm = rest.asset_materializations_for_node("things__run_metrics")[0].metadata
    assert mm["job_predicted_wall_s"].value > 0 and mm["job_prediction_error_pct"].value is not None
    done = job.estimate(res["vllm"])  # everything answered: nothing to predict, nothing to pay
    assert done.primary.prompts_to_generate == 0 and done.primary.predicted_wall_s == 0
    assert done.primary.best_cost_usd == 0


def test_the_runs_bill_includes_its_engine_start(tmp_path, monkeypatch):
    spec = make_spec(tmp_path, n=120, shards=3,
                     estimate=untimed(sample_rows=30, warmup_rows=4, sample_hardware="dgx-spark"))
    job = build_batch_assets(spec=spec)
    # A 3 s start against ~0.2 s of generation (1.3 s seen on a loaded machine): "generation
    # alone" is told from "start included" against the run's own elapsed time, not a fixed bound.
    _slow_start(monkeypatch, {"fake-model": 3.0}, sleep=True)
    resource = FakeVLLMResource(delay_s=0.001)
    res = {"vllm": resource}
    inst = DagsterInstance.get()
    assert materialize(job.assets, selection=[job.keys["input_shards"], job.keys["estimate"]], resources=res,
                       instance=inst).success
    report = json.loads((job.home.estimate_dir / "estimate.json").read_text())
    assert report["engine_start_s"] >= 3.0
    one = next(o for o in report["options"] if o["name"] == "1 node")
    # (both seconds are rounded to 0.1 in the report)
    assert one["cost_usd"] == pytest.approx(0.79 * (one["wall_s"] + report["engine_start_s"]) / 3600, abs=3e-5)
    keys = inst.get_dynamic_partitions(job.partitions_def.name)
    began = time.monotonic()
    _, run = label_then_metrics(job.assets, job.keys, res, inst, keys[0], keys[-1])
    elapsed = time.monotonic() - began
    mm = run.asset_materializations_for_node("things__run_metrics")[0].metadata
    start = mm["job_engine_start_s"].value
    # Generation alone, as predicted: with the start counted in it too, the two would not fit in
    # the time the run took (a bound that a slow machine moves with it; rounding: 0.1 s).
    assert start >= 3.0 and mm["job_actual_wall_s"].value + start <= elapsed + 0.1
    # engine_start_s is shown to 0.01 s and both costs to 1e-6 $: up to 2.1e-6 $ of rounding
    assert mm["job_cost_usd"].value == pytest.approx(mm["job_generation_cost_usd"].value + 0.79 * start / 3600,
                                                     abs=3e-6)
    st = Status(sharded=True, partitions_total=3, partitions_done=3, missing=[], next="", pool_limit=None, warnings=[])
    out = summary(job, resource, st, keys, SimpleNamespace(success=True)).to_json()
    assert out["engine_start_s"] == start and out["cost_usd"] == mm["job_cost_usd"].value
    assert out["generation_cost_usd"] == pytest.approx(0.79 * out["wall_s"] / 3600, abs=2e-6)
    assert out["wall_s"] + start <= elapsed + 0.1 and out["prediction_error_pct"] is not None


def test_a_run_on_a_warm_engine_pays_no_engine_start(tmp_path, monkeypatch):
    _slow_start(monkeypatch, {"fake-model": 1.0}, sleep=True)
    resource = FakeVLLMResource(keep_warm=True, delay_s=0.001)
    resource.shutdown()
    inst = DagsterInstance.get()
    starts = []
    for name in ("first", "second"):  # two jobs, one engine kept warm between their runs
        job = build_batch_assets(spec=make_spec(tmp_path / name, n=60, shards=2, name=name))
        res = {"vllm": resource}
        assert materialize(job.assets, selection=[job.keys["input_shards"]], resources=res, instance=inst).success
        keys = inst.get_dynamic_partitions(job.partitions_def.name)
        _, run = label_then_metrics(job.assets, job.keys, res, inst, keys[0], keys[-1])
        starts.append(run.asset_materializations_for_node(f"{name}__run_metrics")[0].metadata)
    resource.shutdown()
    assert starts[0]["job_engine_start_s"].value >= 1.0 and starts[1]["job_engine_start_s"].value < 0.5
    assert starts[1]["job_cost_usd"].value == pytest.approx(starts[1]["job_generation_cost_usd"].value, abs=2e-6)
    assert starts[1]["wall_s"].value > 0  # generation time kept whole, nothing taken off for a start not paid
