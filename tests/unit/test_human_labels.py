"""The human labels store (run/human_labels.py): append-only files named by their content, the
latest review per row winning, idempotent merges, labels outside the job's set refused or skipped."""

from __future__ import annotations

import shutil

import pyarrow.parquet as pq
import pytest

from sparkbatch_dagster.errors import SparkbatchError
from sparkbatch_dagster.estimate.calibration import labels_digest as estimate_digest
from sparkbatch_dagster.home import JobHome
from sparkbatch_dagster.run import human_labels as hl
from sparkbatch_dagster.run.human_labels import HumanLabel, load, merge

LABELS = ["fruit", "vehicle", "animal"]


def lab(row: str, label: str, when: str = "2026-12-06T10:00:00Z", who: str = "ann@example.com",
        source: str = "label-studio:things/1/1") -> HumanLabel:
    return HumanLabel.of(row, label, who, when, source, LABELS)


def files(home: JobHome) -> list[str]:
    return sorted(p.name for p in hl.labels_folder(home).glob("*.parquet"))


def test_a_merge_is_read_back_with_who_and_when(tmp_path):
    home = JobHome(tmp_path / "home")
    done = merge(home, [lab("r1", "fruit"), lab("r2", "animal", when="2026-12-06T12:30:00+02:00", who="bob")], LABELS)
    assert (done.added, done.changed, done.unchanged) == (2, 0, 0)
    assert done.path is not None and done.path.parent == home.review_dir / "labels"
    got = load(home, LABELS)
    assert set(got) == {"r1", "r2"} and got.skipped == 0 and got.files == 1
    assert got["r2"].label == "animal" and got["r2"].reviewer == "bob"
    assert got["r2"].reviewed_at == "2026-12-06T10:30:00.000000+00:00"  # UTC, one spelling
    assert got["r1"].labels_digest == estimate_digest(LABELS) == hl.labels_digest(reversed(LABELS))
    assert pq.read_table(done.path).column_names == list(hl.COLUMNS)


def test_merging_the_same_labels_again_writes_nothing(tmp_path):
    home = JobHome(tmp_path / "home")
    batch = [lab("r1", "fruit"), lab("r2", "vehicle")]
    first = merge(home, batch, LABELS)
    again = merge(home, list(reversed(batch)), LABELS)
    assert (again.added, again.changed, again.unchanged, again.path) == (0, 0, 2, None)
    assert files(home) == [first.path.name]  # type: ignore[union-attr]
    assert merge(home, [], LABELS).path is None


def test_a_newer_review_replaces_the_row_and_an_older_one_changes_nothing(tmp_path):
    home = JobHome(tmp_path / "home")
    merge(home, [lab("r1", "fruit", when="2026-12-06T10:00:00Z")], LABELS)
    newer = merge(home, [lab("r1", "animal", when="2026-12-06T11:00:00Z", who="bob"), lab("r2", "fruit")], LABELS)
    assert (newer.added, newer.changed, newer.unchanged) == (1, 1, 0)
    older = merge(home, [lab("r1", "vehicle", when="2026-12-06T09:00:00Z")], LABELS)
    assert (older.added, older.changed, older.unchanged, older.path) == (0, 0, 1, None)
    got = load(home, LABELS)
    assert (got["r1"].label, got["r1"].reviewer) == ("animal", "bob")
    assert len(files(home)) == 2
    # In one batch, the latest label of a row is the one merged.
    one_batch = [lab("r3", "fruit", when="2026-12-06T10:00:00Z"), lab("r3", "vehicle", when="2026-12-06T10:05Z")]
    both = merge(home, one_batch, LABELS)
    assert both.added == 1 and load(home, LABELS)["r3"].label == "vehicle"


