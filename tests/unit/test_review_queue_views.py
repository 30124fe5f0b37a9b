"""Review numbers a team can act on (issue 60), in-process on the fake engine and a real DuckDB:
accuracy over the rows that have a truth (the model's own apart from the one after review), a budget
that queues its share however the calibration ties, a queue that keeps its rows until a reviewer
labels or dismisses them, and the rows a downstream asset reads carrying the reviewers' labels."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sparkbatch_dagster import build_batch_assets
from sparkbatch_dagster.definitions.review_assets import _queue_metadata, publish_queue
from sparkbatch_dagster.engines import FakeEngine
from sparkbatch_dagster.inputs.shards import build_shards
from sparkbatch_dagster.run import human_labels, metrics, review_members
from sparkbatch_dagster.run.calibration_map import Calibration, labels_digest, save
from sparkbatch_dagster.run.query import read_only
from sparkbatch_dagster.run.review_queue import Interval, ReviewThreshold, save_threshold
from sparkbatch_dagster.run.truth import truth
from sparkbatch_dagster.testing import label_shard
from testkit import LABELS, fake_resource, make_rows, make_spec, write_parquet

N = 90
KNOWS = {"apple": "fruit", "car": "vehicle", "dog": "animal"}
WHEN = "2026-12-06T10:00:00+00:00"


def _job(tmp_path: Path, gold_every: int = 2, gold: Callable[[int, Any], Any] | None = None, **spec: object):
    """A finished job of N rows, gold on every ``gold_every``-th row only (None elsewhere), or
    ``gold(i, label)`` on row i."""
    rows = make_rows(N)
    for i, r in enumerate(rows):
        r["gold"] = gold(i, r["gold"]) if gold else r["gold"] if i % gold_every == 0 else None
    src = write_parquet(tmp_path / "in" / "rows.parquet", rows)
    job = build_batch_assets(spec=make_spec(tmp_path, input=str(src), shards=2, **spec))
    engine = FakeEngine(knows=KNOWS)
    build_shards(job.spec, job.home)
    res, _ = fake_resource(knows=KNOWS)
    version = job.output_version(res)
    for key in ("shard-00000", "shard-00001"):
        label_shard(job.spec, job.home, version, key, engine)
    assert job.home.advance_current(version, engine.model_id, (job.home.read_manifest() or {}).get("signature"))
    return job, version


def _q(job, version, sql: str) -> list[tuple]:
    with read_only(job.spec, job.home, version) as con:
        return con.execute(sql).fetchall()


def _label(job, row_id: str, label: str, i: int = 0) -> None:
    human_labels.merge(job.home, [human_labels.HumanLabel.of(row_id, label, "ann@example.com", WHEN,
                                                             f"label-studio:1/{i}/{i}", LABELS)], LABELS)


def test_accuracy_counts_only_rows_with_a_truth_and_a_review_does_not_lift_the_models(tmp_path):
    job, version = _job(tmp_path)
    rows = _q(job, version, "SELECT row_id, output, gold FROM labeled ORDER BY row_id")
    gold = [(r, o, g) for r, o, g in rows if g is not None]
    assert 0 < len(gold) < len(rows)  # half the rows have no truth
    want = round(sum(o == g for _, o, g in gold) / len(gold), 4)
    head = metrics.analytics(job.spec, job.home, version)
    assert head.accuracy == want and head.accuracy_rows == len(gold)
    assert head.accuracy_after_review == want and head.reviewed_gold_rows == 0
    # Each bucket: right over the rows with a truth, never over every row
    for b in head.reliability or []:
        assert b["truth_rows"] <= b["rows"]
        assert b["accuracy"] == (round(b["correct"] / b["truth_rows"], 4) if b["truth_rows"] else None)
    assert sum(b["truth_rows"] for b in head.reliability or []) == len(gold)
    view = _q(job, version, "SELECT sum(truth_rows), sum(correct) FROM reliability")[0]
    assert view == (len(gold), sum(o == g for _, o, g in gold))
    # A reviewer corrects a wrong gold row: the model's own accuracy stays, the one after review rises
    wrong = next(r for r, o, g in gold if o != g)
    _label(job, wrong, dict((r, g) for r, _, g in gold)[wrong])
    after = metrics.analytics(job.spec, job.home, version)
    assert after.accuracy == want and after.reviewed_gold_rows == 1
    assert after.accuracy_after_review == round((sum(o == g for _, o, g in gold) + 1) / len(gold), 4)


def test_a_blank_or_padded_gold_cell_is_read_as_the_estimate_reads_it(tmp_path):
    """A CSV's empty cell or a spreadsheet's blank is no truth (not a wrong answer), and a padded gold
    value is its trimmed text: the views count accuracy as ``run/truth.py`` says, as the estimate does."""
    blanks = ("", " ", "\t", None)

    def gold(i: int, label: str) -> str | None:
        return blanks[i % 4] if i % 3 == 0 else f" {label} " if i % 3 == 1 else label

    job, version = _job(tmp_path, gold=gold)
    rows = [{**r, "gold": gold(i, r["gold"])} for i, r in enumerate(make_rows(N))]
    said = dict(_q(job, version, "SELECT row_id, output FROM labeled"))
    known = {r["id"]: t for r in rows if (t := truth(r["gold"]))}
    assert 0 < len(known) < N
    head = metrics.analytics(job.spec, job.home, version)
    assert head.accuracy_rows == len(known)
    assert head.accuracy == round(sum(said[i] == t for i, t in known.items()) / len(known), 4)
    padded = [r["id"] for r in rows if isinstance(r["gold"], str) and r["gold"] != r["gold"].strip() != ""]
    assert any(said[i] == known[i] for i in padded)  # so a padded gold read untrimmed would lower it
    assert dict(_q(job, version, "SELECT row_id, gold FROM labeled WHERE gold IS NOT NULL")) == known


def _constant_map(job, value: float = 0.347) -> None:
    """A calibration that maps every confidence to one value (a model that knows nothing)."""
    model = _one_model(job)
    cal = Calibration(method="isotonic", model=model, labels_digest=labels_digest(LABELS), rows=40,
                      x=(0.0,), y=(value,))
    save(cal, job.home.calibration_dir, LABELS)


def _one_model(job) -> str:
    [model] = {m for (m,) in _q(job, job.current_version(), "SELECT DISTINCT model FROM labeled")}
    return model


@pytest.mark.parametrize("budget", [0.05, 0.1, 0.25, 1.0])
def test_a_budget_queues_its_share_even_when_the_calibration_ties_every_row(tmp_path, budget):
    job, version = _job(tmp_path, review={"budget": budget})
    _constant_map(job)
    assert {c for (c,) in _q(job, version, "SELECT DISTINCT confidence FROM labeled")} == {0.347}
    queued = _q(job, version, "SELECT row_id, raw_confidence FROM review")
    assert len(queued) == int(budget * N + 0.5)  # no plan stored: the share still holds, said so
    # Ties broken by the model's own confidence, then by row id: the least sure rows by the raw one
    every = sorted(_q(job, version, "SELECT raw_confidence, row_id FROM labeled"))
    assert [r for r, _ in queued] == [r for _, r in every[:len(queued)]]
    head = metrics.analytics(job.spec, job.home, version)
    assert head.confidence is not None and head.confidence.review_rows == len(queued)
    assert head.confidence.review_share == budget and "no plan from gold rows yet" in head.confidence.review_note


def test_a_queued_row_stays_queued_until_labeled_or_dismissed(tmp_path):
    job, version = _job(tmp_path, review={"budget": 0.2})
    assert publish_queue(job, version, "test") == 18
    first = [r for (r,) in _q(job, version, "SELECT row_id FROM review")]
    # A later plan cuts fewer rows (a threshold would have dropped them): every queued row stays
    share = Interval(value=0.05, low=0.0, high=0.1, count=2, of=45)
    save_threshold(job.home, ReviewThreshold(asked="budget", target=0.2, share=0.02, threshold=0.1, reviewed=share,
                                             caught=share, gold_rows=45, errors=20, folds=5))
    assert [r for (r,) in _q(job, version, "SELECT row_id FROM review")] == first
    # A reviewer labels one, dismisses another, skips the rest: only those two leave
    _label(job, first[0], "fruit")
    review_members.remember(job.home, [first[1]], "dismissed", by="ann@example.com", note="not a package")
    left = [r for (r,) in _q(job, version, "SELECT row_id FROM review")]
    assert left == first[2:]
    states = dict(_q(job, version, "SELECT review_state, count(*) FROM queued GROUP BY ALL"))
    assert states == {"reviewed": 1, "dismissed": 1, "waiting": 16}
    # review_complete is judged on that queue: 16 rows still wait, whatever the new plan cuts
    md = _queue_metadata(job, version)
    assert (md["queue_rows"], md["queue_reviewed"], md["queue_dismissed"], md["queue_ever"]) == (16, 1, 1, 18)
    # The same rows recorded again add no file; the store is the union
    files = sorted(review_members.queue_folder(job.home).glob("*.parquet"))
    publish_queue(job, version, "test")
    assert sorted(review_members.queue_folder(job.home).glob("*.parquet")) == files


def test_what_a_downstream_asset_reads_carries_reviewers_labels_and_calibrated_confidences(tmp_path):
    job, version = _job(tmp_path)
    before = {r["row_id"]: r for r in job.read_outputs().to_pylist()}
    _constant_map(job, 0.5)
    rid = sorted(before)[3]
    said = next(lab for lab in LABELS if lab != before[rid]["output"])
    _label(job, rid, said)
    after = {r["row_id"]: r for r in job.read_outputs().to_pylist()}
    assert after[rid]["output"] == said and after[rid]["model_output"] == before[rid]["output"]
    assert after[rid]["reviewed_by"] == "ann@example.com"
    assert {r["confidence"] for r in after.values()} == {0.5}
    assert all(after[r]["raw_confidence"] == before[r]["confidence"] for r in before)
    # the same as the views show
    view = dict(_q(job, version, "SELECT row_id, output FROM labeled"))
    assert view == {r: a["output"] for r, a in after.items()}


def test_a_job_folder_with_a_quote_in_its_path_works(tmp_path):
    job, version = _job(tmp_path / "it's ours", review={"budget": 0.1})
    head = metrics.analytics(job.spec, job.home, version)
    assert head.rows == N and head.confidence is not None and head.confidence.review_rows == 9
    assert publish_queue(job, version, "test") == 9
    assert _q(job, version, "SELECT count(*) FROM review") == [(9,)]
