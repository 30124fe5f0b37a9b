"""A review budget: which rows a person checks, chosen by the errors that catches.

A labeling lead decides "I can review 10% of rows: which 10%, and how many errors does that catch?"
or "I need 80% of errors caught: how many rows is that?". Rows are reviewed least sure first, as a
rank cut (:func:`order`: the calibrated confidence, ties broken by the model's raw confidence, then
by row order), so a share of rows is exactly that many rows even when the calibration is constant
or stepped and many rows tie on one value. From gold rows ``(confidence, correct)`` follow the curve
"share of rows reviewed -> share of errors caught" (:func:`budget_curve`) and the plan of a row budget
(:func:`plan_budget`) or of an error target (:func:`plan_catch_errors`): a share of rows.

The figures a plan reports (the share of errors caught, the share of rows reviewed) are held out:
pass confidences calibrated by maps that never saw their row (``calibration.CalibrationReport.
held_out``), and an error target's share is chosen on the other folds than the ones it is scored on,
pooled; each with a 95% Wilson interval. Chosen and scored on the same rows they would be optimistic.

Example::

    plan = plan_budget(held_out, correct, budget=0.1, raw=raw)
    plan.share, plan.caught.value, (plan.caught.low, plan.caught.high)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ..errors import SparkbatchError
from ..run.review_queue import Interval
from .choice import wilson
from .folds import kfold, stratified_kfold

FOLDS = 5
#: Fewer gold rows than this: no plan (a fold of one or two rows says nothing of a share).
MIN_ROWS = 20


@dataclass(frozen=True)
class CurvePoint:
    """Reviewing the ``reviewed`` least sure rows (the last of them at ``threshold``): how many
    errors that catches."""

    threshold: float
    reviewed: int
    caught: int
    reviewed_share: float
    caught_share: float


@dataclass(frozen=True)
class BudgetCurve:
    """The curve "share of rows reviewed -> share of errors caught" over ``rows`` gold rows with ``errors``
    wrong answers; a point per row count, from reviewing nothing to reviewing every row."""

    rows: int
    errors: int
    points: tuple[CurvePoint, ...]

    def caught_at(self, share: float) -> float:
        """The share of errors caught by reviewing :func:`cut` (``share``) of the rows, least sure first."""
        return self.points[cut(share, self.rows)].caught_share if self.points else 0.0


@dataclass(frozen=True)
class ReviewPlan:
    """``asked`` = ``target`` turned into ``share`` (review the least sure share of rows; ``threshold``:
    the confidence where that cut falls on the gold rows), with the held-out share of rows it sends to
    review and of errors it catches."""

    asked: Literal["budget", "catch_errors"]
    target: float
    share: float
    threshold: float
    reviewed: Interval
    caught: Interval
    rows: int
    errors: int
    folds: int


def cut(share: float, rows: int) -> int:
    """How many of ``rows`` a share reviews: round half up (the ``review`` view's rule, in SQL too)."""
    return min(rows, int(math.floor(share * rows + 0.5 + 1e-9)))


def order(confidence: ArrayLike, raw: ArrayLike | None = None) -> NDArray[np.int_]:
    """Row positions least sure first: by confidence, ties by ``raw`` (the model's own), then by position."""
    c = np.asarray(confidence, dtype=np.float64).ravel()
    r = c if raw is None else np.asarray(raw, dtype=np.float64).ravel()
    return np.lexsort((np.arange(c.size), r, c)).astype(int)


def _arrays(confidence: ArrayLike, correct: ArrayLike,
            raw: ArrayLike | None) -> tuple[NDArray[np.float64], NDArray[np.bool_], NDArray[np.float64]]:
    c = np.asarray(confidence, dtype=np.float64).ravel()
    y = np.asarray(correct, dtype=bool).ravel()
    r = c if raw is None else np.asarray(raw, dtype=np.float64).ravel()
    if c.shape != y.shape or c.shape != r.shape:
        raise SparkbatchError(f"review budget: {c.size} confidences but {y.size} right/wrong values ({r.size} raw): "
                              "pass one of each per gold row")
    if c.size and not (np.all(np.isfinite(c)) and np.all(np.isfinite(r))):
        raise SparkbatchError("review budget: a confidence is NaN: pass only rows with a confidence")
    return c, y, r


def budget_curve(confidence: ArrayLike, correct: ArrayLike, raw: ArrayLike | None = None) -> BudgetCurve:
    """The curve of these gold rows, least sure first (:func:`order`): a point per number of rows reviewed."""
    c, y, r = _arrays(confidence, correct, raw)
    n, errors = c.size, int((~y).sum())
    ranked = order(c, r)
    wrong = np.concatenate([[0], np.cumsum(~y[ranked])])
    at = np.concatenate([[c[ranked[0]] if n else 0.0], c[ranked]])
    return BudgetCurve(n, errors, tuple(CurvePoint(float(at[k]), k, int(wrong[k]), k / n if n else 0.0,
                                                   int(wrong[k]) / errors if errors else 0.0) for k in range(n + 1)))


def share_for_errors(confidence: ArrayLike, correct: ArrayLike, target: float, raw: ArrayLike | None = None) -> float:
    """The smallest share of these rows, least sure first, whose rows hold at least ``target`` of the errors."""
    c, y, r = _arrays(confidence, correct, raw)
    wrong = int((~y).sum())
    if not wrong:  # nothing to catch: review nothing
        return 0.0
    need = max(1, math.ceil(target * wrong - 1e-9))
    k = int(np.searchsorted(np.cumsum(~y[order(c, r)]), need)) + 1
    return k / c.size


def _share(count: int, of: int) -> Interval:
    low, high = wilson(count, of)
    return Interval(value=count / of if of else 0.0, low=low, high=high, count=count, of=of)


def _at(c: NDArray[np.float64], r: NDArray[np.float64], share: float) -> float:
    """The confidence of the last row a share reviews (the first row's when it reviews none)."""
    ranked = order(c, r)
    k = cut(share, c.size)
    return float(c[ranked[max(k - 1, 0)]])


def _enough(c: NDArray[np.float64]) -> None:
    if c.size < MIN_ROWS:
        raise SparkbatchError(f"review budget: {c.size} gold rows with a confidence; a plan needs at least "
                              f"{MIN_ROWS}: label more gold rows (estimate.max_sample_rows) or set review_below")


def _plan_errors(target: float, c: NDArray[np.float64], y: NDArray[np.bool_], r: NDArray[np.float64], folds: int,
                 seed: int) -> ReviewPlan:
    """The share of rows that catches ``target`` of the errors, its figures scored on each fold at the
    share the other folds chose, pooled."""
    _enough(c)
    # Stratified on right/wrong where both are common enough, so no fold chooses with no errors in view.
    split = stratified_kfold(y, folds, seed) if min(y.sum(), (~y).sum()) >= folds else kfold(c.size, folds, seed)
    reviewed = caught = 0
    for train, test in split:
        share = share_for_errors(c[train], y[train], target, r[train])
        sent = order(c[test], r[test])[:cut(share, test.size)]
        reviewed += int(sent.size)
        caught += int((~y[test][sent]).sum())
    errors = int((~y).sum())
    share = share_for_errors(c, y, target, r)
    return ReviewPlan(asked="catch_errors", target=target, share=share, threshold=_at(c, r, share),
                      reviewed=_share(reviewed, c.size), caught=_share(caught, errors), rows=int(c.size),
                      errors=errors, folds=folds)


def plan_budget(confidence: ArrayLike, correct: ArrayLike, budget: float, folds: int = FOLDS, seed: int = 0,
                raw: ArrayLike | None = None) -> ReviewPlan:
    """``budget`` (a share of rows, 0 < x <= 1): the least sure ``budget`` of rows, with the share of
    errors that catches, held out when ``confidence`` is (each row's from a map that never saw it);
    the same figure as :meth:`BudgetCurve.caught_at` of the budget."""
    if not 0.0 < budget <= 1.0:
        raise SparkbatchError(f"review budget={budget!r} must be a share of rows above 0 and at most 1, e.g. 0.1")
    c, y, r = _arrays(confidence, correct, raw)
    _enough(c)
    # Nothing is chosen: the share is the budget. Held out by the confidences (maps that never saw the
    # row), and the same cut the curve and the chart mark: one number for the share of errors caught.
    sent = order(c, r)[:cut(budget, c.size)]
    errors = int((~y).sum())
    return ReviewPlan(asked="budget", target=budget, share=budget, threshold=_at(c, r, budget),
                      reviewed=_share(int(sent.size), int(c.size)), caught=_share(int((~y[sent]).sum()), errors),
                      rows=int(c.size), errors=errors, folds=folds)


def plan_catch_errors(confidence: ArrayLike, correct: ArrayLike, target: float, folds: int = FOLDS,
                      seed: int = 0, raw: ArrayLike | None = None) -> ReviewPlan:
    """``target`` (a share of errors, 0 < x <= 1) turned into a share of rows (:func:`share_for_errors`),
    with the held-out share of rows it sends to review and of errors it catches."""
    if not 0.0 < target <= 1.0:
        raise SparkbatchError(f"review catch_errors={target!r} must be a share of errors above 0 and at most 1, "
                              "e.g. 0.8")
    c, y, r = _arrays(confidence, correct, raw)
    if (~y).sum() < folds:
        raise SparkbatchError(f"review catch_errors: {int((~y).sum())} wrong answers among {c.size} gold rows; "
                              f"a plan needs at least {folds}: set review.budget or review_below instead")
    return _plan_errors(target, c, y, r, folds, seed)
