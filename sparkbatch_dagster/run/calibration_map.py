"""A fitted confidence calibration, as runs and views use it: a frozen map of plain numbers, stored
as JSON per model identity and label set in the job's ``calibration/`` folder.

Fitting it takes gold rows (``estimate/calibration.py``, which the estimate and the
analytics asset call); applying it takes only this module: a run writes each row's calibrated
``confidence`` beside its ``raw_confidence`` (:meth:`Calibration.apply`), and the DuckDB views
compute the same map in SQL (:meth:`Calibration.sql`), so the ``review`` view always ranks by the
newest calibration, even rows written before it was fitted. A file that does not parse or holds a
map no confidence may go through (:func:`problem`: out of [0, 1], NaN, decreasing, another label
set's) is never used: readers leave it out, a writer sets it aside (``run/review_store.py``).

Example::

    cal = load(home.calibration_dir, "SmolLM2-135M-Instruct@18aaa4f642ee", labels)
    cal.apply([0.85, 0.4]) if cal else None
    f"SELECT {cal.sql('raw_confidence')} FROM rows"
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import SparkbatchError
from ..home import atomic_write_text
from ..home.review_files import tell_once
from ..spec import fingerprint

Method = Literal["none", "temperature", "platt", "isotonic"]
# Keeps logit finite: a confidence of exactly 0 or 1 would be an infinite feature.
EPS = 1e-6


class Calibration(BaseModel):
    """A fitted calibration map: ``method`` with its parameters as plain numbers; JSON in and out
    (``model_dump_json`` / ``model_validate_json``). ``apply`` maps raw confidences to calibrated ones."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: Method
    model: str
    labels_digest: str
    rows: int
    #: temperature / platt: calibrated = sigmoid(slope * logit(c) + intercept)
    slope: float | None = None
    intercept: float | None = None
    #: isotonic: breakpoints, linearly interpolated between, clipped outside
    x: tuple[float, ...] = ()
    y: tuple[float, ...] = ()
    reason: str = ""
    #: How well it does, on held-out rows: ECE and Brier score of the raw confidence and of this map
    #: (None in files written before they were kept).
    ece_before: float | None = None
    ece_after: float | None = None
    brier_before: float | None = None
    brier_after: float | None = None

    def apply(self, confidence: ArrayLike) -> NDArray[np.float64]:
        """The calibrated confidences of ``confidence`` (any shape); monotone non-decreasing."""
        c = np.asarray(confidence, dtype=np.float64)
        if self.method == "none":
            return c.copy()
        if self.method == "isotonic":
            return np.interp(c, np.asarray(self.x), np.asarray(self.y))
        z = (self.slope or 0.0) * logit(c) + (self.intercept or 0.0)
        return np.asarray(1.0 / (1.0 + np.exp(-z)), dtype=np.float64)

    def one(self, confidence: float | None) -> float | None:
        """:meth:`apply` of one confidence, rounded as rows store it (None stays None)."""
        return None if confidence is None else round(float(self.apply(confidence)), 6)

    def sql(self, column: str) -> str:
        """The same map as a DuckDB expression of ``column`` (a trusted identifier), so a view needs
        no Python function: every reader of ``metrics.duckdb`` computes the same numbers."""
        c = f"({column})"
        if self.method == "none":
            return c
        if self.method == "isotonic":
            xs, ys = self.x, self.y
            if len(xs) == 1:
                return f"(CASE WHEN {c} IS NULL THEN NULL ELSE {ys[0]!r}::DOUBLE END)"
            parts = [f"WHEN {c} <= {xs[0]!r} THEN {ys[0]!r}"]
            for x0, y0, x1, y1 in zip(xs, ys, xs[1:], ys[1:], strict=False):
                if x1 > x0:  # np.interp's line between two breakpoints
                    parts.append(f"WHEN {c} <= {x1!r} THEN {y0!r} + ({c} - {x0!r}) * {(y1 - y0) / (x1 - x0)!r}")
            return f"(CASE WHEN {c} IS NULL THEN NULL {' '.join(parts)} ELSE {ys[-1]!r} END)"
        p = f"greatest(least({c}, {1 - EPS!r}), {EPS!r})"
        return f"(1.0 / (1.0 + exp(-({(self.slope or 0.0)!r} * ln({p} / (1 - {p})) + {(self.intercept or 0.0)!r}))))"


def logit(c: NDArray[np.float64]) -> NDArray[np.float64]:
    """log(c / (1 - c)), with c kept inside [EPS, 1 - EPS]."""
    p = np.clip(c, EPS, 1 - EPS)
    return np.asarray(np.log(p / (1 - p)), dtype=np.float64)


def labels_digest(labels: Iterable[str]) -> str:
    """A label set's digest (order-free): a calibration learnt on one label set is not another's."""
    return fingerprint(sorted(set(labels)))


def calibration_key(model: str, labels: Iterable[str]) -> str:
    """The file name of the calibration of ``model`` on ``labels``: readable, and unique per pair."""
    return _key(model, labels_digest(labels))


