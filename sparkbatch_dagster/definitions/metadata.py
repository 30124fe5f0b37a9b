"""What the Dagster UI shows of a report: Markdown tables and bars, and the ``estimate`` asset's
metadata (each model's cost per node option and, with the user's price table, on each hosted
batch API, side by side)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dagster import MetadataValue


def md_table(rows: Sequence[dict[str, Any]], cols: Sequence[str]) -> str:
    """Rows as a Markdown table of ``cols`` (a missing value: an empty cell)."""
    head = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
    return head + "\n".join("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows)


def bars(rows: Sequence[tuple[str, float]], width: int = 30) -> str:
    """A bar chart in Markdown, which the Dagster UI shows in place (a PNG path it does not)."""
    top = max((v for _, v in rows), default=0) or 1
    return "\n".join(f"- `{name}` {'█' * max(1, round(width * v / top))} ${v:.4f}" for name, v in rows)


def _price(option: dict[str, Any]) -> str:
    """An option's cost in a table cell: a point when measured, a range when projected."""
    if option["cost_usd"] is None:
        return f"not priced ({option['speed_basis']})"
    if option["speed_basis"] == "projected":
        return f"{option['cost_low_usd']:.4f}-{option['cost_usd']:.4f} (projected)"
    return f"{option['cost_usd']:.4f} (measured)"


def estimate_metadata(report: dict[str, Any]) -> dict[str, Any]:
    """The ``estimate`` asset's metadata from its report (``BatchJob.estimate``).

    Example::

        return MaterializeResult(metadata=estimate_metadata(job.estimate(resource)))
    """
    table = [{"model": m["model"], "rows": m["sample_rows"], "accuracy": m["accuracy"],
              "95% interval": f"{m['accuracy_low']}-{m['accuracy_high']}" if m["accuracy"] is not None else "",
              "tokens/hour": m["predicted_tokens_per_hour"], "stored rows": m["stored_rows"],
              **{f"{o['name']} $": _price(o) for o in m["options"]},
              **{f"hosted: {h['name']} $": f"{h['cost_usd']:.4f}" for h in m.get("hosted", [])}}
             for m in report["models"]]
    # Accuracy per confidence bucket on the sample, per model (a gold column and confidences).
    sure = [{"model": m["model"], **b} for m in report["models"] for b in m.get("reliability") or []]
    hosted = report.get("hosted") or []
    return {
        **{k: report[k] for k in ("sample_rows", "total_rows", "predicted_wall_s", "predicted_tokens_per_hour",
                                  "engine_start_s", "model", "stored_rows", "prompts_to_generate")},
        **{f"cost_usd {o['name']}": o["cost_usd"] for o in report["options"] if o["cost_usd"] is not None},
        **{f"speed_basis {o['name']}": o["speed_basis"] for o in report["options"]},
        # The configured model's tokens at the user's hosted batch prices (none built in).
        **{f"hosted_cost_usd {h['name']}": h["cost_usd"] for h in hosted},
        **({"hosted_prices": MetadataValue.md(md_table(hosted, ["name", "input_tokens", "output_tokens",
                                                                 "input_per_million_usd", "output_per_million_usd",
                                                                 "cost_usd", "note"]))} if hosted else {}),
        "measured_on": report["measured_on"], "measured_tokens_per_s": report["measured_tokens_per_s"],
        "chosen_model": str(report["chosen_model"]),
        # The cheapest that clears the bar, a cascade of the models included (estimate/cascades.py).
        **({"best_buy": str(report["best_buy"]["model"])} if report.get("best_buy") else {}),
        **({"chosen_cost_usd": report["chosen_cost_usd"]} if report["chosen_cost_usd"] is not None else {}),
        "models": MetadataValue.md(md_table(table, list(table[0]))),
        **({"reliability": MetadataValue.md(md_table(sure, ["model", "bucket", "rows", "correct", "accuracy",
                                                            "mean_confidence"]))} if sure else {}),
        "advice": MetadataValue.md("\n".join(f"- {a}" for a in report["advice"])),
        "how_to_run": MetadataValue.md("\n".join(f"- '{o['name']}' ({o['hardware']}, {o['speed_basis']}): "
                                                 f"{o['how']}" for o in report["options"])),
        "cost_chart": MetadataValue.md(bars([(f"{m['model']} {o['name']}", o["cost_usd"])
                                             for m in report["models"] for o in m["options"]
                                             if o["cost_usd"] is not None]
                                            + [(f"hosted: {h['name']}", h["cost_usd"]) for h in hosted])),
        "chart": MetadataValue.path(report["chart"]), "report": MetadataValue.path(report["json"]),
    }
