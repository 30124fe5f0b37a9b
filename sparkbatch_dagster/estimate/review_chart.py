"""Calibration and the review budget as a picture: the reliability diagram before and after
calibration (held-out), and the curve "share of rows reviewed -> share of errors caught"."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .calibration import CalibrationReport, ReliabilityBin
from .chart import new_figure, save_png
from .review_budget import BudgetCurve

if TYPE_CHECKING:
    from matplotlib.axes import Axes

#: Shares of rows reviewed marked on the budget curve.
MARKS = (0.05, 0.1, 0.2)


def _diagram(ax: Axes, table: Sequence[ReliabilityBin], label: str, marker: str) -> None:
    xs = [b.mean_confidence for b in table]
    ys = [b.accuracy for b in table]
    sizes = [12 + 120 * b.rows / max(sum(t.rows for t in table), 1) for b in table]
    ax.plot(xs, ys, marker=marker, label=label)
    ax.scatter(xs, ys, s=sizes, alpha=0.3)


def write_review_chart(report: CalibrationReport, curve: BudgetCurve, path: Path, title: str = "") -> Path:
    """Two panels: accuracy against mean confidence per bin (raw, and the chosen calibration's
    held-out predictions; dot area = rows) with the diagonal of a calibrated model; and the share of
    errors caught against the share of rows reviewed, least sure first, with chance's diagonal and
    the :data:`MARKS` named. Returns ``path`` (a PNG)."""
    fig = new_figure(10, 4.2)
    left, right = fig.subplots(1, 2)
    left.plot([0, 1], [0, 1], color="grey", linestyle=":", label="calibrated")
    _diagram(left, report.reliability_before, f"raw (ECE {report.before.ece:.3f}, Brier {report.before.brier:.3f})",
             "o")
    if report.calibration.method != "none":
        _diagram(left, report.reliability_after, f"{report.calibration.method}, held out (ECE "
                 f"{report.after.ece:.3f}, Brier {report.after.brier:.3f})", "s")
    left.set(xlim=(0, 1), ylim=(0, 1), xlabel="mean confidence in the bin", ylabel="share right",
             title=f"reliability, {report.calibration.rows} gold rows")
    left.legend(fontsize=7, loc="upper left")
    xs = [p.reviewed_share for p in curve.points]
    ys = [p.caught_share for p in curve.points]
    right.plot([0, 1], [0, 1], color="grey", linestyle=":", label="rows in random order")
    right.step(xs, ys, where="post", label="least sure first")
    for i, share in enumerate(MARKS):
        caught = curve.caught_at(share)
        right.plot([share], [caught], "o", color="black")
        # Each a line further from the curve than the last (the marks sit close together, often at one
        # height), below it unless that would cross the axis.
        away = 10 + 9 * i
        right.annotate(f"{share:.0%} -> {caught:.0%}", (share, caught), textcoords="offset points",
                       xytext=(6, -away if caught > 0.3 else away - 6), fontsize=7)
    right.set(xlim=(0, 1), ylim=(0, 1), xlabel="share of rows reviewed", ylabel="share of errors caught",
              title=f"review budget, {curve.errors} errors in {curve.rows} gold rows")
    right.legend(fontsize=7, loc="lower right")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_png(fig, path)
