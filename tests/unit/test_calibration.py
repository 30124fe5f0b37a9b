"""Calibration of label confidences on gold rows (estimate/calibration.py): synthetic rows with a known
miscalibration, every figure after calibration on held-out folds, a map that stores as JSON."""

import json

import numpy as np
import pytest

from sparkbatch_dagster.errors import SparkbatchError
from sparkbatch_dagster.estimate import calibration as cal

LABELS = ["admin", "net", "devel"]


def overconfident(n: int, seed: int = 0, sharpen: float = 3.0) -> tuple[np.ndarray, np.ndarray]:
    """Rows right with probability p, reported with confidence sigmoid(sharpen * logit(p)): too sure."""
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.05, 0.95, n)
    right = rng.random(n) < p
    return 1 / (1 + np.exp(-sharpen * np.log(p / (1 - p)))), right


def test_held_out_ece_and_brier_fall_after_calibrating_overconfident_scores():
    conf, right = overconfident(1500)
    report = cal.calibrate(conf, right, model="m@1", labels=LABELS)
    assert report.calibration.method != "none"
    assert report.after.ece < report.before.ece / 2, (report.before, report.after)
    assert report.after.brier < report.before.brier
    # `after` is held out all the way: the nested predictions, one per row, kept in the report
    held = cal.nested(conf, right.astype(int), seed=0)
    assert report.held_out == pytest.approx(tuple(held))
    assert report.after.brier == pytest.approx(cal.brier(held, right))
    assert report.after.ece == pytest.approx(cal.ece(held, right))


def test_the_chosen_method_is_the_one_with_the_lowest_held_out_brier():
    conf, right = overconfident(800, seed=3)
    report = cal.calibrate(conf, right, model="m", labels=LABELS)
    assert {c.method for c in report.candidates} == set(cal.METHODS)
    best = min(report.candidates, key=lambda c: c.held_out.brier)
    assert report.calibration.method == best.method


def test_after_is_nested_the_method_chosen_inside_each_fold_not_the_best_of_four_where_scored():
    # Pure noise: the best of four on the folds it is scored on beats the raw confidence by luck;
    # chosen inside each fold, the figure after is no better than the best candidate's, and the
    # reported figure is never the in-sample pick's.
    rng = np.random.default_rng(11)
    conf = rng.uniform(0, 1, 400)
    right = rng.random(400) < 0.5
    report = cal.calibrate(conf, right, model="m", labels=LABELS)
    best = min(c.held_out.brier for c in report.candidates)
    assert report.after.brier >= best - 1e-12
    assert report.after.brier == pytest.approx(cal.brier(cal.nested(conf, right.astype(int)), right))


def test_well_calibrated_scores_keep_a_map_no_worse_than_none():
    rng = np.random.default_rng(5)
    conf = rng.uniform(0, 1, 1000)
    right = rng.random(1000) < conf
    report = cal.calibrate(conf, right, model="m", labels=LABELS)
    none = next(c for c in report.candidates if c.method == "none")
    # nested: the method is chosen inside each fold, so a fold may pick a map that does a little worse
    assert report.after.brier <= none.held_out.brier + 0.005


def test_isotonic_and_logistic_maps_are_monotone():
    conf, right = overconfident(600, seed=1)
    grid = np.linspace(0, 1, 501)
    for method in ("isotonic", "platt", "temperature"):
        fitted = cal.fit(method, conf, right, "m", LABELS)
        out = fitted.apply(grid)
        assert np.all(np.diff(out) >= -1e-12), method
        assert out.min() >= 0 and out.max() <= 1
    iso = cal.fit("isotonic", conf, right, "m", LABELS)
    assert list(iso.x) == sorted(iso.x) and list(iso.y) == sorted(iso.y)


def test_a_confidence_that_falls_as_accuracy_rises_gets_a_flat_map_not_a_reversed_one():
    conf, right = overconfident(600, seed=2)
    fitted = cal.fit("platt", conf, ~right, "m", LABELS)  # anti-correlated on purpose
    out = fitted.apply(np.linspace(0, 1, 11))
    assert np.all(np.diff(out) >= 0) and fitted.slope == 0.0


