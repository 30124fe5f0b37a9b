"""What counts as a row's truth (``run/truth.py``), and the estimate's accuracy over the rows that
have one: a null, empty or blank gold value is no truth, so a sample row without one is neither right
nor wrong (it was counted wrong, halving a half-labeled sample's accuracy and so the model choice)."""

from __future__ import annotations

from pathlib import Path

import duckdb
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkbatch_dagster.engines import FakeEngine
from sparkbatch_dagster.estimate.choice import wilson
from sparkbatch_dagster.estimate.forecast import predict
from sparkbatch_dagster.estimate.sample import Sample, merge, time_rows
from sparkbatch_dagster.run.truth import BLANKS, truth, truth_sql
from testkit import LABELS, WORDS, make_rows, make_spec

BLANKISH = st.text(alphabet=BLANKS + "\u00a0ab3", max_size=6)
VALUES = st.one_of(st.none(), BLANKISH, st.text(max_size=8), st.integers(-10**6, 10**6), st.booleans(),
                   st.sampled_from(LABELS).map(lambda s: f" {s}\t"))


@settings(max_examples=300, deadline=None)
@given(VALUES)
def test_python_and_sql_read_a_gold_value_alike(value):
    con = duckdb.connect()
    assert con.execute(f"SELECT {truth_sql('?')}", [value]).fetchone()[0] == truth(value)


def test_the_edges_by_hand():
    assert [truth(v) for v in (None, "", "   ", "\t\n", " fruit ", 3, True, "\u00a0")] == \
        [None, None, None, None, "fruit", "3", "true", "\u00a0"]  # a no-break space is text, not a blank


#: The fake model knows every word of the rows: it answers each row with its label in make_rows.
KNOWS = {word: label for label, words in WORDS.items() for word in words}
GOLD = st.one_of(st.none(), st.sampled_from(["", " ", "\t"]), st.sampled_from(LABELS),
                 st.sampled_from(LABELS).map(lambda s: f" {s} "))


@settings(max_examples=25, deadline=None)
@given(st.lists(GOLD, min_size=1, max_size=40), st.integers(1, 39))
def test_the_estimates_accuracy_is_over_the_rows_with_a_truth(tmp_path_factory, golds, cut):
    """Two draws (as a widened sample has) against the oracle: right / rows with a truth, and the
    same Wilson interval; no truth anywhere: no accuracy."""
    tmp: Path = tmp_path_factory.mktemp("truth")
    spec = make_spec(tmp)
    made = make_rows(len(golds))
    rows = [{"row_id": r["id"], "text": r["text"], "gold": g} for r, g in zip(made, golds, strict=True)]
    engine = FakeEngine(knows=KNOWS)
    cut = min(cut, len(rows) - 1) if len(rows) > 1 else 0
    timings = [time_rows(spec, part, engine) for part in (rows[:cut], rows[cut:]) if part]
    timing = timings[0] if len(timings) == 1 else merge(timings[0], timings[1], cut)
    answers = {r["id"]: r["gold"] for r in made}
    known = [(answers[r["row_id"]], g.strip()) for r in rows if (g := r["gold"]) is not None and g.strip()]
    right = sum(a == g for a, g in known)
    assert (timing.correct, timing.truth_rows) == (right, len(known))
    assert set(timing.by_row) == {r["row_id"] for r in rows if truth(r["gold"])}
    forecast = predict(Sample(rows, [], len(rows), len(rows)), timing, [], None)
    if known:
        low, high = wilson(right, len(known))
        assert forecast.accuracy == round(right / len(known), 4) and forecast.scored_rows == len(known)
        assert (forecast.accuracy_low, forecast.accuracy_high) == (round(low, 4), round(high, 4))
    else:
        assert forecast.accuracy is None
