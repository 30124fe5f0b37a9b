"""The human labels store (run/human_labels.py) in a bucket home (moto's S3 on loopback): two boxes,
each with its own cache of one bucket, import at once; each sees both imports, and the same import
on both is one object."""

from __future__ import annotations

from sparkbatch_dagster.home import open_home
from sparkbatch_dagster.run import human_labels as hl
from sparkbatch_dagster.run.human_labels import HumanLabel, load, merge

LABELS = ["fruit", "vehicle", "animal"]


def lab(row: str, label: str, when: str = "2026-12-06T10:00:00Z", who: str = "ann") -> HumanLabel:
    return HumanLabel.of(row, label, who, when, f"label-studio:1/{row}/1", LABELS)


def test_two_boxes_importing_into_one_bucket_keep_each_others_labels(tmp_path, s3_bucket):
    url = f"s3://{s3_bucket}/jobs/things"
    a, b = open_home(url, tmp_path / "cache-a"), open_home(url, tmp_path / "cache-b")
    same = lab("r9", "animal")
    # b merges after a: it pulls a's object first, so r9 (imported on both) is not written twice.
    first_a = merge(a, [lab("r1", "fruit"), same], LABELS)
    first_b = merge(b, [lab("r2", "vehicle"), same], LABELS)
    assert (first_a.added, first_b.added) == (2, 1) and first_b.unchanged == 1  # b pulled a's r9
    assert set(load(a, LABELS)) == {"r1", "r9"}  # a has not pulled b's yet
    assert hl.pull(a) == 1
    assert {k: v.label for k, v in load(a, LABELS).items()} == {"r1": "fruit", "r2": "vehicle", "r9": "animal"}
    # A newer review on b reaches a; the bucket holds one object per merge that added something.
    merge(b, [lab("r1", "animal", when="2026-12-06T11:00:00Z", who="bob")], LABELS)
    hl.pull(a)
    assert (load(a, LABELS)["r1"].label, load(a, LABELS)["r1"].reviewer) == ("animal", "bob")
    objects = a.remote.bucket.list(a.remote.rel(hl.labels_folder(a)))  # type: ignore[union-attr]
    assert len(objects) == 3 and all(n.endswith(".parquet") for n in objects)
    # Importing the same again on either box writes nothing.
    assert merge(a, [lab("r2", "vehicle"), same], LABELS).path is None
    assert len(a.remote.bucket.list(a.remote.rel(hl.labels_folder(a)))) == 3  # type: ignore[union-attr]