def test_scores_on_noise_are_held_out_never_in_sample():
    """Confidence unrelated to being right: isotonic fitted and scored on the same rows looks far
    better than it is; the report must carry the held-out figure."""
    rng = np.random.default_rng(7)
    conf = rng.uniform(0, 1, 40)
    right = rng.random(40) < 0.5
    in_sample = cal.brier(cal.fit("isotonic", conf, right, "m", LABELS).apply(conf), right)
    report = cal.calibrate(conf, right, model="m", labels=LABELS)
    iso = next(c for c in report.candidates if c.method == "isotonic")
    assert iso.held_out.brier > in_sample + 0.02, (iso.held_out.brier, in_sample)
    # isotonic is the least-squares monotone fit, so chosen in-sample it would always win; held out it loses
    assert report.calibration.method != "isotonic"


def test_too_few_gold_rows_mean_no_map_with_the_minimum_stated():
    conf, right = overconfident(cal.MIN_ROWS - 1)
    report = cal.calibrate(conf, right, model="m", labels=LABELS)
    assert report.calibration.method == "none" and report.candidates == ()
    assert f"at least {cal.MIN_ROWS}" in report.calibration.reason
    assert report.after == report.before
    all_right = cal.calibrate(np.full(100, 0.9), np.ones(100, bool), model="m", labels=LABELS)
    assert all_right.calibration.method == "none" and "0 wrong" in all_right.calibration.reason
    with pytest.raises(SparkbatchError, match="at least"):
        cal.cross_validated("isotonic", conf, right)


def test_ece_brier_and_the_reliability_table_by_hand():
    conf = [0.05, 0.15, 0.95, 1.0, 0.92]
    right = [False, True, True, False, True]
    assert cal.brier(conf, right) == pytest.approx(np.mean([0.05**2, 0.85**2, 0.05**2, 1.0, 0.08**2]))
    table = cal.reliability_table(conf, right)
    assert [(t.bin, t.rows) for t in table] == [(0, 1), (1, 1), (9, 3)]
    top = table[-1]
    assert top.accuracy == pytest.approx(2 / 3) and top.mean_confidence == pytest.approx((0.95 + 1 + 0.92) / 3)
    want = (1 * 0.05 + 1 * 0.85 + 3 * abs(2 / 3 - top.mean_confidence)) / 5
    assert cal.ece(conf, right) == pytest.approx(want)


def test_save_and_load_round_trip_as_plain_json(tmp_path):
    conf, right = overconfident(500)
    for method in ("isotonic", "platt"):
        fitted = cal.fit(method, conf, right, "SmolLM2-135M-Instruct@18aaa4f642ee", LABELS)
        path = cal.save(fitted, tmp_path, LABELS)
        json.loads(path.read_text())  # plain JSON, no pickle
        back = cal.load(tmp_path, "SmolLM2-135M-Instruct@18aaa4f642ee", list(reversed(LABELS)))
        assert back == fitted
        assert np.array_equal(back.apply(conf), fitted.apply(conf))
    assert cal.load(tmp_path, "other-model", LABELS) is None
    assert cal.load(tmp_path, "SmolLM2-135M-Instruct@18aaa4f642ee", ["admin", "net"]) is None


def test_the_key_differs_per_model_and_label_set_and_is_a_safe_file_name():
    a = cal.calibration_key("/models/qwen-8b@quantization=fp8", LABELS)
    assert a == cal.calibration_key("/models/qwen-8b@quantization=fp8", sorted(LABELS))
    assert a != cal.calibration_key("/models/qwen-8b@quantization=fp8", LABELS[:2])
    assert a != cal.calibration_key("/models/qwen-8b", LABELS)
    assert "/" not in a and a.startswith("qwen-8b-") and a.endswith(".json")


def test_a_damaged_file_is_left_out_and_a_wrong_label_set_stops_naming_the_file(tmp_path, caplog):
    fitted = cal.fit("platt", *overconfident(200), "m", LABELS)
    path = cal.save(fitted, tmp_path, LABELS)
    path.write_text('{"method": "magic"}')
    assert cal.load(tmp_path, "m", LABELS) is None  # never used (issue 60 item 7: the run sets it aside)
    assert str(path) in caplog.text
    with pytest.raises(SparkbatchError, match="label set it was not fitted on"):
        cal.save(fitted, tmp_path, ["x"])


def test_bad_rows_are_refused_with_the_fix():
    with pytest.raises(SparkbatchError, match="outside"):
        cal.brier([1.5], [True])
    with pytest.raises(SparkbatchError, match="one of each"):
        cal.ece([0.5, 0.4], [True])
