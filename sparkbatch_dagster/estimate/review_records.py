"""The estimate's records of a model's confidence, as they leave the room (in ``ModelForecast``):
its calibration on the sample's gold rows, the review-budget curve, and ``JobSpec.review`` as a
threshold. Shares with their Wilson interval are ``run/review_queue.Interval``.

Example::

    Calibrated(method="platt", rows=392, folds=5, ece_before=0.11, ece_after=0.03, brier_before=0.16,
               brier_after=0.14, reason="...").to_json()
"""

from __future__ import annotations

from ..run.review_queue import Interval
from .record_base import Record


class Calibrated(Record, frozen=True, kw_only=True):
    """A model's confidence calibrated on the sample's gold rows (``estimate/calibration.py``):
    the method chosen by cross-validation and why, and ECE / Brier score before (raw) and after
    (held out). ``path``: the calibration saved for runs (None: not saved, ``reason`` says why)."""

    method: str
    rows: int
    folds: int
    ece_before: float
    ece_after: float
    brier_before: float
    brier_after: float
    reason: str
    path: str | None = None


class Caught(Record, frozen=True, kw_only=True):
    """Reviewing ``reviewed_share`` of the rows, least sure first, catches ``caught_share`` of the errors."""

    reviewed_share: float
    caught_share: float


class ReviewBudget(Record, frozen=True, kw_only=True):
    """The review-budget curve of a model's gold rows at a few budgets (``estimate/review_budget.py``),
    ordered by the held-out calibrated confidence (``confidence``: 'calibrated' or 'raw' when
    nothing was fitted)."""

    rows: int
    errors: int
    confidence: str
    caught: list[Caught]


class ReviewPlan(Record, frozen=True, kw_only=True):
    """``JobSpec.review`` turned into a share of rows reviewed least sure first: ``asked`` =
    ``target`` (a row budget or an error target), ``share`` (``threshold``: the calibrated confidence
    where that cut fell on the gold rows), the held-out share of rows reviewed and of errors caught.
    ``why``: no plan (too few gold rows or errors), and the figures are None."""

    asked: str
    target: float
    share: float | None = None
    threshold: float | None = None
    reviewed: Interval | None = None
    caught: Interval | None = None
    folds: int | None = None
    why: str | None = None
