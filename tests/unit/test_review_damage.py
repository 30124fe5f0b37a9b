"""Damaged or out-of-range review files on a folder home (issue 60, item 7): a calibration, the review
threshold or a reviewers' label file that does not parse, or holds numbers no reader may use, is left
out by every reader (one warning line, nothing written) and set aside by a writer (``review_store.heal``:
``<name>.broken-<time>``, kept); labels come back from the other files and a new import. The bucket
side is tests/e2e/test_review_heal_bucket.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkbatch_dagster.errors import SparkbatchError
from sparkbatch_dagster.home import JobHome
from sparkbatch_dagster.run import calibration_map as cm
from sparkbatch_dagster.run import human_labels as hl
from sparkbatch_dagster.run.review_marks import Marks
from sparkbatch_dagster.run.review_queue import (
    Interval,
    ReviewThreshold,
    load_threshold,
    save_threshold,
    threshold_path,
)
from sparkbatch_dagster.run.review_store import heal
from testkit import make_spec

LABELS = ["fruit", "vehicle", "animal"]
DIGEST = cm.labels_digest(LABELS)
GRID = np.linspace(0.0, 1.0, 201)
SHARE = Interval(value=0.1, low=0.05, high=0.2, count=9, of=90)


def usable(cal: cm.Calibration) -> bool:
    """The oracle: a map a confidence may go through gives a finite number in [0, 1] for every
    confidence, never falling as the confidence rises."""
    with np.errstate(all="ignore"):
        out = cal.apply(GRID)
    return bool(np.all(np.isfinite(out)) and np.all((out >= 0) & (out <= 1)) and np.all(np.diff(out) >= -1e-12))


numbers = st.one_of(st.floats(-3, 3), st.sampled_from([math.nan, math.inf, -math.inf, 5.0, -0.5, 0.0, 1.0]))


@st.composite
def maps(draw: st.DrawFn) -> cm.Calibration:
    method = draw(st.sampled_from(["none", "temperature", "platt", "isotonic"]))
    if method == "isotonic":
        n = draw(st.integers(1, 6))
        xs, ys = draw(st.lists(numbers, min_size=n, max_size=n)), draw(st.lists(numbers, min_size=n, max_size=n))
        if draw(st.booleans()):  # the shape a fit makes, sometimes pushed out of range
            xs, ys = sorted(abs(x) % 1.0 for x in xs if math.isfinite(x)), sorted(ys)
            ys = ys[:len(xs)]
            xs = xs[:len(ys)]
        return cm.Calibration(method="isotonic", model="m@1", labels_digest=DIGEST, rows=50, x=tuple(xs), y=tuple(ys))
    return cm.Calibration(method=method, model="m@1", labels_digest=DIGEST, rows=50, slope=draw(numbers),
                          intercept=draw(numbers), ece_after=draw(st.sampled_from([None, 0.02, 1.5, math.nan])))


@settings(max_examples=400, deadline=None)
@given(maps())
def test_a_map_readers_accept_is_one_the_oracle_finds_usable(cal):
    if cm.problem(cal) is None:
        assert usable(cal), cal
    else:  # and what is refused is never stored
        with pytest.raises(SparkbatchError, match="out of range"):
            cm.save(cal, Path("/nonexistent"), LABELS)


def _write(folder: Path, cal: cm.Calibration, labels: list[str] = LABELS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / cm.calibration_key(cal.model, labels)
    path.write_text(cal.model_dump_json())  # as a damaged or tampered copy would be: not through save()
    return path


BAD_MAPS = {
    "every confidence to 5.0": dict(method="isotonic", x=(0.0, 1.0), y=(5.0, 5.0)),
    "NaN": dict(method="platt", slope=math.nan, intercept=0.0),
    "non-monotone isotonic": dict(method="isotonic", x=(0.1, 0.9), y=(0.8, 0.2)),
    "decreasing platt": dict(method="platt", slope=-1.0, intercept=0.0),
}


@pytest.mark.parametrize("case", [*BAD_MAPS, "wrong label set", "truncated", "garbled"])
def test_a_damaged_or_out_of_range_calibration_is_never_used_and_a_writer_sets_it_aside(tmp_path, case, caplog):
    spec = make_spec(tmp_path, review={"budget": 0.1})
    home = JobHome(spec.home_path)
    good = cm.Calibration(method="platt", model="good@1", labels_digest=DIGEST, rows=50, slope=0.5, intercept=0.1)
    cm.save(good, home.calibration_dir, LABELS)
    if case in BAD_MAPS:
        path = _write(home.calibration_dir, cm.Calibration(model="m@1", labels_digest=DIGEST, rows=50,
                                                           **BAD_MAPS[case]))  # type: ignore[arg-type]
    elif case == "wrong label set":  # another label set's map under this one's name
        other = cm.Calibration(method="platt", model="m@1", labels_digest=cm.labels_digest(["x", "y"]), rows=50,
                               slope=1.0, intercept=0.0)
        path = home.calibration_dir / cm.calibration_key("m@1", LABELS)
        path.write_text(other.model_dump_json())
    else:
        path = _write(home.calibration_dir, good.model_copy(update={"model": "m@1"}))
        whole = path.read_bytes()
        path.write_bytes(whole[: len(whole) // 2] if case == "truncated" else whole.replace(b'"', b"\x00", 3))
    bad = path.read_bytes()
    # Readers: left out, the other map still used, nothing written.
    assert cm.load(home.calibration_dir, "m@1", LABELS) is None
    assert cm.stored(home.calibration_dir, LABELS) == {"good@1": good}
    assert Marks.of(spec, home).calibrations == {"good@1": good}
    assert path.read_bytes() == bad and "is left out" in caplog.text
    # A writer: set aside, kept byte for byte; the good one stays.
    heal(home)
    assert not path.exists()
    [aside] = path.parent.glob(f"{path.name}.broken-*")
    assert aside.read_bytes() == bad and "set aside as" in caplog.text
    assert cm.stored(home.calibration_dir, LABELS) == {"good@1": good} and cm.damaged(home.calibration_dir) == []


def _plan(**change: object) -> ReviewThreshold:
    fields: dict[str, object] = dict(asked="budget", target=0.1, threshold=0.37, reviewed=SHARE, caught=SHARE,
                                     gold_rows=90, errors=20, folds=5)
    return ReviewThreshold(**{**fields, **change})  # type: ignore[arg-type]


@pytest.mark.parametrize("damage", ["truncated", "threshold 5.0", "threshold NaN", "share 1.5", "negative count"])
def test_a_damaged_threshold_is_left_out_and_set_aside(tmp_path, damage, caplog):
    home = JobHome(tmp_path / "home")
    path = save_threshold(home, _plan())
    assert load_threshold(home) == _plan()
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:40])
    else:
        body = json.loads(path.read_text())
        if damage.startswith("threshold"):
            body["threshold"] = 5.0 if "5.0" in damage else math.nan
        elif damage == "share 1.5":
            body["caught"]["value"] = 1.5
        else:
            body["errors"] = -3
        path.write_text(json.dumps(body))
    bad = path.read_bytes()
    assert load_threshold(home) is None and "is left out" in caplog.text and path.read_bytes() == bad
    heal(home)
    assert not threshold_path(home).exists()
    [aside] = path.parent.glob("threshold.json.broken-*")
    assert aside.read_bytes() == bad
    save_threshold(home, _plan(threshold=0.2))  # the next analytics writes it again
    assert load_threshold(home) == _plan(threshold=0.2)


def lab(row: str, label: str, when: str = "2026-12-06T10:00:00Z") -> hl.HumanLabel:
    return hl.HumanLabel.of(row, label, "ann@example.com", when, f"label-studio:1/{row}/1", LABELS)


@pytest.mark.parametrize("damage", ["truncated", "tampered"])
def test_a_damaged_label_file_is_left_out_set_aside_and_its_labels_come_back_from_an_import(tmp_path, damage,
                                                                                              caplog):
    home = JobHome(tmp_path / "home")
    first = hl.merge(home, [lab("r1", "fruit"), lab("r2", "animal")], LABELS).path
    second = hl.merge(home, [lab("r2", "vehicle", when="2026-12-06T11:00:00Z"), lab("r3", "animal")], LABELS).path
    assert first is not None and second is not None
    if damage == "truncated":
        second.write_bytes(second.read_bytes()[:-30])
    else:  # still Parquet, one label changed: its name is no longer the digest of what it holds
        table = pq.read_table(second)
        pq.write_table(table.set_column(1, "label", pa.array(["fruit", "animal"])), second)
    bad = second.read_bytes()
    # A reader: the other file's labels, nothing written (r2 falls back to the older review).
    got = hl.load(home, LABELS)
    assert {k: v.label for k, v in got.items()} == {"r1": "fruit", "r2": "animal"}
    assert "is left out" in caplog.text and second.read_bytes() == bad
    # A writer: set aside, kept; the loss said, with the fix.
    assert hl.heal(home) == [second.name]
    assert not second.exists() and [p.read_bytes() for p in second.parent.glob(f"{second.name}.broken-*")] == [bad]
    assert "lost from the store" in caplog.text and "sparkbatch review import" in caplog.text
    # Importing the same annotations again brings them back, as the same file.
    again = hl.merge(home, [lab("r2", "vehicle", when="2026-12-06T11:00:00Z"), lab("r3", "animal")], LABELS)
    assert again.path == second and again.changed == 1 and again.added == 1
    assert {k: v.label for k, v in hl.load(home, LABELS).items()} == {"r1": "fruit", "r2": "vehicle", "r3": "animal"}


def test_whole_files_are_never_set_aside(tmp_path):
    spec = make_spec(tmp_path, review={"budget": 0.1})
    home = JobHome(spec.home_path)
    cm.save(cm.Calibration(method="isotonic", model="m@1", labels_digest=DIGEST, rows=50, x=(0.1, 0.9),
                           y=(0.0, 1.0)), home.calibration_dir, LABELS)
    save_threshold(home, _plan())
    hl.merge(home, [lab("r1", "fruit")], LABELS)
    before = sorted(p.relative_to(home.root) for p in home.root.rglob("*") if p.is_file())
    heal(home)
    assert sorted(p.relative_to(home.root) for p in home.root.rglob("*") if p.is_file()) == before


def oracle(imports: list[list[hl.HumanLabel]]) -> dict[str, str]:
    """Each row's label as the reviewers left it: the latest review of all imports (ties: the store's order)."""
    best: dict[str, hl.HumanLabel] = {}
    for h in (h for batch in imports for h in batch):
        if h.row_id not in best or h.order() > best[h.row_id].order():
            best[h.row_id] = h
    return {r: h.label for r, h in best.items()}


reviews = st.lists(st.lists(st.tuples(st.sampled_from(["r1", "r2", "r3", "r4"]), st.sampled_from(LABELS),
                                      st.integers(0, 5)), min_size=1, max_size=4), min_size=1, max_size=4)


@settings(max_examples=40, deadline=None)
@given(reviews, st.data())
def test_damaged_label_files_lose_no_label_once_their_imports_come_again(tmp_path_factory, batches, data):
    home = JobHome(tmp_path_factory.mktemp("home"))
    imports = [[lab(r, label, when=f"2026-12-06T1{t}:00:00Z") for r, label, t in batch] for batch in batches]
    for found in imports:
        hl.merge(home, found, LABELS)
    files = sorted(hl.labels_folder(home).glob("*.parquet"))
    for path in data.draw(st.lists(st.sampled_from(files), unique=True)) if files else []:
        path.write_bytes(path.read_bytes()[: data.draw(st.integers(0, path.stat().st_size - 1))])
    hl.heal(home)  # the damaged files set aside, their loss said
    for found in imports:  # `sparkbatch review import` again: Label Studio still holds every annotation
        hl.merge(home, found, LABELS)
    assert {r: h.label for r, h in hl.load(home, LABELS).items()} == oracle(imports)
