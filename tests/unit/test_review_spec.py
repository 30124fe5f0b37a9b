"""``JobSpec.review`` (spec/review.py): a row budget or an error target, exactly one, checked before
anything runs; it reads rows only, so no fingerprint moves; ``review_below`` works as before."""

import pytest

from sparkbatch_dagster import ConfigError, JobSpec
from sparkbatch_dagster.spec import ReviewSpec

LABELED = dict(name="job", input="x.parquet", text_columns=["text"], user_template="{{ text }}",
               output={"kind": "label", "labels": ["a", "b"]}, gold_column="gold")


def test_a_budget_or_an_error_target_is_accepted():
    assert JobSpec(**LABELED, review={"budget": 0.1}).review == ReviewSpec(budget=0.1)
    assert JobSpec(**LABELED, review={"catch_errors": 0.8}).review == ReviewSpec(catch_errors=0.8)
    assert JobSpec(**LABELED, review={"budget": 1}).review.budget == 1.0


def test_review_left_out_keeps_review_below_as_before():
    spec = JobSpec(**LABELED)
    assert spec.review is None and spec.review_below == 0.5
    assert JobSpec(**LABELED, review_below=0.3).review_below == 0.3


def test_review_changes_no_fingerprint_of_an_old_job():
    old = JobSpec(**LABELED)
    new = JobSpec(**LABELED, review={"budget": 0.1})
    assert new.prompt_fingerprint() == old.prompt_fingerprint()
    assert new.answer_context("m") == old.answer_context("m")


@pytest.mark.parametrize(
    ("review", "needle"),
    [
        ({"budget": 0}, r"review\.budget: budget=0(\.0)? must be above 0 and at most 1: a share of rows reviewed"),
        ({"budget": 1.5}, r"budget=1\.5 must be above 0 and at most 1"),
        ({"catch_errors": -0.2}, r"catch_errors=-0\.2 must be above 0 and at most 1: a share of errors caught"),
        ({"catch_errors": float("nan")}, r"catch_errors=nan must be"),
        ({"budget": 0.1, "catch_errors": 0.8}, r"exactly one \(both are set\): e\.g\. \{budget: 0\.1\}"),
        ({}, r"exactly one \(neither is set\)"),
        ({"rows": 10}, r"review\.rows"),
    ],
)
def test_bad_review_values_stop_naming_the_value_and_the_fix(review, needle):
    with pytest.raises(ConfigError, match=needle):
        JobSpec(**LABELED, review=review)


def test_review_needs_gold_rows_confidences_and_no_review_below_beside_it():
    with pytest.raises(ConfigError, match=r"review=\{budget: 0\.1\} and review_below both set .* keep one"):
        JobSpec(**LABELED, review={"budget": 0.1}, review_below=0.4)
    with pytest.raises(ConfigError, match=r"gold_column is unset: set gold_column, or use review_below"):
        JobSpec(**{**LABELED, "gold_column": None}, review={"catch_errors": 0.8})
    with pytest.raises(ConfigError, match=r"free text has none of"):
        JobSpec(**{**LABELED, "output": {"kind": "text"}}, review={"budget": 0.1})
    with pytest.raises(ConfigError, match=r"output\.confidence=False turns off: set output\.confidence=True"):
        JobSpec(**{**LABELED, "output": {"kind": "label", "labels": ["a", "b"], "confidence": False}},
                review={"budget": 0.1})


def test_review_spec_alone_names_its_own_settings():
    with pytest.raises(ConfigError, match=r"invalid review settings:\n  review\.budget: budget=2"):
        ReviewSpec(budget=2)
