"""Calibration of label confidences, fitted on the rows with gold labels.

A label's confidence says how sure the model was of its answer; on a weak model it is often wrong
at the top (0.8-0.9 sure, right 0% of the time). Calibration maps it to the chance the answer is
right, learnt from gold rows ``(confidence, correct)``. The candidates are ``none`` (kept as it
is), ``temperature`` (``sigmoid(a * logit(c))``), ``platt`` (``sigmoid(a * logit(c) + b)``) and
``isotonic`` (a monotone step-wise map, :mod:`.isotonic`); the one with the lowest
Brier score on held-out folds (k-fold, stratified on right/wrong) wins and is then fitted on every
gold row. Every figure after calibration is on held-out rows, nested: in each outer fold the method
is chosen (inner folds) and fitted on the other rows only. A map fitted and scored on the same rows,
isotonic above all, looks better than it is, and so does the best of four scored where it was picked.

The folds (:mod:`.folds`) and the isotonic fit are scikit-learn's, re-done in numpy to the bit (its
import alone cost every run about two CPU seconds); scikit-learn is the test suite's oracle only.

The fitted map is a frozen :class:`Calibration` of plain numbers, stored as JSON per model identity
and label set (:func:`calibration_key`, :func:`save`, :func:`load`); those live in
``run/calibration_map.py``, where runs and views apply it.

Example::

    report = calibrate(conf, correct, model="SmolLM2-135M-Instruct@18aaa4f642ee", labels=["admin", "net"])
    report.before.ece, report.after.ece     # held-out
    save(report.calibration, home / "calibration")
    load(home / "calibration", model, labels).apply([0.85, 0.4])
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ..errors import SparkbatchError
from ..run.calibration_map import Calibration, Method, calibration_key, labels_digest, load, logit, save
from .folds import stratified_kfold
from .isotonic import isotonic_points

__all__ = ["METHODS", "Calibration", "CalibrationReport", "Candidate", "Method", "ReliabilityBin", "Scores",
           "brier", "calibrate", "calibration_key", "choose", "cross_validated", "ece", "fit", "labels_digest", "load",
           "nested", "reliability_table", "save", "scores", "too_few"]
#: Candidates fitted and compared, ``none`` among them: a map must beat the raw confidence to be kept.
METHODS: tuple[Method, ...] = ("none", "temperature", "platt", "isotonic")
#: Fewer gold rows than this (or fewer right or wrong answers than :data:`FOLDS`): no map is fitted.
MIN_ROWS = 30
FOLDS = 5
BINS = 10


@dataclass(frozen=True)
class Scores:
    """Expected calibration error (equal-width bins) and Brier score of confidences against right/wrong."""

    ece: float
    brier: float


@dataclass(frozen=True)
class ReliabilityBin:
    """One non-empty confidence bin of a reliability diagram: ``[low, high)`` (the last one closed)."""

    bin: int
    low: float
    high: float
    rows: int
    mean_confidence: float
    accuracy: float


@dataclass(frozen=True)
class Candidate:
    """A method's held-out scores (cross-validated predictions) on the gold rows."""

    method: Method
    held_out: Scores


@dataclass(frozen=True)
class CalibrationReport:
    """The chosen map (fitted on every gold row), the scores before (raw, nothing fitted) and after
    (nested held-out predictions: method and map chosen without the row), every candidate's
    held-out scores, and both reliability tables (after: of the held-out predictions)."""

    calibration: Calibration
    folds: int
    before: Scores
    after: Scores
    candidates: tuple[Candidate, ...]
    reliability_before: tuple[ReliabilityBin, ...]
    reliability_after: tuple[ReliabilityBin, ...]
    #: Each row's calibrated confidence from a map (and a method) chosen without it; raw when no map.
    held_out: tuple[float, ...] = ()


def _arrays(confidence: ArrayLike, correct: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.int_]]:
    c = np.asarray(confidence, dtype=np.float64).ravel()
    y = np.asarray(correct, dtype=bool).ravel().astype(int)
    if c.shape != y.shape:
        raise SparkbatchError(f"calibration: {c.size} confidences but {y.size} right/wrong values: pass one of each "
                              "per gold row")
    if c.size and (not np.all(np.isfinite(c)) or c.min() < 0 or c.max() > 1):
        raise SparkbatchError("calibration: a confidence outside [0, 1] (or NaN): pass only rows with a confidence")
    return c, y


