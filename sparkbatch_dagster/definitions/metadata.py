"""What the Dagster UI shows of a report: Markdown tables and bars, and the ``estimate`` asset's
metadata (each model's cost per node option and, with the user's price table, on each hosted
batch API, side by side)."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dagster import MetadataValue

from ..estimate.records import EstimateReport, ModelForecast, OptionPrice


def md_table(rows: Sequence[dict[str, Any]], cols: Sequence[str]) -> str:
    """Rows as a Markdown table of ``cols`` (a missing value: an empty cell)."""
    head = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
    return head + "\n".join("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows)


def bars(rows: Sequence[tuple[str, float]], width: int = 30) -> str:
    """A bar chart in Markdown, which the Dagster UI shows in place (a PNG path it does not)."""
    top = max((v for _, v in rows), default=0) or 1
    return "\n".join(f"- `{name}` {'█' * max(1, round(width * v / top))} ${v:.4f}" for name, v in rows)


def picture(path: str | Path | None, title: str) -> dict[str, Any]:
    """A PNG chart shown in place: Markdown with the image inline, under ``title``; nothing without
    the file. The UI shows a path as text (and the file may sit on another box), but renders a
    Markdown image with a ``data:`` source (its sanitizer allows that protocol for ``src``).

    Example::

        metadata = {**picture(report.chart, "cost chart")}
    """
    if not path or not Path(path).is_file():
        return {}
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return {title: MetadataValue.md(f"![{title}](data:image/png;base64,{data})")}


def _price(option: OptionPrice) -> str:
    """An option's cost in a table cell: a point when measured, a range when projected."""
    if option.cost_usd is None:
        return f"not priced ({option.speed_basis})"
    if option.speed_basis == "projected":
        return f"{option.cost_low_usd:.4f}-{option.cost_usd:.4f} (projected)"
    return f"{option.cost_usd:.4f} (measured)"


def _model_row(m: ModelForecast) -> dict[str, Any]:
    """One model's row of the ``models`` table."""
    return {"model": m.model, "rows": m.sample_rows, "accuracy": m.accuracy,
            "95% interval": f"{m.accuracy_low}-{m.accuracy_high}" if m.accuracy is not None else "",
            "tokens/hour": m.predicted_tokens_per_hour, "stored rows": m.stored_rows,
            **{f"{o.name} $": _price(o) for o in m.options},
            **{f"hosted: {h.name} $": f"{h.cost_usd:.4f}" for h in m.hosted}}


def _calibration_row(m: ModelForecast) -> dict[str, Any]:
    """One model's row of the ``calibration`` table: ECE and Brier before and after (held out)."""
    c = m.calibration
    assert c is not None
    return {"model": m.model, "method": c.method, "gold rows": c.rows, "ECE before": c.ece_before,
            "ECE after (held out)": c.ece_after, "Brier before": c.brier_before,
            "Brier after (held out)": c.brier_after, "chart": m.review_chart or ""}


def _budget_row(m: ModelForecast) -> dict[str, Any]:
    """One model's row of the ``review_budget`` table: errors caught at each share of rows reviewed."""
    b = m.review_budget
    assert b is not None
    return {"model": m.model, "gold rows": b.rows, "errors": b.errors,
            **{f"{c.reviewed_share:.0%} reviewed": f"{c.caught_share:.0%} of errors" for c in b.caught}}


def review_metadata(report: EstimateReport) -> dict[str, Any]:
    """Each model's calibration (ECE, Brier before and after, held out), its review budget and the
    path of its chart (reliability before/after, rows reviewed -> errors caught), and the chart itself
    shown in place; empty without gold rows."""
    calibrated = [_calibration_row(m) for m in report.models if m.calibration is not None]
    budgets = [_budget_row(m) for m in report.models if m.review_budget is not None]
    out: dict[str, Any] = {
        **({"calibration": MetadataValue.md(md_table(calibrated, list(calibrated[0])))} if calibrated else {}),
        **({"review_budget": MetadataValue.md(md_table(budgets, list(budgets[0])))} if budgets else {}),
    }
    for m in report.models:
        if m.review_chart:
            out[f"review_chart {m.model}"] = MetadataValue.path(m.review_chart)
            out.update(picture(m.review_chart, f"reliability and budget {m.model}"))
    return out


def estimate_metadata(report: EstimateReport) -> dict[str, Any]:
    """The ``estimate`` asset's metadata from its report (``BatchJob.estimate``).

    Example::

        return MaterializeResult(metadata=estimate_metadata(job.estimate(resource)))
    """
    p = report.primary
    table = [_model_row(m) for m in report.models]
    # Accuracy per confidence bucket on the sample, per model (a gold column and confidences).
    sure = [{"model": m.model, **b} for m in report.models for b in m.reliability or []]
    hosted = [h.to_json() for h in p.hosted]
    priced = [o for o in p.options if o.cost_usd is not None]
    bars_of = ([(f"{m.model} {o.name}", o.cost_usd) for m in report.models for o in m.options
                if o.cost_usd is not None] + [(f"hosted: {h.name}", h.cost_usd) for h in p.hosted])
    return {
        "sample_rows": report.sample_rows, "total_rows": report.total_rows, "predicted_wall_s": p.predicted_wall_s,
        "predicted_tokens_per_hour": p.predicted_tokens_per_hour, "engine_start_s": p.engine_start_s,
        "model": p.model, "stored_rows": p.stored_rows, "prompts_to_generate": p.prompts_to_generate,
        **{f"cost_usd {o.name}": o.cost_usd for o in priced},
        **{f"speed_basis {o.name}": o.speed_basis for o in p.options},
        # The configured model's tokens at the user's hosted batch prices (none built in).
        **{f"hosted_cost_usd {h.name}": h.cost_usd for h in p.hosted},
        **({"hosted_prices": MetadataValue.md(md_table(hosted, ["name", "input_tokens", "output_tokens",
                                                                 "input_per_million_usd", "output_per_million_usd",
                                                                 "cost_usd", "note"]))} if hosted else {}),
        "measured_on": p.measured_on, "measured_tokens_per_s": p.measured_tokens_per_s,
        "chosen_model": str(report.chosen.model if report.chosen else None),
        # The cheapest that clears the bar, a cascade of the models included (estimate/cascades.py).
        **({"best_buy": str(report.best_buy.model)} if report.best_buy else {}),
        **({"chosen_cost_usd": report.chosen.best_cost_usd}
           if report.chosen and report.chosen.best_cost_usd is not None else {}),
        "models": MetadataValue.md(md_table(table, list(table[0]))),
        **({"reliability": MetadataValue.md(md_table(sure, ["model", "bucket", "rows", "correct", "accuracy",
                                                            "mean_confidence"]))} if sure else {}),
        **review_metadata(report),
        "advice": MetadataValue.md("\n".join(f"- {a}" for a in report.advice)),
        "how_to_run": MetadataValue.md("\n".join(f"- '{o.name}' ({o.hardware}, {o.speed_basis}): {o.how}"
                                                 for o in p.options)),
        "cost_chart": MetadataValue.md(bars(bars_of)),
        "chart": MetadataValue.path(report.chart or ""), "report": MetadataValue.path(report.json_path or ""),
        **picture(report.chart, "accuracy and cost"), **picture(report.cascade_chart, "cascades"),
    }
