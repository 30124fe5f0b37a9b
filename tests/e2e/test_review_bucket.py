"""What the review learns travels between boxes of one bucket home (moto's S3 on loopback): box A's
analytics stores a calibration and a review threshold and publishes them; box B's run pulls them
(``review_marks.pull``) and writes its rows calibrated, and its views read B's copy of the threshold.
A calibration refitted on A replaces B's copy at B's next pull."""

from __future__ import annotations

from sparkbatch_dagster.home import open_home
from sparkbatch_dagster.run import calibration_map as cm
from sparkbatch_dagster.run import review_marks
from sparkbatch_dagster.run.records import OutputRow
from sparkbatch_dagster.run.review_queue import Interval, ReviewThreshold, save_threshold, threshold_of
from testkit import make_spec

LABELS = ["fruit", "vehicle", "animal"]
SHARE = Interval(value=0.5, low=0.3, high=0.7, count=10, of=20)


def _map(slope: float) -> cm.Calibration:
    return cm.Calibration(method="platt", model="m@1", labels_digest=cm.labels_digest(LABELS), rows=90, slope=slope,
                          intercept=-0.5)


def _row() -> OutputRow:
    return OutputRow(row_id="r1", output="fruit", error=None, prompt_tokens=3, output_tokens=1, cached_tokens=0,
                     deduplicated=False, reused=False, prompt_key="k", fingerprint="v1", model="m@1",
                     finish_reason="stop", truncated=False, confidence=0.8, reasoning=None, reasoning_tokens=0)


def test_a_calibration_and_threshold_fitted_on_one_box_reach_the_others_run(tmp_path, s3_bucket):
    url = f"s3://{s3_bucket}/jobs/things"
    a, b = open_home(url, tmp_path / "cache-a"), open_home(url, tmp_path / "cache-b")
    spec = make_spec(tmp_path, review={"budget": 0.1})
    a.publish(cm.save(_map(1.5), a.calibration_dir, LABELS))
    save_threshold(a, ReviewThreshold(asked="budget", target=0.1, threshold=0.37, reviewed=SHARE, caught=SHARE,
                                      gold_rows=90, errors=20, folds=5))
    assert review_marks.Marks.of(spec, b).calibrations == {}  # not pulled yet: b's cache has none
    assert threshold_of(spec, b).plan is None
    review_marks.pull(b)
    row = review_marks.Marks.of(spec, b).apply(_row())
    assert row.raw_confidence == 0.8 and row.confidence == round(float(_map(1.5).apply(0.8)), 6)
    assert threshold_of(spec, b).threshold == 0.37
    # Refitted on a: b's next pull replaces its copy (the file is overwritten, not appended).
    a.publish(cm.save(_map(0.5), a.calibration_dir, LABELS))
    review_marks.pull(b)
    assert review_marks.Marks.of(spec, b).calibrations["m@1"] == _map(0.5)
