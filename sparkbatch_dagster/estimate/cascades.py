"""Cascades judged on the estimate's sample: which pair of models, at which threshold, is the
cheapest way to clear the accuracy bar (``JobSpec.cascade``, ``docs/labels.md``).

Every timed model answered the same sample rows, each with a confidence and, against the gold
column, right or wrong. For an ordered pair (A first, then B) and a threshold ``t``, a sample row
is A's answer where A was at least ``t`` sure, else B's: that gives the cascade's accuracy on the
sample (its 95% Wilson interval, as for a model) and the share of rows it escalates. The whole
job's cost on a node option is A's (every row, its engine start) plus that share of B's
generation and B's engine start (when anything escalates), at the option's price; a rented box
runs both engines. The threshold picked for a pair is the cheapest that clears the bar, else the
one with the highest lower bound.

A threshold picked on the rows it is then scored on flatters itself (of eleven tried, the luckiest
wins), so the figures reported for a pair are held out: its common rows are split into
:data:`FOLDS` folds (seeded; fewer when the rows are few, :func:`fold_count`), each fold is scored
at the threshold the same rule picks on the OTHER folds, and the folds are pooled: the held-out
accuracy with its Wilson interval, the held-out escalated share and the cost at that share. A pair
``clears`` when its held-out lower bound reaches the bar. The threshold to configure is the one
the rule picks on every row; its in-sample accuracy is kept apart (``in_sample_accuracy``) to
compare. Each point of the curve is one fixed threshold on every row: nothing is picked there.

Assumed, and said in the report: the rows escalated cost B what an average row costs it (they
may be longer or harder), and the option holds both models at once.

Example::

    pairs = evaluate(models, timings, bar=0.8)      # models: the estimate's, timings: their Timing
    best = cheapest(pairs)                          # None when no cascade clears the bar
    best.pick.accuracy_low, best.in_sample_accuracy # held out; in-sample, for comparison
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

from .chart import new_figure, save_png
from .choice import wilson
from .folds import kfold
from .records import Cascade, CascadeOption, CascadePoint, ModelForecast, Stage
from .sample import Timing

#: Thresholds tried for each pair.
THRESHOLDS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.99, 1.0)
#: Fewer common rows than this say too little to judge a pair.
MIN_ROWS = 10
#: Folds of the cross-validation, and the fewest rows a held-out fold has when there are fewer folds.
FOLDS = 5
FOLD_ROWS = 10
#: The folds' shuffle: the same sample always splits the same way.
SEED = 0


def fold_count(rows: int) -> int:
    """Folds for ``rows`` common rows: :data:`FOLDS`, fewer when that would leave a fold under
    :data:`FOLD_ROWS` rows (two at least: one to pick on, one to score)."""
    return max(2, min(FOLDS, rows // FOLD_ROWS))


def evaluate(models: list[ModelForecast], timings: list[Timing], bar: float, seed: int = SEED) -> list[Cascade]:
    """One cascade per ordered pair of models that answered at least ``MIN_ROWS`` rows in common
    with a gold column and confidences: its curve over :data:`THRESHOLDS`, its threshold (picked on
    every row) and its held-out figures."""
    out = []
    for (a, ta), (b, tb) in itertools.permutations(zip(models, timings, strict=True), 2):
        common = sorted(set(ta.by_row) & set(tb.by_row))
        if len(common) < MIN_ROWS or all(ta.by_row[r][0] is None for r in common):
            continue
        curve = [_point(a, b, ta, tb, common, t) for t in THRESHOLDS]
        final = _pick(curve, bar)
        folds = fold_count(len(common))
        held, picked = _held_out(a, b, ta, tb, common, final.threshold, bar, folds, seed)
        out.append(Cascade(
            model=f"cascade({a.model}<{final.threshold:g}, {b.model})", stages=[a.model, b.model],
            configured_as=[Stage(model=a.configured_as, below=final.threshold), Stage(model=b.configured_as)],
            sample_rows=len(common), clears=held.accuracy_low >= bar, folds=folds, fold_thresholds=picked,
            in_sample_accuracy=final.accuracy, in_sample_accuracy_low=final.accuracy_low,
            in_sample_accuracy_high=final.accuracy_high, pick=held, curve=curve,
        ))
    return out


def cheapest(cascades: list[Cascade]) -> Cascade | None:
    """The cheapest cascade that clears the bar (held out), or None."""
    ok = [c for c in cascades if c.clears and c.pick.best_cost_usd is not None]
    return min(ok, key=lambda c: _usd(c.pick)) if ok else None


def _usd(p: CascadePoint) -> float:
    return p.best_cost_usd if p.best_cost_usd is not None else math.inf


def _pick(curve: list[CascadePoint], bar: float) -> CascadePoint:
    """The rule: the cheapest point that clears ``bar`` on the rows of ``curve``, else the one
    with the highest lower bound (the lowest threshold on a tie)."""
    priced = [p for p in curve if p.best_cost_usd is not None]
    clearing = [p for p in priced if p.accuracy_low >= bar]
    return min(clearing, key=_usd) if clearing else max(priced or curve, key=lambda p: p.accuracy_low)


def _score(ta: Timing, tb: Timing, rows: list[str], threshold: float) -> tuple[int, int]:
    """(rows right, rows escalated) of the pair at ``threshold`` on ``rows``: A's answer where A
    was at least ``threshold`` sure, else B's (A without a confidence: B's)."""
    escalated = {r for r in rows if (sure := ta.by_row[r][0]) is None or sure < threshold}
    return sum(tb.by_row[r][1] if r in escalated else ta.by_row[r][1] for r in rows), len(escalated)


def _held_out(a: ModelForecast, b: ModelForecast, ta: Timing, tb: Timing, common: list[str], threshold: float,
              bar: float, folds: int, seed: int) -> tuple[CascadePoint, list[float]]:
    """The pair's held-out figures at ``threshold`` (picked on every row): each fold scored at the
    threshold :func:`_pick` chooses on the other folds, pooled; and those thresholds, fold by fold."""
    correct = escalated = 0
    picked = []
    for train, test in kfold(len(common), folds, seed):
        on = [common[i] for i in train]
        t = _pick([_point(a, b, ta, tb, on, x) for x in THRESHOLDS], bar).threshold
        right, up = _score(ta, tb, [common[i] for i in test], t)
        correct, escalated = correct + right, escalated + up
        picked.append(t)
    n = len(common)
    low, high = wilson(correct, n)
    options, best = _options(a, b, escalated / n, escalated > 0)
    return CascadePoint(threshold=threshold, accuracy=round(correct / n, 4), accuracy_low=round(low, 4),
                        accuracy_high=round(high, 4), escalated_share=round(escalated / n, 4), options=options,
                        best_option=best.name if best else None,
                        best_cost_usd=best.cost_usd if best else None), picked


def _point(a: ModelForecast, b: ModelForecast, ta: Timing, tb: Timing, common: list[str],
           threshold: float) -> CascadePoint:
    """The pair at one threshold: accuracy on ``common``, escalated share, cost per option."""
    correct, escalated = _score(ta, tb, common, threshold)
    n, share = len(common), escalated / len(common)
    low, high = wilson(correct, n)
    options, best = _options(a, b, share, escalated > 0)
    return CascadePoint(threshold=threshold, accuracy=round(correct / n, 4), accuracy_low=round(low, 4),
                        accuracy_high=round(high, 4), escalated_share=round(share, 4), options=options,
                        best_option=best.name if best else None, best_cost_usd=best.cost_usd if best else None)


def _options(a: ModelForecast, b: ModelForecast, share: float,
             escalates: bool) -> tuple[list[CascadeOption], CascadeOption | None]:
    """The whole job on each of A's options with ``share`` of the rows escalated to B, and the cheapest."""
    options = []
    for oa in a.options:
        ob = b.option(oa.name)
        seconds = cost = None
        if oa.cost_usd is not None and oa.wall_s is not None and (not escalates or (
                ob is not None and ob.cost_usd is not None)):
            # A as the estimate priced it alone, plus B's share of generation and B's start.
            extra = share * (ob.wall_s or 0.0) + b.engine_start_s if escalates and ob is not None else 0.0
            seconds = oa.wall_s + a.engine_start_s + extra
            cost = round(oa.cost_usd + oa.hourly_usd * extra / 3600, 6)
        options.append(CascadeOption(name=oa.name, wall_s=round(seconds, 1) if seconds is not None else None,
                                     cost_usd=cost))
    best = min((o for o in options if o.cost_usd is not None), key=lambda o: o.cost_usd or 0.0, default=None)
    return options, best