def bin_of(confidence: ArrayLike, bins: int = BINS) -> NDArray[np.int_]:
    """Each confidence's bin: floor(c * bins), 1.0 in the last (the rule of ``run/reliability.py``)."""
    return np.clip(np.floor(np.asarray(confidence, dtype=np.float64) * bins), 0, bins - 1).astype(int)


def reliability_table(confidence: ArrayLike, correct: ArrayLike, bins: int = BINS) -> tuple[ReliabilityBin, ...]:
    """Rows, mean confidence and accuracy per non-empty equal-width bin."""
    c, y = _arrays(confidence, correct)
    b = bin_of(c, bins)
    return tuple(ReliabilityBin(bin=int(k), low=float(k / bins), high=float((k + 1) / bins), rows=int((b == k).sum()),
                                mean_confidence=float(c[b == k].mean()), accuracy=float(y[b == k].mean()))
                 for k in np.unique(b))


def ece(confidence: ArrayLike, correct: ArrayLike, bins: int = BINS) -> float:
    """Expected calibration error: the rows-weighted mean of |accuracy - mean confidence| over the bins."""
    c, _ = _arrays(confidence, correct)
    table = reliability_table(confidence, correct, bins)
    return float(sum(t.rows * abs(t.accuracy - t.mean_confidence) for t in table) / c.size) if c.size else 0.0


def brier(confidence: ArrayLike, correct: ArrayLike) -> float:
    """Brier score: the mean squared gap between the confidence and 1 (right) or 0 (wrong)."""
    c, y = _arrays(confidence, correct)
    return float(np.mean((c - y) ** 2)) if c.size else 0.0


def scores(confidence: ArrayLike, correct: ArrayLike, bins: int = BINS) -> Scores:
    """:func:`ece` and :func:`brier` together."""
    return Scores(ece=ece(confidence, correct, bins), brier=brier(confidence, correct))


def fit(method: Method, confidence: ArrayLike, correct: ArrayLike, model: str, labels: Iterable[str]) -> Calibration:
    """``method`` fitted on these rows (all of them: use :func:`cross_validated` to score it)."""
    c, y = _arrays(confidence, correct)
    base = Calibration(method=method, model=model, labels_digest=labels_digest(labels), rows=int(c.size))
    if method == "none":
        return base
    if method == "isotonic":
        xs, ys = isotonic_points(c, y)
        return base.model_copy(update={"x": tuple(map(float, xs)), "y": tuple(map(float, ys))})
    slope, intercept = _logistic(logit(c), y, method == "platt")
    if slope < 0:  # confidence that falls as accuracy rises: a decreasing map would reorder the review queue
        slope = 0.0
        intercept = float(logit(np.array([y.mean()]))[0]) if method == "platt" else 0.0
    return base.model_copy(update={"slope": slope, "intercept": intercept})


def _logistic(x: NDArray[np.float64], y: NDArray[np.int_], intercept: bool, c: float = 1e4) -> tuple[float, float]:
    """``sigmoid(slope * x + intercept)`` fitted by Newton's method on the log loss plus
    ``slope**2 / (2c)``: scikit-learn's ``LogisticRegression(C=c)`` objective (the intercept not
    penalised), a large ``c`` as Platt's, the tiny L2 keeping separable folds finite. Two parameters:
    a few Newton steps, where lbfgs costs tens of milliseconds a fit (the nested folds make hundreds)."""
    X = np.column_stack([x, np.ones_like(x)]) if intercept else x.reshape(-1, 1)
    ridge = np.diag([1.0 / c, 1e-9][:X.shape[1]])
    theta = np.zeros(X.shape[1])

    def loss(t: NDArray[np.float64]) -> float:
        z = X @ t
        return float(np.sum(np.logaddexp(0.0, z) - y * z) + 0.5 * t @ ridge @ t)

    now = loss(theta)
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-(X @ theta)))
        grad = X.T @ (p - y) + ridge @ theta
        hess = (X * (p * (1 - p))[:, None]).T @ X + ridge
        step = np.linalg.solve(hess, grad)
        scale = 1.0
        while scale > 1e-8 and loss(theta - scale * step) > now:  # halve until the loss falls
            scale /= 2
        theta = theta - scale * step
        before, now = now, loss(theta)
        if before - now < 1e-12 * max(1.0, abs(now)):
            break
    return float(theta[0]), float(theta[1]) if intercept else 0.0


