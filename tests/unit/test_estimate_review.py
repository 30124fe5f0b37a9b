"""The estimate judges each model's confidence on its sample's gold rows
(``estimate/review_figures.py``): the calibration (scored held out, saved under the job's home for
runs), errors caught at 5/10/20% of rows reviewed, ``JobSpec.review`` as a threshold, the chart, and
all of it in the report, its advice and the asset's metadata."""

from __future__ import annotations

import base64
import json
import random
from pathlib import Path

import pytest
from dagster import MetadataValue

from sparkbatch_dagster.estimate import calibration as cal
from sparkbatch_dagster.estimate.review_figures import BUDGETS, advice, judge, plan_line
from sparkbatch_dagster.spec import ReviewSpec

LABELS = ["admin", "net", "web"]
MODEL = "smol@0123456789ab"


def overconfident(rows: int = 400, seed: int = 3) -> list[tuple[float, bool]]:
    """A model sure of everything (0.5-1.0) and right as often as half its confidence: calibration
    has something to fix, and the order still finds errors (the least sure are wrong most)."""
    rng = random.Random(seed)
    out = []
    for _ in range(rows):
        c = 0.5 + 0.5 * rng.random()
        out.append((round(c, 4), rng.random() < (c - 0.5) * 1.6))
    return out


def test_a_miscalibrated_model_is_calibrated_saved_and_its_budget_reported(tmp_path):
    folder, chart = tmp_path / "calibration", tmp_path / "estimate" / "review-smol.png"
    f = judge(overconfident(), MODEL, LABELS, ReviewSpec(budget=0.1), folder, chart)
    c = f.calibration
    assert c.method != "none" and c.rows == 400 and c.folds == cal.FOLDS
    assert c.ece_after < c.ece_before and c.brier_after < c.brier_before  # held out, and better
    stored = cal.load(folder, MODEL, LABELS)  # what a run applies: keyed by the identity rows carry
    assert stored is not None and stored == f.fitted and c.path == str(folder / cal.calibration_key(MODEL, LABELS))
    assert f.chart == chart and chart.stat().st_size > 0
    assert f.budget is not None and [x.reviewed_share for x in f.budget.caught] == list(BUDGETS)
    assert f.budget.rows == 400 and f.budget.errors == sum(not ok for _, ok in overconfident())
    caught = [x.caught_share for x in f.budget.caught]
    assert caught == sorted(caught) and caught[0] > 0.05  # least sure first beats reviewing at random
    plan = f.plan
    assert plan is not None and plan.why is None and plan.asked == "budget" and plan.target == 0.1
    assert plan.reviewed is not None and plan.caught is not None and plan.reviewed.of == 400
    assert plan.caught.low <= plan.caught.value <= plan.caught.high
    # A budget is a share of rows: exactly a tenth of them, in every fold too
    assert plan.share == 0.1 and plan.reviewed.count == 40


def test_too_few_gold_rows_fit_nothing_and_leave_a_stored_map_alone(tmp_path):
    folder = tmp_path / "calibration"
    first = judge(overconfident(), MODEL, LABELS, None, folder, None)
    before = Path(first.calibration.path).read_text()
    few = judge(overconfident(12), MODEL, LABELS, ReviewSpec(catch_errors=0.8), folder, None)
    assert few.calibration.method == "none" and few.calibration.path is None
    assert "calibration needs at least" in few.calibration.reason
    assert few.calibration.ece_after == few.calibration.ece_before  # nothing fitted: nothing changed
    assert Path(first.calibration.path).read_text() == before  # the map fitted on more rows stands
    assert few.plan is not None and few.plan.threshold is None and "needs at least" in (few.plan.why or "")
    assert "no threshold" in plan_line("smol", few.plan)
    assert few.chart is None and first.plan is None


def test_the_advice_says_each_figure_in_words(tmp_path):
    f = judge(overconfident(), MODEL, LABELS, ReviewSpec(catch_errors=0.8), tmp_path, None)
    lines = advice("smol", f.calibration, f.budget, f.plan)
    assert len(lines) == 3
    c = f.calibration
    assert f"calibrated by {c.method} on 400 gold rows" in lines[0]
    assert f"ECE {c.ece_before:.3f} -> {c.ece_after:.3f}" in lines[0] and "(held out)" in lines[0]
    assert "5% -> " in lines[1] and "20% -> " in lines[1]
    assert f.plan is not None and f.plan.reviewed is not None
    assert lines[2].startswith(f"review {{catch_errors: 0.8}} for smol: review the least sure {f.plan.share:.1%} of "
                               "rows")
    assert f"{f.plan.reviewed.value:.1%} of rows reviewed (95% interval" in lines[2]
    assert lines[2].index("rows reviewed") < lines[2].index("errors caught")  # the asked-for figure second


@pytest.fixture(scope="module")
def estimated(tmp_path_factory):
    """An estimate of two fake models on 120 gold rows, with a review budget."""
    from sparkbatch_dagster import build_batch_assets
    from sparkbatch_dagster.inputs.shards import build_shards
    from sparkbatch_dagster.spec import EstimateSpec
    from sparkbatch_dagster.testing import FakeVLLMResource
    from testkit import make_spec

    tmp = tmp_path_factory.mktemp("review")
    est = EstimateSpec(sample_rows=120, warmup_rows=4, fill_batch=False, min_sample_seconds=0, accuracy_bar=0.0,
                       sample_hardware="dgx-spark", models=["big"], hourly_rate_usd=0.5)
    job = build_batch_assets(spec=make_spec(tmp, n=200, shards=2, estimate=est, review={"budget": 0.2}))
    build_shards(job.spec, job.home)
    return job, job.estimate(FakeVLLMResource(model="small"))


def test_the_estimate_reports_each_models_calibration_and_writes_it_for_runs(estimated):
    from sparkbatch_dagster.definitions.metadata import estimate_metadata

    job, report = estimated
    written = json.loads(Path(report.json_path).read_text())
    for m, raw in zip(report.models, written["models"], strict=True):
        assert m.calibration is not None and m.review_budget is not None and m.review_plan is not None
        assert raw["calibration"]["method"] == m.calibration.method and m.calibration.rows == m.sample_rows
        assert Path(m.review_chart).parent == job.home.estimate_dir and Path(m.review_chart).is_file()
        if m.calibration.path:  # keyed by the identity the rows carry, not the display name
            assert cal.load(job.home.calibration_dir, m.identity, job.spec.output.labels) is not None
    assert any(line.startswith("review {budget: 0.2} for ") for line in report.advice)
    md = estimate_metadata(report)
    assert isinstance(md["calibration"], MetadataValue.md("").__class__)
    assert "ECE after (held out)" in md["calibration"].value and "10% reviewed" in md["review_budget"].value
    assert {k for k in md if k.startswith("review_chart ")} == {f"review_chart {m.model}" for m in report.models}
    for m in report.models:  # and shown in place: the PNG inline in Markdown, which the UI renders
        png = Path(m.review_chart).read_bytes()
        assert md[f"reliability and budget {m.model}"].value.endswith(f"base64,{base64.b64encode(png).decode()})")
    assert md["accuracy and cost"].value.startswith("![accuracy and cost](data:image/png;base64,iVBORw0KGgo")