def _held(c: Cascade) -> str:
    """How a cascade's figures were held out, in words."""
    few = f"; {c.folds} folds, not {FOLDS}: only {c.sample_rows} rows in common" if c.folds < FOLDS else ""
    return (f"held out: {c.folds}-fold cross-validation, each fold scored at the threshold picked on the other "
            f"folds{few}; {c.in_sample_accuracy:.1%} on the rows its threshold was picked on")


def advice(cascades: list[Cascade], chosen: ModelForecast | None, bar: float) -> list[str]:
    """The cascades in words: the cheapest that clears the bar (held out) against the model chosen alone."""
    if not cascades:
        return []
    best = cheapest(cascades)
    if best is None:
        top = max(cascades, key=lambda c: c.pick.accuracy_low)
        return [f"No cascade clears the accuracy bar {bar:g} on held-out sample rows: the best, {top.model}, "
                f"reaches {top.pick.accuracy:.1%} (95% interval {top.pick.accuracy_low:.1%}-"
                f"{top.pick.accuracy_high:.1%}; {_held(top)})."]
    pick = best.pick
    line = (f"Cascade {best.model}: {pick.accuracy:.1%} accurate on held-out sample rows (95% interval "
            f"{pick.accuracy_low:.1%}-{pick.accuracy_high:.1%}; {_held(best)}), {pick.escalated_share:.0%} of "
            f"rows go to {best.stages[1]}, ${pick.best_cost_usd} for the whole job on {pick.best_option}")
    if chosen is not None and chosen.best_cost_usd is not None:
        cheaper = _usd(pick) < chosen.best_cost_usd
        line += (f"; {'cheaper than' if cheaper else 'dearer than'} {chosen.model} alone "
                 f"(${chosen.best_cost_usd}){': the best buy' if cheaper else ''}")
    else:
        line += f"; no model alone clears {bar:g}: the best buy"
    return [line + ". (Escalated rows priced as average rows; the box holds both models.)"]


