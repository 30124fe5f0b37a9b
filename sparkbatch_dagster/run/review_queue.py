"""Which rows go to a person (the ``review`` view): the cut in force, and the rows queued so far.

Without ``JobSpec.review`` the cut is a threshold, ``review_below``: rows whose calibrated confidence
is under it. With it (``budget: 0.1`` or ``catch_errors: 0.8``) the cut is a share of rows, least sure
first (calibrated confidence, ties by the raw one, then row id): ``budget: 0.1`` queues exactly
round(10%) of the rows that have a confidence, however many of them tie. The analytics asset turns
``catch_errors`` into a share on the gold rows (``estimate/review_budget.py``) and stores the plan
here, in ``review/threshold.json``, with what the other number will be (held out, with its 95%
interval). A budget needs no plan to queue its share (without gold rows it ranks by the model's
own confidence, and :func:`threshold_of` says so); an error target without a plan falls back to
``review_below``, said too.

A queued row stays queued until a reviewer labels it or dismisses it (:mod:`.review_members`): a
later cut (a new calibration, a new plan) adds rows, never drops one silently.

Example::

    threshold_of(spec, home).share          # the least sure share of rows the review view queues
    save_threshold(home, ReviewThreshold(asked="budget", target=0.1, share=0.1, threshold=0.31, ...))
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import msgspec

from ..home import JobHome, atomic_write_text
from ..home.review_files import tell_once
from ..spec import JobSpec


class Interval(msgspec.Struct, frozen=True):
    """A share with its 95% Wilson interval: ``count`` of ``of`` (the review budget's figures,
    ``estimate/review_budget.py``, and what reports keep of them)."""

    value: float
    low: float
    high: float
    count: int
    of: int

    def rounded(self, digits: int = 4) -> Interval:
        """The same share with its three fractions rounded, as reports print them."""
        return Interval(value=round(self.value, digits), low=round(self.low, digits),
                        high=round(self.high, digits), count=self.count, of=self.of)


class ReviewThreshold(msgspec.Struct, frozen=True, kw_only=True):
    """A review target turned into a threshold on ``gold_rows`` gold rows: the share of rows it sends
    to review and of errors it catches, both held out."""

    asked: Literal["budget", "catch_errors"]
    target: float
    #: The confidence at which the cut fell on the gold rows (what it was; the queue is the share).
    threshold: float
    reviewed: Interval
    caught: Interval
    gold_rows: int
    errors: int
    folds: int
    #: The least sure share of rows queued (None in files written before shares: the budget itself).
    share: float | None = None


@dataclass(frozen=True)
class Threshold:
    """The cut in force: ``share`` (the least sure share of rows, a rank cut) or, where it is None,
    ``threshold`` (rows under it: ``review_below``); the stored ``plan`` it came from, and ``why``
    when not from a plan (what was used instead)."""

    threshold: float
    plan: ReviewThreshold | None = None
    why: str = ""
    share: float | None = None

    def describe(self) -> str:
        """The cut in words: 'least sure 10% of rows' or 'confidence under 0.5'."""
        return (f"least sure {self.share:.4g} of rows" if self.share is not None
                else f"confidence under {self.threshold:.4g}")


def threshold_path(home: JobHome) -> Path:
    return home.review_dir / "threshold.json"


def save_threshold(home: JobHome, plan: ReviewThreshold) -> Path:
    """Store ``plan`` (atomically; published to a bucket home)."""
    path = threshold_path(home)
    atomic_write_text(path, msgspec.json.encode(plan).decode() + "\n")
    home.publish(path)
    return path


def load_threshold(home: JobHome) -> ReviewThreshold | None:
    """The stored plan, or None: also when the file is damaged or out of range (:func:`read_threshold`),
    left out with one warning line (``sparkbatch run`` sets it aside, analytics writes it again)."""
    path = threshold_path(home)
    if not path.exists():
        return None
    plan = read_threshold(path)
    if isinstance(plan, str):
        tell_once(path, f"{path} is left out ({plan}): the review goes on as if no plan were stored until "
                        "analytics writes it again from the gold rows (`sparkbatch run` sets the file aside)")
        return None
    return plan


def read_threshold(path: Path) -> ReviewThreshold | str:
    """The plan in ``path``, or why no reader may use it: it does not parse, or a share, count or
    threshold in it is out of range."""
    try:
        plan = msgspec.json.decode(path.read_bytes(), type=ReviewThreshold)
    except msgspec.DecodeError as exc:  # malformed JSON, or a field of the wrong type (ValidationError)
        return f"not a review threshold: {exc}"
    shares = [plan.target, plan.share if plan.share is not None else 0.0,
              *(v for i in (plan.reviewed, plan.caught) for v in (i.value, i.low, i.high))]
    counts = [plan.gold_rows, plan.errors, plan.folds,
              *(n for i in (plan.reviewed, plan.caught) for n in (i.count, i.of))]
    if not all(0.0 <= v <= 1.0 for v in shares) or plan.target == 0 or min(counts) < 0:
        return "a share outside [0, 1] or a negative count"
    if not 0.0 <= plan.threshold <= 1.0 + 1e-9:  # NaN fails too; just above 1 takes in the rows at 1.0
        return f"threshold {plan.threshold!r} is not a confidence"
    return plan


def asked(spec: JobSpec) -> tuple[Literal["budget", "catch_errors"], float] | None:
    """What ``spec.review`` asks for, or None when the spec sets ``review_below`` instead."""
    if spec.review is None:
        return None
    if spec.review.budget is not None:
        return "budget", spec.review.budget
    return "catch_errors", float(spec.review.catch_errors or 0.0)


def threshold_of(spec: JobSpec, home: JobHome) -> Threshold:
    """The cut the ``review`` view applies (see the module)."""
    want = asked(spec)
    if want is None:
        return Threshold(spec.review_below)
    plan = load_threshold(home)
    if plan is not None and (plan.asked, plan.target) == want:
        share = plan.share if plan.share is not None else (plan.target if plan.asked == "budget" else None)
        return Threshold(plan.threshold, plan, share=share)
    if want[0] == "budget":
        return Threshold(spec.review_below, share=want[1],
                         why=f"review budget={want[1]:g} has no plan from gold rows yet: the least sure "
                             f"{want[1]:g} of rows are queued by confidence (the model's own until a calibration "
                             "is fitted); errors caught unknown (materialize analytics with gold rows)")
    return Threshold(spec.review_below, why=f"review catch_errors={want[1]:g} has no plan yet (materialize analytics "
                                            f"with gold rows): review_below={spec.review_below:g} stands in")
