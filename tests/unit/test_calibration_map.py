"""A fitted calibration as runs and views use it (run/calibration_map.py): the SQL a view computes
equals the map in Python for every method, each model's rows get their own model's map, and rows
written by a run carry the calibrated confidence beside the raw one (run/review_marks.py)."""

import duckdb
import numpy as np
import pytest

from sparkbatch_dagster.estimate import calibration as cal
from sparkbatch_dagster.run import calibration_map as cm
from sparkbatch_dagster.run.checkpoint import rows_table
from sparkbatch_dagster.run.open_shard import new_answers
from sparkbatch_dagster.run.records import OutputRow
from sparkbatch_dagster.run.review_marks import Marks

LABELS = ["fruit", "vehicle", "animal"]


def overconfident(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.05, 0.95, n)
    return 1 / (1 + np.exp(-3 * np.log(p / (1 - p)))), rng.random(n) < p


def in_sql(calibration: cm.Calibration, values: np.ndarray) -> np.ndarray:
    con = duckdb.connect()
    con.execute("CREATE TABLE t (i INTEGER, c DOUBLE)")
    con.executemany("INSERT INTO t VALUES (?, ?)", [[i, float(v)] for i, v in enumerate(values)])
    return np.array([r[0] for r in con.execute(f"SELECT {calibration.sql('c')} FROM t ORDER BY i").fetchall()])


@pytest.mark.parametrize("method", ["none", "temperature", "platt", "isotonic"])
def test_the_views_sql_computes_the_same_map_as_python(method):
    conf, right = overconfident(600)
    fitted = cal.fit(method, conf, right, "m@1", LABELS)
    grid = np.concatenate([np.linspace(0, 1, 401), [0.0, 1.0, 1e-9, 1 - 1e-9], conf[:50]])
    assert np.allclose(in_sql(fitted, grid), fitted.apply(grid), atol=1e-9)


def test_an_isotonic_map_of_one_breakpoint_is_a_constant_in_sql_too():
    one = cm.Calibration(method="isotonic", model="m", labels_digest=cm.labels_digest(LABELS), rows=40,
                         x=(0.5,), y=(0.3,))
    assert np.allclose(in_sql(one, np.array([0.1, 0.5, 0.9])), one.apply([0.1, 0.5, 0.9]))


def test_each_model_gets_its_own_map_and_an_unknown_model_its_raw_confidence(tmp_path):
    a = cm.Calibration(method="platt", model="a@1", labels_digest=cm.labels_digest(LABELS), rows=50, slope=0.5,
                       intercept=-1.0)
    b = cm.Calibration(method="temperature", model="b'x@2", labels_digest=cm.labels_digest(LABELS), rows=50,
                       slope=2.0, intercept=0.0)
    for c in (a, b):
        cm.save(c, tmp_path, LABELS)
    other = cm.Calibration(method="platt", model="a@1", labels_digest=cm.labels_digest(["x", "y"]), rows=50,
                           slope=9.0, intercept=0.0)
    cm.save(other, tmp_path, ["x", "y"])  # another label set's: never applied to this one
    found = cm.stored(tmp_path, LABELS)
    assert found == {"a@1": a, "b'x@2": b}
    con = duckdb.connect()
    rows = [("a@1", 0.7), ("b'x@2", 0.7), ("c@3", 0.7)]
    got = con.execute(f"SELECT {cm.confidence_sql(found, 'raw', 'model')} FROM (VALUES "
                      + ", ".join(f"('{m.replace(chr(39), chr(39) * 2)}', {c})" for m, c in rows)
                      + ") t(model, raw)").fetchall()
    assert [g[0] for g in got] == pytest.approx([float(a.apply(0.7)), float(b.apply(0.7)), 0.7])


def test_a_damaged_calibration_file_is_left_out_with_one_line_not_a_stop(tmp_path, caplog):
    path = tmp_path / cm.calibration_key("m@1", LABELS)
    path.write_text("{not json")
    assert cm.load(tmp_path, "m@1", LABELS) is None and cm.stored(tmp_path, LABELS) == {}
    said = [r.getMessage() for r in caplog.records if "is left out" in r.getMessage()]
    assert len(said) == 1 and str(path) in said[0] and "raw ones" in said[0]  # once, however often it is read
    assert cm.damaged(tmp_path) == [(path, cm.read(path))]  # for a writer to set aside: test_review_damage.py


def _row(rid: str, output: str | None, confidence: float | None, model: str = "a@1", **kw: object) -> OutputRow:
    return OutputRow(row_id=rid, output=output, error=None if output else "bad_output: x", prompt_tokens=3,
                     output_tokens=1, cached_tokens=0, deduplicated=False, reused=False,
                     prompt_key=f"k-{rid}", fingerprint="v1", model=model, finish_reason="stop", truncated=False,
                     confidence=confidence, reasoning=None, reasoning_tokens=0, **kw)  # type: ignore[arg-type]


def test_a_run_writes_the_calibrated_confidence_and_keeps_the_raw_one():
    a = cm.Calibration(method="platt", model="a@1", labels_digest=cm.labels_digest(LABELS), rows=50, slope=0.5,
                       intercept=-1.0)
    marks = Marks(calibrations={"a@1": a})
    out = marks.apply(_row("r1", "fruit", 0.9))
    assert out.raw_confidence == 0.9 and out.confidence == pytest.approx(float(a.apply(0.9)), abs=1e-6)
    other = marks.apply(_row("r2", "fruit", 0.9, model="b@1"))  # no calibration of b: its own number
    assert other.raw_confidence == other.confidence == 0.9
    failed = marks.apply(_row("r3", None, None))
    assert failed.confidence is None and failed.raw_confidence is None


def test_the_result_store_keeps_the_models_raw_confidence_and_never_a_reviewers_label():
    from sparkbatch_dagster.run.human_labels import HumanLabel

    a = cm.Calibration(method="platt", model="a@1", labels_digest=cm.labels_digest(LABELS), rows=50, slope=0.5,
                       intercept=-1.0)
    seen = HumanLabel(row_id="r2", label="animal", reviewer="ann@example.com", reviewed_at="2026-12-06T10:00:00Z",
                      source="label-studio:1/2/3", labels_digest=cm.labels_digest(LABELS))
    marks = Marks(calibrations={"a@1": a}, human={"r2": seen})
    rows = [marks.apply(_row("r1", "fruit", 0.9)), marks.apply(_row("r2", "fruit", 0.8))]
    assert rows[1].output == "animal" and rows[1].model_output == "fruit"
    assert (rows[1].reviewed_by, rows[1].reviewed_at) == ("ann@example.com", "2026-12-06T10:00:00Z")
    stored = new_answers(rows_table(rows))
    assert [(s["prompt_key"], s["output"], s["confidence"]) for s in stored] == [("k-r1", "fruit", 0.9)]
