"""The estimate's typed records at their edges: ``estimate.json`` keeps its keys and their order
(the report flattens the configured model into it, a cascade its pick), the prediction file keeps
its form, and a prediction file written by an older release still reads (its ETA, its brake)."""

import json

import pytest
from msgspec import structs

from sparkbatch_dagster.definitions.labeling import _use_prediction
from sparkbatch_dagster.estimate.records import EstimateReport, Prediction
from sparkbatch_dagster.inputs.shards import build_shards
from sparkbatch_dagster.run.brake import Brake
from sparkbatch_dagster.spec import EstimateSpec, HostedPrice
from sparkbatch_dagster.testing import FakeVLLMResource
from testkit import make_spec

#: estimate.json's keys, in order, as releases before the typed records wrote them.
REPORT_KEYS = [
    "job", "base_sample_rows", "sample_rows", "total_rows", "distinct_prompts", "model", "weights_gb",
    "engine_start_s", "extra_rows", "sample_steps", "sample_correct", "sample_s", "sample_tokens", "sample_errors",
    "accuracy", "accuracy_low", "accuracy_high", "stored_rows", "stored_prompts", "stored_exact",
    "prompts_to_generate", "predicted_tokens", "predicted_wall_s", "predicted_tokens_per_hour", "sample_engines",
    "options", "predicted_input_tokens", "predicted_output_tokens", "hosted", "measured_on", "measured_kind",
    "measured_tokens_per_s", "best_speed_basis", "best_option", "best_cost_usd", "reliability", "configured_as",
    "engine_kwargs", "identity", "dtype", "dtype_reason", "calibration", "review_budget", "review_plan",
    "review_chart", "sample_truth_rows", "accuracy_bar", "max_sample_rows", "chosen_model",
    "chosen_configured_as", "chosen_cost_usd", "models", "failed_models", "unrunnable_models", "advice", "cascades",
    "best_buy", "cascade_chart", "json", "chart"]
MODEL_KEYS = REPORT_KEYS[5:46]
MODEL_KEYS.insert(3, "sample_rows")  # a model's own sample_rows sits after engine_start_s
OPTION_KEYS = ["name", "nodes", "gpus_per_node", "hourly_usd", "hardware", "speed_basis", "projection", "why",
               "tensor_parallel_size", "fits", "engines", "settings", "how", "wall_s", "wall_low_s", "cost_usd",
               "cost_low_usd"]
POINT_KEYS = ["threshold", "accuracy", "accuracy_low", "accuracy_high", "escalated_share", "options", "best_option",
              "best_cost_usd"]
# The held-out figures are the pick's (flattened in); the in-sample ones sit apart, named so (issue 52).
CASCADE_KEYS = ["model", "stages", "configured_as", "sample_rows", "clears", "folds", "fold_thresholds",
                "in_sample_accuracy", "in_sample_accuracy_low", "in_sample_accuracy_high", *POINT_KEYS, "curve"]
HOSTED_KEYS = ["name", "input_tokens", "output_tokens", "input_per_million_usd", "output_per_million_usd", "cost_usd",
               "note"]
PREDICTION_KEYS = ["model", "predicted_wall_s", "predicted_prompts", "stored_rows", "engine_start_s", "best_cost_usd",
                   "total_rows", "sample_rows", "made_at"]


@pytest.fixture(scope="module")
def estimated(tmp_path_factory):
    """Two fake models compared (so cascades are judged), an hourly rate, a hosted price table."""
    tmp = tmp_path_factory.mktemp("records")
    est = EstimateSpec(sample_rows=40, warmup_rows=4, fill_batch=False, min_sample_seconds=0, accuracy_bar=0.0,
                       sample_hardware="dgx-spark", models=["big"], hourly_rate_usd=0.5,
                       hosted_prices=[HostedPrice(name="hx", input_per_million_usd=0.1, output_per_million_usd=0.4)])
    from sparkbatch_dagster import build_batch_assets

    job = build_batch_assets(spec=make_spec(tmp, n=200, shards=2, estimate=est))
    build_shards(job.spec, job.home)
    return job, job.estimate(FakeVLLMResource(model="small"))


def test_the_report_file_keeps_its_keys_and_their_order(estimated):
    job, report = estimated
    written = json.loads((job.home.estimate_dir / "estimate.json").read_text())
    assert written == report.to_json()
    assert list(written) == REPORT_KEYS
    assert [list(m) for m in written["models"]] == [MODEL_KEYS, MODEL_KEYS]
    assert {tuple(o) for m in written["models"] for o in m["options"]} == {tuple(OPTION_KEYS)}
    assert [list(h) for h in written["hosted"]] == [HOSTED_KEYS]
    assert written["cascades"] and all(list(c) == CASCADE_KEYS for c in written["cascades"])
    assert all(list(p) == POINT_KEYS for c in written["cascades"] for p in c["curve"])
    first = written["cascades"][0]
    assert [list(s) for s in first["configured_as"]] == [["model", "below"], ["model"]]  # the last stage: no 'below'
    assert list(written["best_buy"]) == ["kind", "model", "cost_usd", "configured_as"]
    # The configured model's fields are the report's; its sample rows are the report's.
    assert written["sample_rows"] == report.primary.sample_rows and written["model"] == report.primary.model
    assert written["chosen_model"] == report.chosen.model and written["json"] == report.json_path


def test_the_prediction_file_keeps_its_form_and_the_run_reads_it(estimated):
    job, report = estimated
    version = job.version_for(report.primary.identity)
    written = json.loads(job.home.prediction_path(version).read_text())
    assert list(written) == PREDICTION_KEYS
    pred = job.prediction(version)
    assert pred is not None and pred.to_json() == written
    assert pred.predicted_prompts == report.primary.prompts_to_generate


def test_a_prediction_file_from_an_older_release_still_reads(tmp_path):
    path = tmp_path / "prediction.json"
    # What the first release wrote (2026-11-29): no prompts, stored rows, engine start or cost yet.
    path.write_text(json.dumps({"model": "m@1", "predicted_wall_s": 100.0, "total_rows": 1000, "sample_rows": 80,
                                "made_at": "2026-11-29T21:00:00+00:00"}))
    pred = Prediction.read(path)
    assert pred is not None and (pred.stored_rows, pred.engine_start_s, pred.predicted_prompts) == (0, None, None)
    brake = Brake(hourly_rate_usd=1.0, max_cost_usd=1.0)
    _use_prediction(brake, pred)
    assert brake.predicted_rows_per_s == 10.0 and brake.restart_s == 0.0
    assert Prediction.read(tmp_path / "none.json") is None


def test_records_are_frozen_and_replaced_whole(estimated):
    _, report = estimated
    with pytest.raises(AttributeError):
        report.primary.best_cost_usd = 0.0  # type: ignore[misc]
    dearer = structs.replace(report.primary, best_cost_usd=9.0)
    assert dearer.best_cost_usd == 9.0 and report.primary.best_cost_usd != 9.0
    assert isinstance(report, EstimateReport) and report.sample_rows == report.primary.sample_rows
