"""The estimate as a picture: predicted cost and duration per node option and per model."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .records import EstimateReport, ModelForecast

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _short(m: ModelForecast) -> str:
    """A model's name without its hash, with its own engine settings (fp8 and bf16 apart)."""
    settings = ", ".join(f"{k}={v}" for k, v in sorted(m.engine_kwargs.items()))
    return m.model.split("@")[0] + (f" ({settings})" if settings else "")


def write_chart(report: EstimateReport, path: Path) -> Path:
    """Two bar panels (cost of the whole job in USD, engine start included; duration in minutes),
    one bar group per model (labeled with its accuracy and 95% interval), one bar per node option;
    a projected option's bar is hatched, at its range's slow end with a whisker to the fast end;
    options a model does not fit, or whose speed is unknown, are left out. Returns ``path`` (a PNG)."""
    models = report.models
    names = [o.name for o in report.primary.options]
    fig = new_figure(11, 4.2)
    axes = fig.subplots(1, 2)
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        xs, costs, mins, lows = [], [], [], []
        for j, m in enumerate(models):
            opt = m.option(name)
            # Unknown speeds and options that cannot hold the model: no bar.
            if opt is not None and opt.cost_usd is not None and opt.wall_s is not None:
                xs.append(j + (i - (len(names) - 1) / 2) * width)
                costs.append(opt.cost_usd)
                mins.append((opt.wall_s + m.engine_start_s) / 60)
                lows.append((opt.cost_low_usd or 0.0, ((opt.wall_low_s or 0.0) + m.engine_start_s) / 60))
        basis = next((o.speed_basis for m in models for o in m.options if o.name == name), "unknown")
        label = f"{name} ({'projected range' if basis == 'projected' else basis})"
        for k, (ax, values, fmt) in enumerate(((axes[0], costs, "${:.4g}"), (axes[1], mins, "{:.1f} min"))):
            bars = ax.bar(xs, values, width, label=label, hatch="//" if basis == "projected" else None,
                          alpha=0.6 if basis == "projected" else 1.0)
            if basis == "projected":  # the range: the bar is its slow end, the whisker reaches the fast end
                low = [v - lo[k] for v, lo in zip(values, lows, strict=True)]
                ax.errorbar(xs, values, yerr=[low, [0] * len(values)], fmt="none", ecolor="black", capsize=3)
            ax.bar_label(bars, labels=[fmt.format(v) for v in values], fontsize=7)
    chosen = report.chosen.model if report.chosen else None
    labels = [(f"{_short(m)}{' (chosen)' if m.model == chosen else ''}\n"
               + (f"accuracy {m.accuracy:.2f} ({m.accuracy_low:.2f}-{m.accuracy_high:.2f}), "
                  f"{m.sample_rows} rows" if m.accuracy is not None else "accuracy not measured"))
              for m in models]
    titles = ("predicted cost of the job incl. engine start (USD)", "predicted duration incl. engine start (min)")
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xticks(range(len(models)), labels, fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.margins(y=0.12)
    handles, names_shown = axes[0].get_legend_handles_labels()
    fig.legend(handles, names_shown, loc="lower center", ncol=max(len(names), 1), fontsize=8)
    picked = next((_short(m) for m in models if m.model == chosen), None)
    fig.suptitle(f"{report.job}: {report.total_rows:,} rows, sample of {report.sample_rows} measured on "
                 f"{report.primary.measured_on}" + (f"; chosen: {picked}" if picked else ""),
                 fontsize=11)
    fig.tight_layout(rect=(0, 0.07, 1, 1))  # room for the legend under the panels
    return save_png(fig, path)


def new_figure(width: float, height: float) -> Figure:
    """An empty figure of ``width`` x ``height`` inches on the Agg canvas (PNG, no display).

    Not through pyplot: its import (and its backend machinery) costs every run that draws a chart
    most of a CPU second, and its figure registry would keep each figure until closed. A bare
    figure takes the same rcParams, so the picture is the same."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def save_png(fig: Figure, path: Path) -> Path:
    """``fig`` as a PNG at ``path``, written whole (a reader never sees half an image)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    tmp.replace(path)
    return path
