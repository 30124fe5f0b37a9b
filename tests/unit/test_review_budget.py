"""A review budget from gold rows (estimate/review_budget.py): the errors-caught curve, a row budget or
an error target turned into a share of rows (a rank cut, ties broken by the raw confidence then row
order), with held-out shares and their Wilson intervals."""

import numpy as np
import pytest

from sparkbatch_dagster.errors import SparkbatchError
from sparkbatch_dagster.estimate import review_budget as rb


def rows(n: int = 1000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    conf = rng.uniform(0, 1, n)
    return conf, rng.random(n) < conf  # surer answers are right more often


def test_the_curve_runs_from_nothing_to_every_row_and_every_error():
    conf, right = rows(300)
    curve = rb.budget_curve(conf, right)
    assert curve.rows == 300 and curve.errors == int((~right).sum())
    first, last = curve.points[0], curve.points[-1]
    assert (first.reviewed, first.caught) == (0, 0)
    assert (last.reviewed_share, last.caught_share) == (1.0, 1.0)
    shares = [p.reviewed_share for p in curve.points]
    assert shares == sorted(shares)
    # least sure first beats chance: a tenth of the rows catch more than a tenth of the errors
    assert curve.caught_at(0.1) > 0.15


def test_ties_are_broken_by_the_raw_confidence_then_row_order_so_a_share_is_that_many_rows():
    curve = rb.budget_curve([0.2, 0.2, 0.2, 0.9], [False, True, False, True], raw=[0.3, 0.1, 0.2, 0.9])
    # raw order among the tied: row 1 (0.1, right), row 2 (0.2, wrong), row 0 (0.3, wrong)
    assert [(p.reviewed, p.caught) for p in curve.points] == [(0, 0), (1, 0), (2, 1), (3, 2), (4, 2)]
    assert list(rb.order([0.5, 0.5, 0.5])) == [0, 1, 2]  # all tied, raw too: row order


@pytest.mark.parametrize("shape", ["distinct", "rounded", "constant"])
@pytest.mark.parametrize("budget", [0.05, 0.1, 0.2, 0.5, 1.0])
def test_a_budget_plan_reviews_exactly_its_share_whatever_the_ties(budget, shape):
    conf, right = rows()
    conf = {"distinct": conf, "rounded": np.round(conf, 1), "constant": np.full(conf.size, 0.347)}[shape]
    plan = rb.plan_budget(conf, right, budget)
    assert plan.share == budget
    # each fold reviews its own round(budget x rows): the pooled count is the budget to a row per fold
    assert abs(plan.reviewed.count - budget * conf.size) <= rb.FOLDS / 2
    assert rb.cut(budget, conf.size) == int(budget * conf.size + 0.5)


def test_a_budget_plan_reports_held_out_shares_with_intervals_around_them():
    conf, right = rows()
    plan = rb.plan_budget(conf, right, 0.1)
    assert plan.asked == "budget" and plan.share == 0.1
    for share in (plan.reviewed, plan.caught):
        assert share.low <= share.value <= share.high
        assert share.value == pytest.approx(share.count / share.of)
    assert plan.caught.of == plan.errors == int((~right).sum())
    assert plan.reviewed.value == 0.1
    assert plan.caught.value > 0.15


@pytest.mark.parametrize("target", [0.5, 0.8, 1.0])
def test_an_error_target_share_catches_at_least_the_target_and_no_smaller_share_does(target):
    conf, right = rows(seed=4)
    share = rb.share_for_errors(conf, right, target)
    ranked = rb.order(conf)
    k = round(share * conf.size)
    assert (~right[ranked[:k]]).sum() >= target * (~right).sum()
    assert (~right[ranked[:k - 1]]).sum() < target * (~right).sum()


def test_an_error_target_plan_says_how_many_rows_it_sends_to_review():
    conf, right = rows(seed=2)
    plan = rb.plan_catch_errors(conf, right, 0.8)
    assert plan.asked == "catch_errors"
    assert plan.reviewed.low <= plan.reviewed.value <= plan.reviewed.high
    assert plan.caught.low <= plan.caught.value <= plan.caught.high
    assert 0.7 <= plan.caught.value <= 0.9
    # the errors sit at low confidence, so 80% of them costs fewer than 80% of the rows
    assert plan.reviewed.value < 0.8


def test_plan_figures_are_held_out_not_scored_on_the_rows_that_chose_the_share():
    """Confidence unrelated to being right: in-sample, the error-target share is tuned to these very
    errors; held out it has nothing to go on, and the reported share of errors caught is not the in-sample one."""
    rng = np.random.default_rng(11)
    conf = rng.uniform(0, 1, 60)
    right = rng.random(60) < 0.5
    plan = rb.plan_catch_errors(conf, right, 0.5)
    ranked = rb.order(conf)[:rb.cut(plan.share, conf.size)]
    in_sample = (~right[ranked]).sum() / (~right).sum()
    assert (plan.caught.value, plan.reviewed.value) != (pytest.approx(in_sample), pytest.approx(plan.share))


def test_bad_targets_and_too_few_rows_stop_naming_the_value():
    conf, right = rows(100)
    with pytest.raises(SparkbatchError, match=r"budget=1\.5 must be .* at most 1"):
        rb.plan_budget(conf, right, 1.5)
    with pytest.raises(SparkbatchError, match=r"catch_errors=0 must be"):
        rb.plan_catch_errors(conf, right, 0)
    with pytest.raises(SparkbatchError, match=f"at least {rb.MIN_ROWS}"):
        rb.plan_budget(conf[:5], right[:5], 0.1)
    with pytest.raises(SparkbatchError, match="wrong answers .* set review.budget or review_below"):
        rb.plan_catch_errors(conf, np.ones(100, bool), 0.8)


def test_the_review_chart_draws_both_panels_to_a_png(tmp_path):
    from matplotlib.image import imread

    from sparkbatch_dagster.estimate import calibration as cal
    from sparkbatch_dagster.estimate.review_chart import write_review_chart

    conf, right = rows(400)
    path = write_review_chart(cal.calibrate(conf ** 0.3, right, "m", ["a", "b"]), rb.budget_curve(conf, right),
                              tmp_path / "charts" / "review.png", title="m")
    assert path.exists() and not list(path.parent.glob("*.tmp.png"))
    height, width = imread(path).shape[:2]
    assert width > height > 300


def test_a_budget_plan_the_curve_and_the_chart_state_one_number():
    conf, right = rows(500, seed=9)
    raw = np.round(conf, 1)  # ties broken the same way everywhere
    for budget in (0.05, 0.1, 0.2):
        plan = rb.plan_budget(conf, right, budget, raw=raw)
        assert plan.caught.value == rb.budget_curve(conf, right, raw).caught_at(budget)
        assert plan.reviewed.count == rb.cut(budget, conf.size)
