"""A review budget: which rows a person checks, chosen by the errors that catches.

A labeling lead decides "I can review 10% of rows: which 10%, and how many errors does that catch?"
or "I need 80% of errors caught: how many rows is that?". Rows are reviewed least sure first
(confidence under a threshold, as the ``review`` view lists them), so from gold rows
``(confidence, correct)`` follow the curve "share of rows reviewed -> share of errors caught"
(:func:`budget_curve`) and the threshold of a row budget (:func:`plan_budget`) or of an error target
(:func:`plan_catch_errors`).

The threshold is chosen on every gold row; the figures a plan reports (the share of errors caught, the
share of rows reviewed) are held out: each fold's rows are scored at the threshold the other folds
chose, pooled, with a 95% Wilson interval. Chosen and scored on the same rows they would be optimistic.

Pass the confidences the ``review`` view compares: calibrated ones when rows carry calibrated ones.

Example::

    plan = plan_budget(conf, correct, budget=0.1)
    plan.threshold, plan.caught.value, (plan.caught.low, plan.caught.high)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ..errors import SparkbatchError
from ..run.review_queue import Interval
from .choice import wilson

FOLDS = 5
#: Fewer gold rows than this: no plan (a fold of one or two rows says nothing of a threshold).
MIN_ROWS = 20


@dataclass(frozen=True)
class CurvePoint:
    """Reviewing the rows with confidence under ``threshold``: how many rows, how many errors caught."""

    threshold: float
    reviewed: int
    caught: int
    reviewed_share: float
    caught_share: float


@dataclass(frozen=True)
class BudgetCurve:
    """The curve "share of rows reviewed -> share of errors caught" over ``rows`` gold rows with ``errors``
    wrong answers; a point per distinct threshold, from reviewing nothing to reviewing every row."""

    rows: int
    errors: int
    points: tuple[CurvePoint, ...]

    def caught_at(self, share: float) -> float:
        """The share of errors caught by reviewing at most ``share`` of the rows, least sure first."""
        return max((p.caught_share for p in self.points if p.reviewed_share <= share + 1e-12), default=0.0)


@dataclass(frozen=True)
class ReviewPlan:
    """A threshold (review the rows whose confidence is under it) turned from ``asked`` = ``target``,
    with the held-out share of rows it sends to review and of errors it catches."""

    asked: Literal["budget", "catch_errors"]
    target: float
    threshold: float
    reviewed: Interval
    caught: Interval
    rows: int
    errors: int
    folds: int


def _arrays(confidence: ArrayLike, correct: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    c = np.asarray(confidence, dtype=np.float64).ravel()
    y = np.asarray(correct, dtype=bool).ravel()
    if c.shape != y.shape:
        raise SparkbatchError(f"review budget: {c.size} confidences but {y.size} right/wrong values: pass one of "
                              "each per gold row")
    if c.size and not np.all(np.isfinite(c)):
        raise SparkbatchError("review budget: a confidence is NaN: pass only rows with a confidence")
    return c, y


def budget_curve(confidence: ArrayLike, correct: ArrayLike) -> BudgetCurve:
    """The curve of these gold rows, a point per distinct confidence (rows tied on it go to review
    together) and one past the last (every row reviewed)."""
    c, y = _arrays(confidence, correct)
    n, errors = c.size, int((~y).sum())
    edges = [*np.unique(c), float(np.nextafter(c.max(), np.inf))] if n else [1.0]
    points = []
    for t in edges:
        below = c < t
        reviewed, caught = int(below.sum()), int((below & ~y).sum())
        points.append(CurvePoint(float(t), reviewed, caught, reviewed / n if n else 0.0,
                                 caught / errors if errors else 0.0))
    return BudgetCurve(n, errors, tuple(points))


def threshold_for_budget(confidence: ArrayLike, budget: float) -> float:
    """The highest threshold that sends at most ``budget`` of these rows to review (ties on the
    boundary stay out: a budget is a ceiling)."""
    c = np.sort(np.asarray(confidence, dtype=np.float64).ravel())
    k = math.floor(budget * c.size + 1e-9)
    return float(c[k]) if k < c.size else float(np.nextafter(c[-1], np.inf))


def threshold_for_errors(confidence: ArrayLike, correct: ArrayLike, target: float) -> float:
    """The lowest threshold under which at least ``target`` of these rows' errors lie."""
    c, y = _arrays(confidence, correct)
    wrong = np.sort(c[~y])
    if not wrong.size:  # nothing to catch: review nothing
        return float(c.min()) if c.size else 0.0
    need = max(1, math.ceil(target * wrong.size - 1e-9))
    last = wrong[need - 1]  # the least sure rows up to this error go to review; the next value above stays out
    above = c[c > last]
    return float(above.min()) if above.size else float(np.nextafter(last, np.inf))


