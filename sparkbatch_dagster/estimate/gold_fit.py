"""Calibration and the review threshold, learnt from a finished version's gold rows.

The analytics asset calls :func:`fit_on_gold` before it refreshes the views. The gold rows are the
``labeled`` rows whose truth is known (a reviewer's label, else the gold column) and whose answer had
a confidence; right means the MODEL's own answer equals the truth, so a corrected row teaches the
calibration what the model got wrong. Per model identity (a cascade's rows are each their stage's):
the calibration chosen by cross-validation (``calibration.calibrate``), stored where runs and views
read it when a map could be fitted, with ECE and Brier before and after on held-out rows and the
reliability chart. Over all rows, on each row's calibrated confidence from a map that never saw it
(nested: ``CalibrationReport.held_out``), ranked as the ``review`` view ranks: the budget curve (errors
caught at 5, 10 and 20% of rows reviewed) and, when ``JobSpec.review`` asks for a budget or an error
target, the share of rows it becomes (``run/review_queue.py``), its figures held out.

Example::

    fit = fit_on_gold(spec, home, version)
    fit.models[0].report.after.ece, fit.plan.share if fit.plan else None
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import SparkbatchError
from ..home import JobHome
from ..run.calibration_map import save
from ..run.review_marks import job_labels
from ..run.review_queue import ReviewThreshold, asked, save_threshold
from ..spec import JobSpec
from .calibration import CalibrationReport, calibrate
from .review_budget import BudgetCurve, ReviewPlan, budget_curve, plan_budget, plan_catch_errors
from .review_chart import MARKS, write_review_chart

GOLD_SQL = ("SELECT model, raw_confidence, model_correct FROM labeled "
            "WHERE raw_confidence IS NOT NULL AND model_correct IS NOT NULL ORDER BY row_id")


@dataclass(frozen=True)
class ModelFit:
    """One model's calibration on the gold rows: the report, where it was stored (None: too few
    rows to fit a map, ``report.calibration.reason`` says why) and its chart."""

    model: str
    report: CalibrationReport
    stored: Path | None
    chart: Path | None


@dataclass(frozen=True)
class GoldFit:
    """What the gold rows taught: per model, its calibration; over all rows, the budget curve on
    calibrated confidences and what ``JobSpec.review`` became (``plan``; ``why`` when it could not)."""

    rows: int
    models: tuple[ModelFit, ...]
    curve: BudgetCurve | None
    plan: ReviewPlan | None
    why: str = ""

    def caught_at(self) -> dict[str, float]:
        """Share of errors caught at each of :data:`MARKS` (share of rows reviewed)."""
        return {f"{m:.0%}": round(self.curve.caught_at(m), 4) for m in MARKS} if self.curve else {}


def gold_rows(spec: JobSpec, home: JobHome, version: str) -> list[tuple[str, float, bool]]:
    """(model, raw confidence, model right) of every committed row whose truth is known."""
    from ..run.metrics import committed_stats
    from ..run.query import read_only

    keys = sorted(committed_stats(home, version))
    if not keys:
        return []
    with read_only(spec, home, version) as con:
        return [(m, float(c), bool(ok)) for m, c, ok in con.execute(GOLD_SQL).fetchall()]


def fit_on_gold(spec: JobSpec, home: JobHome, version: str) -> GoldFit:
    """Calibrate each model on the version's gold rows, store what fitted, and turn ``spec.review``
    into a threshold (stored) on the calibrated confidences."""
    rows = gold_rows(spec, home, version)
    if not rows:
        return GoldFit(0, (), None, None, why="no row has both a confidence and a known truth (a gold label "
                                               "or a reviewer's)")
    labels = job_labels(spec)
    models = tuple(_fit_model(home, m, [(c, ok) for mm, c, ok in rows if mm == m], labels)
                   for m in sorted({m for m, _, _ in rows}))
    # Each row's confidence from a map (and method) fitted without it: the plan and the curve are
    # scored on rows their map never saw. Rows keep their row-id order (ties broken by it).
    held = {f.model: iter(f.report.held_out) for f in models}
    conf = np.array([next(held[m]) for m, _, _ in rows])
    raw = np.array([c for _, c, _ in rows])
    right = np.array([ok for _, _, ok in rows])
    curve = budget_curve(conf, right, raw)
    plan, why = _plan(spec, home, conf, right, raw)
    return GoldFit(len(rows), models, curve, plan, why)


def _fit_model(home: JobHome, model: str, rows: list[tuple[float, bool]], labels: list[str]) -> ModelFit:
    report = calibrate([c for c, _ in rows], [ok for _, ok in rows], model, labels)
    cal = report.calibration
    path = None
    if report.candidates:  # none when the rows were too few to compare maps (cal.reason says why)
        path = save(cal, home.calibration_dir, labels)
        home.publish(path)
    slug = path.stem if path else model.split("@")[0].rsplit("/", 1)[-1]
    raw = [c for c, _ in rows]
    chart = write_review_chart(report, budget_curve(report.held_out, [ok for _, ok in rows], raw),
                               home.review_dir / f"calibration-{slug}.png", title=model)
    return ModelFit(model, report, path, chart)


def _plan(spec: JobSpec, home: JobHome, conf: np.ndarray, right: np.ndarray,
          raw: np.ndarray) -> tuple[ReviewPlan | None, str]:
    want = asked(spec)
    if want is None:
        return None, ""
    try:
        plan = (plan_budget(conf, right, want[1], raw=raw) if want[0] == "budget"
                else plan_catch_errors(conf, right, want[1], raw=raw))
    except SparkbatchError as exc:
        return None, str(exc)
    save_threshold(home, ReviewThreshold(asked=plan.asked, target=plan.target, share=plan.share,
                                         threshold=plan.threshold, reviewed=plan.reviewed.rounded(),
                                         caught=plan.caught.rounded(), gold_rows=plan.rows, errors=plan.errors,
                                         folds=plan.folds))
    return plan, ""
