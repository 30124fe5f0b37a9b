"""What the estimate says of one model's confidence on its sample's gold rows: its calibration
(fitted, scored held out, saved for runs), the review budget (errors caught at a few shares of
rows reviewed) and, with ``JobSpec.review``, the threshold that budget or error target becomes.

The review queue is a share of rows, least sure first. The budget curve and the plan rank the gold
rows by their held-out calibrated confidence (each row's from a map, and a method, chosen on the
other folds: ``CalibrationReport.held_out``): the fair order, as a run's unseen rows will be ordered.

Example::

    figures = judge(timing.sure, "SmolLM2-135M-Instruct@18aa", ["admin", "net"], spec.review,
                    home.calibration_dir, home.estimate_dir / "review-smollm2.png")
    figures.calibration.ece_before, figures.calibration.ece_after, figures.budget.caught
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import SparkbatchError
from ..spec import ReviewSpec
from . import calibration as cal
from . import review_budget as rb
from .review_records import Calibrated, Caught, ReviewBudget, ReviewPlan

#: Shares of rows reviewed at which the report gives the share of errors caught.
BUDGETS = (0.05, 0.1, 0.2)


@dataclass(frozen=True)
class Figures:
    """One model's calibration, review budget and plan (None where not asked or not possible),
    the chart written, and the fitted calibration itself."""

    calibration: Calibrated
    budget: ReviewBudget | None
    plan: ReviewPlan | None
    chart: Path | None
    fitted: cal.Calibration


def judge(sure: Sequence[tuple[float, bool]], model: str, labels: Sequence[str], review: ReviewSpec | None,
          folder: Path, chart: Path | None) -> Figures:
    """Calibrate ``sure`` (confidence, right) of ``model`` on ``labels``; save the map to ``folder``
    unless there were too few gold rows to fit one (a stored map is then left as it is); the budget
    at :data:`BUDGETS`; the plan of ``review``; the chart at ``chart`` (None: none drawn)."""
    conf = np.array([c for c, _ in sure], dtype=np.float64)
    right = np.array([ok for _, ok in sure], dtype=bool)
    report = cal.calibrate(conf, right, model, labels)
    fitted = report.calibration
    path = cal.save(fitted, folder, labels) if report.candidates else None
    calibrated = Calibrated(method=fitted.method, rows=fitted.rows, folds=report.folds,
                            ece_before=round(report.before.ece, 4), ece_after=round(report.after.ece, 4),
                            brier_before=round(report.before.brier, 4), brier_after=round(report.after.brier, 4),
                            reason=fitted.reason, path=str(path) if path else None)
    held = np.asarray(report.held_out, dtype=np.float64)
    curve = rb.budget_curve(held, right, conf)
    budget = (ReviewBudget(rows=curve.rows, errors=curve.errors,
                           confidence="raw" if fitted.method == "none" else "calibrated",
                           caught=[Caught(reviewed_share=b, caught_share=round(curve.caught_at(b), 4))
                                   for b in BUDGETS]) if curve.rows else None)
    plan = _plan(review, held, right, conf) if review is not None else None
    drawn = None
    if chart is not None and curve.rows:
        from .review_chart import write_review_chart

        drawn = write_review_chart(report, curve, chart, title=model.split("@")[0])
    return Figures(calibrated, budget, plan, drawn, fitted)


def _plan(review: ReviewSpec, conf: np.ndarray, right: np.ndarray, raw: np.ndarray) -> ReviewPlan:
    """``review`` as a share of rows ranked by ``conf`` (held out; ties by ``raw``), with the held-out
    shares; ``why`` when it cannot be made."""
    asked, target = ("budget", review.budget) if review.budget is not None else ("catch_errors", review.catch_errors)
    assert target is not None  # ReviewSpec holds exactly one
    try:
        plan = (rb.plan_budget(conf, right, target, raw=raw) if asked == "budget"
                else rb.plan_catch_errors(conf, right, target, raw=raw))
    except SparkbatchError as exc:
        return ReviewPlan(asked=asked, target=target, why=str(exc))
    # The threshold unrounded: a rounded one would move rows across it.
    return ReviewPlan(asked=asked, target=target, share=plan.share, threshold=plan.threshold,
                      reviewed=plan.reviewed.rounded(),
                      caught=plan.caught.rounded(), folds=plan.folds)


def advice(model: str, calibrated: Calibrated | None, budget: ReviewBudget | None,
           plan: ReviewPlan | None) -> list[str]:
    """One model's calibration, review budget and plan in words."""
    lines = []
    if calibrated is not None:
        if calibrated.method == "none":
            lines.append(f"{model}'s confidence is left uncalibrated ({calibrated.reason}); on {calibrated.rows} "
                         f"gold rows: ECE {calibrated.ece_before:.3f}, Brier {calibrated.brier_before:.3f}.")
        else:
            lines.append(f"{model}'s confidence calibrated by {calibrated.method} on {calibrated.rows} gold rows "
                         f"({calibrated.reason}): ECE {calibrated.ece_before:.3f} -> {calibrated.ece_after:.3f}, "
                         f"Brier {calibrated.brier_before:.3f} -> {calibrated.brier_after:.3f} (held out); runs "
                         "label with the calibrated confidence.")
    if budget is not None and budget.errors:
        at = ", ".join(f"{c.reviewed_share:.0%} -> {c.caught_share:.0%}" for c in budget.caught)
        lines.append(f"Reviewing {model}'s least sure rows first catches this share of its {budget.errors} errors "
                     f"on the {budget.rows} gold rows (rows reviewed -> errors caught, held out): {at}.")
    if plan is not None:
        lines.append(plan_line(model, plan))
    return lines


def plan_line(model: str, plan: ReviewPlan) -> str:
    """``JobSpec.review`` for ``model`` in words: the threshold and the other number, held out."""
    asked = f"review {{{plan.asked}: {plan.target:g}}}"
    if plan.why or plan.reviewed is None or plan.caught is None:
        return f"{asked} for {model}: no threshold ({plan.why})."
    r, c = plan.reviewed, plan.caught
    rows = f"{r.value:.1%} of rows reviewed (95% interval {r.low:.1%}-{r.high:.1%})"
    errors = f"{c.value:.1%} of errors caught (95% interval {c.low:.1%}-{c.high:.1%})"
    first, second = (errors, rows) if plan.asked == "budget" else (rows, errors)
    share = plan.share if plan.share is not None else r.value
    return (f"{asked} for {model}: review the least sure {share:.1%} of rows: {first}, "
            f"{second}, held out ({plan.folds}-fold cross-validation on {r.of} gold rows).")
