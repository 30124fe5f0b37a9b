"""The estimate judges cascades on its sample (``estimate/cascades.py``): each ordered pair of
timed models over thresholds, its accuracy interval, escalated share and whole-job cost, and the
cheapest that clears the bar against each model alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dagster import DagsterInstance, materialize
from forecasts import priced_model, sample_timing

from sparkbatch_dagster import build_batch_assets
from sparkbatch_dagster.estimate import cascades
from sparkbatch_dagster.estimate.choice import wilson
from sparkbatch_dagster.spec import EstimateSpec
from sparkbatch_dagster.testing import FakeVLLMResource
from testkit import make_spec


def test_a_cheap_unsure_model_and_a_dear_sure_one_make_the_cheapest_way_over_the_bar():
    ids = [f"r{i}" for i in range(40)]
    # small: sure (0.95) and right on 30 rows, unsure (0.4) and wrong on 10; big: right on all.
    small = sample_timing("small", {r: (0.95, True) if i < 30 else (0.4, False) for i, r in enumerate(ids)})
    big = sample_timing("big", {r: (0.9, True) for r in ids})
    models = [priced_model("small", wall_s=100, start_s=10), priced_model("big", wall_s=1000, start_s=50)]
    pairs = cascades.evaluate(models, [small, big], bar=0.85)
    first = next(p for p in pairs if p.stages == ["small", "big"])
    at = {p.threshold: p for p in first.curve}
    # Under 0.95: the 10 unsure rows go to big, which gets them right: 40 of 40.
    assert at[0.5].escalated_share == 0.25 and at[0.5].accuracy == 1.0
    assert at[0.5].accuracy_low == round(wilson(40, 40)[0], 4)
    assert at[0.5].best_cost_usd == pytest.approx(3.6 * (100 + 10 + 0.25 * 1000 + 50) / 3600, abs=1e-6)
    assert at[0.3].escalated_share == 0.0 and at[0.3].accuracy == 0.75  # nothing escalates
    assert at[0.3].best_cost_usd == pytest.approx(3.6 * 110 / 3600, abs=1e-6)  # nor does big start
    assert at[1.0].escalated_share == 1.0  # everything escalates
    # The pick: the cheapest threshold that clears 0.85 (0.5 ... 0.95 all do, at the same cost; at 0.4
    # the unsure rows, 0.4 sure, stay with small).
    assert at[0.4].escalated_share == 0.0
    assert first.clears and first.pick.threshold == 0.5 and first.pick.escalated_share == 0.25
    flat = first.to_json()  # as estimate.json has it: the pick's fields are the cascade's
    assert flat["configured_as"] == [{"model": "small", "below": 0.5}, {"model": "big"}]
    assert (flat["threshold"], flat["escalated_share"], list(flat)[-1]) == (0.5, 0.25, "curve")
    best = cascades.cheapest(pairs)
    assert best is first and best.pick.best_cost_usd < models[1].options[0].cost_usd  # cheaper than big alone
    line = cascades.advice(pairs, models[1], 0.85)[0]
    assert "cheaper than big alone" in line and "25% of rows go to big" in line
    alone = cascades.advice(pairs, None, 0.85)[0]
    assert "no model alone clears 0.85: the best buy" in alone


def test_pairs_without_enough_rows_or_confidences_are_not_judged():
    few = {f"r{i}": (0.9, True) for i in range(cascades.MIN_ROWS - 1)}
    models = [priced_model("a", 1, 1), priced_model("b", 1, 1)]
    assert cascades.evaluate(models, [sample_timing("a", few), sample_timing("b", few)], 0.5) == []
    blind = {f"r{i}": (None, True) for i in range(20)}
    seen = {**blind, "r0": (0.9, True)}
    judged = cascades.evaluate(models, [sample_timing("a", blind), sample_timing("b", seen)], 0.5)
    assert [p.stages for p in judged] == [["b", "a"]]  # a has no confidence to cut on


def test_the_estimate_reports_cascades_a_chart_and_the_best_buy(tmp_path):
    est = EstimateSpec(sample_rows=40, warmup_rows=4, fill_batch=False, min_sample_seconds=0, accuracy_bar=0.0,
                       sample_hardware="dgx-spark", models=["big"])
    job = build_batch_assets(spec=make_spec(tmp_path, n=200, shards=2, estimate=est))
    inst = DagsterInstance.get()
    res = {"vllm": FakeVLLMResource(model="small")}
    result = materialize(job.assets, selection=[job.keys["input_shards"], job.keys["estimate"]], resources=res,
                         instance=inst)
    assert result.success
    report = json.loads(Path(result.asset_materializations_for_node("things__estimate")[0].metadata["report"].value)
                        .read_text())
    assert sorted(tuple(c["stages"]) for c in report["cascades"]) == [("big", "small"), ("small", "big")]
    for c in report["cascades"]:
        assert [p["threshold"] for p in c["curve"]] == list(cascades.THRESHOLDS) and c["sample_rows"] == 40
    assert Path(report["cascade_chart"]).is_file()
    # The fake models give the same answers: a cascade is as accurate as either, and dearer.
    assert report["best_buy"]["kind"] == "model"
    md = result.asset_materializations_for_node("things__estimate")[0].metadata
    assert md["best_buy"].value == report["best_buy"]["model"]
    assert any(line.startswith("Cascade ") for line in report["advice"])
