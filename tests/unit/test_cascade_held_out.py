"""A cascade's figures are held out (``estimate/cascades.py``): its threshold is picked on some folds
of the sample and scored on the others, so a threshold that wins on the rows it was picked on by
luck does not carry its luck into the reported accuracy or into ``clears``."""

from __future__ import annotations

import random

import pytest
from forecasts import priced_model, sample_timing

from sparkbatch_dagster.estimate import cascades
from sparkbatch_dagster.estimate.records import ModelForecast
from sparkbatch_dagster.estimate.sample import Timing


def _noise(rows: int, seed: int = 7) -> tuple[list[ModelForecast], list[Timing]]:
    """Two coin-flip models; A's confidence says nothing of whether it is right. Every threshold is
    worth 50% in truth: whatever one looks better on the sample is luck."""
    rng = random.Random(seed)
    ids = [f"r{i:03d}" for i in range(rows)]
    a = {r: (round(rng.random(), 3), rng.random() < 0.5) for r in ids}
    b = {r: (round(rng.random(), 3), rng.random() < 0.5) for r in ids}
    return [priced_model("a", 100, 10), priced_model("b", 1000, 50)], [sample_timing("a", a), sample_timing("b", b)]


def _pair(found, first="a"):
    return next(c for c in found if c.stages[0] == first)


def test_a_lucky_threshold_is_not_reported_at_its_in_sample_accuracy():
    models, timings = _noise(200)
    ab = _pair(cascades.evaluate(models, timings, bar=1.0))  # nothing clears: the pick is the highest lower bound
    at = {p.threshold: p for p in ab.curve}
    assert ab.in_sample_accuracy == at[ab.pick.threshold].accuracy == max(p.accuracy for p in ab.curve)
    # The held-out figure is below the in-sample one it replaces: the pick's luck stays on its own rows.
    assert ab.pick.accuracy < ab.in_sample_accuracy
    assert ab.pick.accuracy_low < ab.in_sample_accuracy_low
    assert (ab.folds, len(ab.fold_thresholds), ab.sample_rows) == (cascades.FOLDS, cascades.FOLDS, 200)
    assert set(ab.fold_thresholds) <= set(cascades.THRESHOLDS)


def test_a_pair_that_clears_only_in_sample_does_not_clear():
    models, timings = _noise(200)
    lucky = _pair(cascades.evaluate(models, timings, bar=1.0))
    bar = lucky.in_sample_accuracy_low  # the in-sample pick reaches it: the old rule said "clears"
    ab = _pair(cascades.evaluate(models, timings, bar=bar))
    assert ab.in_sample_accuracy_low >= bar
    assert not ab.clears and ab.pick.accuracy_low < bar
    best = cascades.cheapest(cascades.evaluate(models, timings, bar=bar))
    assert best is None or best.stages != ["a", "b"]
    line = cascades.advice([ab], None, bar)[0]
    assert line.startswith(f"No cascade clears the accuracy bar {bar:g} on held-out sample rows")
    assert "5-fold cross-validation" in line and f"{ab.in_sample_accuracy:.1%} on the rows" in line


def test_the_folds_are_seeded_and_fewer_when_the_rows_are_few():
    models, timings = _noise(200)
    once, again = cascades.evaluate(models, timings, bar=0.5), cascades.evaluate(models, timings, bar=0.5)
    assert once == again  # the same sample always splits the same way
    assert [cascades.fold_count(n) for n in (10, 19, 20, 39, 49, 50, 5000)] == [2, 2, 2, 3, 4, 5, 5]
    models, timings = _noise(30)
    few = _pair(cascades.evaluate(models, timings, bar=0.0))
    assert few.folds == 3 and len(few.fold_thresholds) == 3 and few.clears
    line = cascades.advice([few], None, 0.0)[0]
    assert "3 folds, not 5: only 30 rows in common" in line and "accurate on held-out sample rows" in line


def test_the_held_out_cost_is_priced_at_the_held_out_escalated_share():
    models, timings = _noise(200)
    ab = _pair(cascades.evaluate(models, timings, bar=1.0))
    a, b = models
    share = ab.pick.escalated_share
    expected = 3.6 * (a.options[0].wall_s + a.engine_start_s + share * b.options[0].wall_s + b.engine_start_s) / 3600
    assert ab.pick.best_cost_usd == pytest.approx(expected, abs=1e-3)
    assert ab.to_json()["accuracy"] == ab.pick.accuracy and ab.to_json()["in_sample_accuracy"] == ab.in_sample_accuracy