def write_chart(cascades: list[Cascade], path: Path) -> Path | None:
    """Threshold against accuracy (with its 95% lower bound) and cost, one line per pair; None
    when there is no cascade to draw."""
    if not cascades:
        return None
    fig = new_figure(11, 4.2)
    acc, cost = fig.subplots(1, 2)
    for c in cascades:
        name = f"{c.stages[0]} -> {c.stages[1]}"
        xs = [p.threshold for p in c.curve]
        line = acc.plot(xs, [p.accuracy for p in c.curve], marker="o", label=name)[0]
        acc.plot(xs, [p.accuracy_low for p in c.curve], linestyle=":", color=line.get_color())
        held = c.pick  # the held-out figure at the picked threshold, with its interval
        acc.errorbar([held.threshold], [held.accuracy], yerr=[[held.accuracy - held.accuracy_low],
                     [held.accuracy_high - held.accuracy]], fmt="*", markersize=11, capsize=3,
                     color=line.get_color())
        cost.plot(xs, [p.best_cost_usd for p in c.curve], marker="o", label=name, color=line.get_color())
    acc.set(xlabel="threshold (below it, a row goes to the second model)", ylabel="accuracy on the sample",
            title="accuracy (dotted: 95% lower bound; star: held out at the pick)")
    cost.set(xlabel="threshold", ylabel="whole job, USD (cheapest option)", title="cost")
    acc.legend(fontsize=7)
    fig.tight_layout()
    return save_png(fig, path)
