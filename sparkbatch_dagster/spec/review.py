"""How many rows a person reviews, said the way a labeling lead decides it.

``JobSpec.review`` takes either a row budget (``budget: 0.1``: "I can review 10% of rows") or an
error target (``catch_errors: 0.8``: "I need 80% of errors caught"), exactly one; the ``analytics``
asset turns it into a confidence threshold on the gold rows (``estimate/gold_fit.py``), stored where
the ``review`` view reads it (``run/review_queue.py``). Left out, ``JobSpec.review_below`` is the
threshold. Like ``review_below`` it only reads rows: it is in no fingerprint.

Example::

    JobSpec(..., gold_column="section", review={"budget": 0.1})
    ReviewSpec(catch_errors=0.8)
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import ConfigDict, Field, field_validator, model_validator

from .checked import Checked


class ReviewSpec(Checked):
    """A review budget: ``budget`` (share of rows) or ``catch_errors`` (share of errors), exactly one."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    _owner: ClassVar[str] = "review"  # its field in JobSpec, as estimate_spec does

    budget: float | None = Field(
        default=None, description="Share of rows a person reviews (0 < x <= 1), least sure first: 0.1 = 10%.",
    )
    catch_errors: float | None = Field(
        default=None, description="Share of wrong answers the review must catch (0 < x <= 1): 0.8 = 80%.",
    )

    @field_validator("budget", "catch_errors")
    @classmethod
    def _check_share(cls, v: float | None, info: object) -> float | None:
        name = getattr(info, "field_name", "value")
        what = "rows reviewed, e.g. 0.1 for 10%" if name == "budget" else "errors caught, e.g. 0.8 for 80%"
        if v is not None and not 0.0 < v <= 1.0:  # NaN fails too
            raise ValueError(f"{name}={v!r} must be above 0 and at most 1: a share of {what}")
        return v

    @model_validator(mode="after")
    def _exactly_one(self) -> ReviewSpec:
        if (self.budget is None) == (self.catch_errors is None):
            both = "both are set" if self.budget is not None else "neither is set"
            raise ValueError(f"review takes budget or catch_errors, exactly one ({both}): e.g. {{budget: 0.1}} "
                             "or {catch_errors: 0.8}; or leave review out and set review_below")
        return self


def check_review(review: ReviewSpec | None, review_below_set: bool, gold_column: str | None, kind: str,
                 confidence: bool) -> None:
    """Raise ValueError naming what a job's ``review`` cannot work with and the fix."""
    if review is None:
        return
    asked = f"review={{budget: {review.budget}}}" if review.budget is not None else \
        f"review={{catch_errors: {review.catch_errors}}}"
    if review_below_set:
        raise ValueError(f"{asked} and review_below both set the review threshold: keep one (review_below is a "
                         "fixed confidence; review turns a budget into one on the gold rows)")
    if not gold_column:
        raise ValueError(f"{asked} is turned into a threshold on the rows with a gold label, and gold_column is "
                         "unset: set gold_column, or use review_below (a fixed confidence) instead")
    if kind == "text" or not confidence:
        raise ValueError(f"{asked} orders rows by their answer's confidence, which "
                         + ("free text has none of: use output.kind 'label' or 'json'" if kind == "text"
                            else "output.confidence=False turns off: set output.confidence=True")
                         + ", or leave review out")