def _key(model: str, digest: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", model.split("@")[0].rsplit("/", 1)[-1])[:40]
    return f"{slug}-{fingerprint({'model': model, 'labels': digest})}.json"


def save(calibration: Calibration, folder: Path, labels: Iterable[str]) -> Path:
    """Write ``calibration`` (of ``labels``) to ``folder`` under :func:`calibration_key`, atomically
    (with a bucket home, publish the path too: ``JobHome.publish``)."""
    if calibration.labels_digest != labels_digest(labels):
        raise SparkbatchError("calibration: saved under a label set it was not fitted on: pass the job's labels")
    why = problem(calibration)
    if why is not None:  # a map no reader would use must not be stored either
        raise SparkbatchError(f"calibration of {calibration.model!r} is out of range ({why}): not stored")
    path = folder / calibration_key(calibration.model, labels)
    atomic_write_text(path, calibration.model_dump_json(indent=1) + "\n")  # a reader never sees half a file
    return path


def problem(cal: Calibration) -> str | None:
    """Why ``cal`` is not a map a confidence may go through (None: it is one): every number finite,
    every confidence it gives in [0, 1], never decreasing (a falling map would reorder the review
    queue), scores in [0, 1]."""
    def bad(*values: float | None) -> bool:
        return any(v is None or not math.isfinite(v) for v in values)

    scores = [v for v in (cal.ece_before, cal.ece_after, cal.brier_before, cal.brier_after) if v is not None]
    if cal.rows < 0 or bad(*scores) or not all(0.0 <= v <= 1.0 for v in scores):
        return "its row count or scores are out of range"
    if cal.method in ("platt", "temperature"):
        if bad(cal.slope, cal.intercept):
            return f"{cal.method} needs a finite slope and intercept"
        if (cal.slope or 0.0) < 0:
            return f"slope {cal.slope} < 0: the map would decrease"
    if cal.method == "isotonic":
        xs, ys = cal.x, cal.y
        if not xs or len(xs) != len(ys) or bad(*xs, *ys):
            return "isotonic breakpoints x and y must be as many, at least one, all finite"
        if any(b < a for a, b in zip(xs, xs[1:], strict=False)) or any(b < a for a, b in zip(ys, ys[1:], strict=False)):
            return "isotonic breakpoints must not decrease"
        if not all(0.0 <= v <= 1.0 for v in ys):  # x is the raw confidence: where it lies changes no output
            return f"isotonic confidences must lie in [0, 1] (y from {min(ys)!r} to {max(ys)!r})"
    return None


def read(path: Path) -> Calibration | str:
    """The calibration in ``path``, or why it is not one a reader may use: it does not parse, it is
    out of range (:func:`problem`), or it is not the map its file name says (another model or label
    set copied over it)."""
    try:
        cal = Calibration.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        return f"not a calibration: {exc.errors()[0]['msg']}"
    why = problem(cal)
    if why is None and path.name != _key(cal.model, cal.labels_digest):
        why = f"it holds the calibration of {cal.model!r} on another label set or model than its name says"
    return why if why is not None else cal


def _left_out(path: Path, why: str) -> None:
    tell_once(path, f"{path} is left out ({why}): its model's confidences are its raw ones until analytics fits "
                    "a calibration again (`sparkbatch run` sets the file aside)")


def load(folder: Path, model: str, labels: Iterable[str]) -> Calibration | None:
    """The stored calibration of ``model`` on ``labels``, or None when none was saved, or the file is
    damaged or out of range (:func:`read`: left out with one warning line, never used)."""
    path = folder / calibration_key(model, list(labels))
    if not path.exists():
        return None
    cal = read(path)
    if isinstance(cal, str):
        _left_out(path, cal)
        return None
    return cal


def stored(folder: Path, labels: Iterable[str]) -> dict[str, Calibration]:
    """Every stored calibration of ``labels``, by model identity (a cascade's rows come from several);
    a damaged or out-of-range file is left out (:func:`load`)."""
    digest = labels_digest(labels)
    out: dict[str, Calibration] = {}
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        cal = read(path)
        if isinstance(cal, str):
            _left_out(path, cal)
        elif cal.labels_digest == digest:
            out[cal.model] = cal
    return out


def damaged(folder: Path) -> list[tuple[Path, str]]:
    """The calibration files in ``folder`` no reader uses, each with why (for a writer to set aside)."""
    found = [(p, read(p)) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []
    return [(p, why) for p, why in found if isinstance(why, str)]


def confidence_sql(calibrations: dict[str, Calibration], raw: str = "raw_confidence", model: str = "model") -> str:
    """The calibrated confidence of a row in SQL: its model's map of ``raw``, unchanged for a model
    with no calibration."""
    if not calibrations:
        return raw
    cases = " ".join(f"WHEN {model} = '{m.replace(chr(39), chr(39) * 2)}' THEN {cal.sql(raw)}"
                     for m, cal in sorted(calibrations.items()))
    return f"(CASE {cases} ELSE {raw} END)"