def cross_validated(method: Method, confidence: ArrayLike, correct: ArrayLike, folds: int = FOLDS,
                    seed: int = 0) -> NDArray[np.float64]:
    """Each row's calibrated confidence from ``method`` fitted on the OTHER folds (never its own)."""
    c, y = _arrays(confidence, correct)
    why = too_few(y, folds)
    if why:
        raise SparkbatchError(f"calibration: {why}")
    out = np.empty_like(c)
    for train, test in stratified_kfold(y, folds, seed):
        out[test] = fit(method, c[train], y[train], "", ()).apply(c[test])
    return out


def too_few(correct: ArrayLike, folds: int = FOLDS) -> str:
    """Why these gold rows are too few to fit and score a map, or '' when they are enough."""
    y = np.asarray(correct, dtype=bool).ravel()
    right, wrong = int(y.sum()), int((~y).sum())
    if y.size < MIN_ROWS:
        return f"{y.size} gold rows with a confidence: calibration needs at least {MIN_ROWS}"
    if min(right, wrong) < folds:
        return (f"{right} right and {wrong} wrong answers among {y.size} gold rows: calibration needs at least "
                f"{folds} of each ({folds}-fold cross-validation)")
    return ""


def choose(c: NDArray[np.float64], y: NDArray[np.int_], folds: int, seed: int,
           bins: int = BINS) -> tuple[Method, tuple[Candidate, ...]]:
    """The method with the lowest ``folds``-fold held-out Brier score on these rows (ties: the
    simpler), and every candidate's held-out scores."""
    candidates = tuple(Candidate(m, scores(cross_validated(m, c, y, folds, seed), y, bins)) for m in METHODS)
    best = min(candidates, key=lambda x: (x.held_out.brier, METHODS.index(x.method)))
    return best.method, candidates


def nested(c: NDArray[np.float64], y: NDArray[np.int_], folds: int = FOLDS, seed: int = 0) -> NDArray[np.float64]:
    """Each row's calibrated confidence from a map that never saw it, the method too chosen without
    it: per outer fold, :func:`choose` on the other folds' rows (its own inner folds), fitted there.
    An outer training set too small to compare maps keeps the raw confidence (``none``)."""
    out = np.empty_like(c)
    for train, test in stratified_kfold(y, folds, seed):
        method: Method = "none"
        if not too_few(y[train], folds):
            method = choose(c[train], y[train], folds, seed)[0]
        out[test] = fit(method, c[train], y[train], "", ()).apply(c[test])
    return out


def calibrate(confidence: ArrayLike, correct: ArrayLike, model: str, labels: Sequence[str], folds: int = FOLDS,
              seed: int = 0, bins: int = BINS) -> CalibrationReport:
    """Fit every candidate in ``folds``-fold cross-validation, keep the one with the lowest held-out
    Brier score (``none`` when none beats the raw confidence, or when :func:`too_few` says so) and
    fit it on every row. The report's ``after`` is held out all the way (:func:`nested`): the method
    chosen inside each fold, so picking the best of four on the rows it is scored on flatters nothing;
    ``held_out`` keeps those predictions, one per row, for the review plan."""
    c, y = _arrays(confidence, correct)
    before = scores(c, y, bins)
    why = too_few(y, folds)
    if why:
        cal = fit("none", c, y, model, labels).model_copy(update={"reason": why})
        table = reliability_table(c, y, bins)
        return CalibrationReport(cal, folds, before, before, (), table, table, tuple(map(float, c)))
    method, candidates = choose(c, y, folds, seed, bins)
    held = nested(c, y, folds, seed)
    after = scores(held, y, bins)
    reason = (f"lowest held-out Brier score of {', '.join(METHODS)} in {folds}-fold cross-validation (figures "
              "after: nested, the method chosen inside each fold)")
    cal = fit(method, c, y, model, labels).model_copy(update={
        "reason": reason, "ece_before": round(before.ece, 6), "ece_after": round(after.ece, 6),
        "brier_before": round(before.brier, 6), "brier_after": round(after.brier, 6)})
    return CalibrationReport(cal, folds, before, after, candidates, reliability_table(c, y, bins),
                             reliability_table(held, y, bins), tuple(map(float, held)))