def test_two_boxes_merging_at_once_keep_each_others_labels(tmp_path):
    """Two caches of one home each merge what they imported; their files meet in the home (as a
    bucket home's pull brings them): nothing is lost, and the same import on both is one file."""
    a, b, shared = JobHome(tmp_path / "a"), JobHome(tmp_path / "b"), JobHome(tmp_path / "shared")
    same = [lab("r9", "fruit")]
    merge(a, [lab("r1", "fruit"), *same], LABELS)
    merge(b, [lab("r2", "vehicle"), *same], LABELS)
    merge(a, [lab("r1", "animal", when="2026-12-06T11:00:00Z")], LABELS)
    merge(b, same, LABELS)  # nothing new here
    for box in (a, b):
        for f in hl.labels_folder(box).glob("*.parquet"):
            hl.labels_folder(shared).mkdir(parents=True, exist_ok=True)
            shutil.copy(f, hl.labels_folder(shared) / f.name)
    got = load(shared, LABELS)
    assert {k: v.label for k, v in got.items()} == {"r1": "animal", "r2": "vehicle", "r9": "fruit"}
    # The same content makes the same file name: merging ``same`` alone on two boxes names one file.
    c, d = JobHome(tmp_path / "c"), JobHome(tmp_path / "d")
    assert merge(c, same, LABELS).path.name == merge(d, same, LABELS).path.name  # type: ignore[union-attr]


def test_a_tie_on_reviewed_at_is_broken_the_same_way_whatever_the_file_order(tmp_path):
    x = lab("r1", "fruit", source="label-studio:things/1/7")
    y = lab("r1", "animal", source="label-studio:things/1/9")
    one, two = JobHome(tmp_path / "one"), JobHome(tmp_path / "two")
    merge(one, [x], LABELS)
    merge(one, [y], LABELS)
    merge(two, [y], LABELS)
    merge(two, [x], LABELS)
    assert load(one, LABELS)["r1"] == load(two, LABELS)["r1"] == y


def test_a_label_outside_the_jobs_set_is_refused_naming_the_row_and_label(tmp_path):
    home = JobHome(tmp_path / "home")
    bad = HumanLabel.of("r7", "plant", "ann", "2026-12-06T10:00:00Z", "label-studio:things/1/3", LABELS)
    with pytest.raises(SparkbatchError, match=r"row 'r7': label 'plant' .* is not one of the job's labels "
                                              r"\['animal', 'fruit', 'vehicle'\]: correct it"):
        merge(home, [lab("r1", "fruit"), bad], LABELS)
    assert files(home) == []  # the whole merge refused, nothing written
    with pytest.raises(SparkbatchError, match="need a label job"):
        merge(home, [lab("r1", "fruit")], [])


def test_labels_no_longer_in_the_set_are_skipped_and_counted(tmp_path):
    home = JobHome(tmp_path / "home")
    merge(home, [lab("r1", "fruit"), lab("r2", "vehicle"), lab("r3", "animal")], LABELS)
    got = load(home, ["fruit", "animal", "plant"])
    assert set(got) == {"r1", "r3"} and got.skipped == 1
    assert set(load(home, [])) == {"r1", "r2", "r3"}  # no label set (a JSON job): nothing to skip by


def test_times_are_kept_in_utc_and_a_time_without_a_zone_is_refused():
    assert hl.utc_iso("2026-12-06T13:50:45.821385Z") == "2026-12-06T13:50:45.821385+00:00"
    assert hl.utc_iso("2026-12-06T15:50:45+02:00") == "2026-12-06T13:50:45.000000+00:00"
    with pytest.raises(SparkbatchError, match="has no time zone"):
        hl.utc_iso("2026-12-06T13:50:45")
    with pytest.raises(SparkbatchError, match="is not an ISO-8601 time"):
        hl.utc_iso("yesterday")


def test_a_damaged_file_is_left_out_naming_it_and_the_fix(tmp_path, caplog):
    home = JobHome(tmp_path / "home")
    merge(home, [lab("r1", "fruit")], LABELS)
    (hl.labels_folder(home) / "0000.parquet").write_bytes(b"not parquet")
    got = load(home, LABELS)
    assert set(got) == {"r1"} and got.files == 2  # the whole file's labels, and the damaged one counted
    assert "0000.parquet is left out (not a human-labels file: " in caplog.text and "review import" in caplog.text


def test_no_store_yet_loads_empty(tmp_path):
    got = load(JobHome(tmp_path / "home"), LABELS)
    assert got == {} and got.files == 0 and hl.pull(JobHome(tmp_path / "home")) == 0
