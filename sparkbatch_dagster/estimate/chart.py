"""The estimate as a picture: predicted cost and duration per node option and per model."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def write_chart(report: dict[str, Any], path: Path) -> Path:
    """Two bar panels (cost of the whole job in USD, engine start included; duration in minutes),
    one bar group per model (labeled with its accuracy and 95% interval), one bar per node option;
    options a model does not fit are left out. Returns ``path`` (a PNG)."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a rented box or in CI
    import matplotlib.pyplot as plt

    models = report["models"]
    names = [o["name"] for o in report["options"]]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        xs, costs, mins = [], [], []
        for j, m in enumerate(models):
            opt = next(o for o in m["options"] if o["name"] == name)
            if opt["fits"]:
                xs.append(j + (i - (len(names) - 1) / 2) * width)
                costs.append(opt["cost_usd"])
                mins.append((opt["wall_s"] + m["engine_start_s"]) / 60)
        for ax, values, fmt in ((axes[0], costs, "${:.4g}"), (axes[1], mins, "{:.1f} min")):
            bars = ax.bar(xs, values, width, label=name)
            ax.bar_label(bars, labels=[fmt.format(v) for v in values], fontsize=7)
    chosen = report.get("chosen_model")
    labels = [(f"{m['model'].split('@')[0]}{' (chosen)' if m['model'] == chosen else ''}\n"
               + (f"accuracy {m['accuracy']:.2f} ({m['accuracy_low']:.2f}-{m['accuracy_high']:.2f}), "
                  f"{m['sample_rows']} rows" if m["accuracy"] is not None else "accuracy not measured"))
              for m in models]
    titles = ("predicted cost of the job incl. engine start (USD)", "predicted duration incl. engine start (min)")
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xticks(range(len(models)), labels, fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.margins(y=0.12)
    handles, names_shown = axes[0].get_legend_handles_labels()
    fig.legend(handles, names_shown, loc="lower center", ncol=max(len(names), 1), fontsize=8)
    fig.suptitle(f"{report['job']}: {report['total_rows']:,} rows, sample of {report['sample_rows']}"
                 + (f"; chosen: {chosen.split('@')[0]}" if chosen else ""), fontsize=11)
    fig.tight_layout(rect=(0, 0.07, 1, 1))  # room for the legend under the panels
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
    return path