def _share(count: int, of: int) -> Interval:
    low, high = wilson(count, of)
    return Interval(value=count / of if of else 0.0, low=low, high=high, count=count, of=of)


def _plan(asked: Literal["budget", "catch_errors"], target: float, c: NDArray[np.float64], y: NDArray[np.bool_],
          choose: Callable[[NDArray[np.float64], NDArray[np.bool_]], float], folds: int, seed: int) -> ReviewPlan:
    from sklearn.model_selection import KFold, StratifiedKFold

    if c.size < MIN_ROWS:
        raise SparkbatchError(f"review budget: {c.size} gold rows with a confidence; a plan needs at least "
                              f"{MIN_ROWS}: label more gold rows (estimate.max_sample_rows) or set review_below")
    # Stratified on right/wrong where both are common enough, so no fold chooses with no errors in view.
    split = (StratifiedKFold if min(y.sum(), (~y).sum()) >= folds else KFold)(folds, shuffle=True, random_state=seed)
    reviewed = caught = 0
    for train, test in split.split(c, y):
        t = choose(c[train], y[train])
        below = c[test] < t
        reviewed += int(below.sum())
        caught += int((below & ~y[test]).sum())
    errors = int((~y).sum())
    return ReviewPlan(asked=asked, target=target, threshold=choose(c, y), reviewed=_share(reviewed, c.size),
                      caught=_share(caught, errors), rows=int(c.size), errors=errors, folds=folds)


def plan_budget(confidence: ArrayLike, correct: ArrayLike, budget: float, folds: int = FOLDS,
                seed: int = 0) -> ReviewPlan:
    """``budget`` (a share of rows, 0 < x <= 1) turned into a threshold, with the held-out share of
    errors it catches and of rows it reviews."""
    if not 0.0 < budget <= 1.0:
        raise SparkbatchError(f"review budget={budget!r} must be a share of rows above 0 and at most 1, e.g. 0.1")
    c, y = _arrays(confidence, correct)
    return _plan("budget", budget, c, y, lambda cc, _: threshold_for_budget(cc, budget), folds, seed)


def plan_catch_errors(confidence: ArrayLike, correct: ArrayLike, target: float, folds: int = FOLDS,
                      seed: int = 0) -> ReviewPlan:
    """``target`` (a share of errors, 0 < x <= 1) turned into a threshold, with the held-out share of
    rows it sends to review and of errors it catches."""
    if not 0.0 < target <= 1.0:
        raise SparkbatchError(f"review catch_errors={target!r} must be a share of errors above 0 and at most 1, "
                              "e.g. 0.8")
    c, y = _arrays(confidence, correct)
    if (~y).sum() < folds:
        raise SparkbatchError(f"review catch_errors: {int((~y).sum())} wrong answers among {c.size} gold rows; "
                              f"a plan needs at least {folds}: set review.budget or review_below instead")
    return _plan("catch_errors", target, c, y, lambda cc, yy: threshold_for_errors(cc, yy, target), folds, seed)
