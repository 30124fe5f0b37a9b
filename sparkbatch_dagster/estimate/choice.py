"""Which model is the best buy: accuracy intervals, the choice, and the advice in words.

Accuracy against the gold column is a 95% Wilson score interval; a model clears the bar when
the interval's LOWER bound does (``verdict`` says 'straddles' while it is undecided, and
``estimate.sample_model`` then times more rows). The best buy is the cheapest model that
clears: predicted cost of the whole job (engine start + generation) on its cheapest node
option. ``advise`` puts the choice, its trade-offs and how far to trust them into words.
"""

from __future__ import annotations

import math

from ..spec import EstimateSpec
from .records import ModelForecast, OptionPrice

#: Two-sided 95% normal quantile, for the Wilson score interval.
Z95 = 1.959963984540054


def wilson(correct: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a proportion: unlike the normal approximation it stays inside
    [0, 1] and keeps a sensible width at 0 or n successes."""
    if n <= 0:
        return 0.0, 1.0
    p = correct / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def verdict(correct: float | None, rows: int, bar: float) -> str | None:
    """'clears' (the interval's lower bound reaches ``bar``), 'fails' (its upper bound is under
    it), 'straddles' (not decided by this sample), or None without a gold column."""
    if correct is None or rows <= 0:
        return None
    lo, hi = wilson(correct, rows)
    return "clears" if lo >= bar else "fails" if hi < bar else "straddles"


def rows_to_decide(accuracy: float, bar: float, rows: int, limit: int = 10**8) -> int | None:
    """Rows a sample would need, at this accuracy, for its interval to clear or fall under ``bar``
    (None when the accuracy sits on the bar: no sample size decides it)."""
    if accuracy == bar:
        return None

    def decided(n: int) -> bool:
        return verdict(accuracy * n, n, bar) != "straddles"

    lo, hi = rows, max(rows, 1)
    while not decided(hi):
        if hi >= limit:
            return None
        lo, hi = hi, hi * 2
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if decided(mid) else (mid + 1, hi)
    return hi


def clears(model: ModelForecast, bar: float) -> bool:
    """The model's 95% interval lies at or above ``bar`` (its lower bound reaches it)."""
    return model.accuracy_low is not None and model.accuracy_low >= bar


def choose(models: list[ModelForecast], bar: float, has_gold: bool = True) -> ModelForecast | None:
    """The best buy: the cheapest model (whole job, engine start included, on its cheapest node
    option) whose accuracy interval clears ``bar``; on equal cost the more accurate one. Without
    a gold column, the cheapest model. None when no model qualifies (or none has a priced option).
    A projected price counts at its range's slow end (``cost_usd``): the hours a rented box may
    take, so a choice never rests on the hope of the fast end; an unknown one not at all."""
    ok = [m for m in models if m.best_cost_usd is not None and (not has_gold or clears(m, bar))]
    return min(ok, key=lambda m: (m.best_cost_usd, -(m.accuracy or 0.0), m.weights_gb or math.inf),
               default=None)


def _hm(seconds: float | None) -> str:
    if seconds is None:  # an unpriced option: no duration to print
        return "unknown"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m{int(seconds % 60):02d}s"


def _usd(o: OptionPrice) -> float:
    """An option's cost for comparing (an unpriced one last)."""
    return o.cost_usd if o.cost_usd is not None else math.inf


def _bounds(m: ModelForecast) -> tuple[float, float]:
    """A scored model's 95% accuracy interval (both ends are set with ``accuracy``)."""
    return m.accuracy_low or 0.0, m.accuracy_high or 0.0


def _when(o: OptionPrice) -> str:
    """An option's duration and cost, saying where the speed comes from."""
    if o.speed_basis == "projected":
        return (f"projected for {o.hardware} from its declared figures: {_hm(o.wall_low_s)}-{_hm(o.wall_s)}, "
                f"${o.cost_low_usd:.4f}-${o.cost_usd:.4f}")
    return f"measured on this kind of machine: {_hm(o.wall_s)}, ${o.cost_usd:.4f}"


def _basis(m: ModelForecast) -> str:
    return ", projected: the range's slow end" if m.best_speed_basis == "projected" else ""


def measured_line(m: ModelForecast) -> str:
    """What was measured where, and which prices are not this machine's speed."""
    text = (f"Measured on {m.measured_on}: {m.measured_tokens_per_s:,.0f} tokens/s of {m.model} "
            f"({m.sample_tokens:,} tokens in {m.sample_s} s).")
    projected = [o.name for o in m.options if o.speed_basis == "projected"]
    unknown = [o for o in m.options if o.speed_basis == "unknown"]
    if projected:
        text += (f" {', '.join(repr(n) for n in projected)}: other hardware, so projected from its declared "
                 "figures (roofline model, a range; the slow end is priced), not this machine's speed at its rate.")
    for o in unknown:
        text += f" '{o.name}' is not priced: {o.why}."
    return text


def hosted_line(m: ModelForecast) -> list[str]:
    """The job's tokens at the user's hosted batch prices, beside the box's cheapest option, in
    words ([] without a price table)."""
    if not m.hosted:
        return []
    offers = "; ".join(f"'{h.name}' ${h.cost_usd:.4f}" for h in m.hosted)
    box = (f"this job on the box: ${m.best_cost_usd:.4f} on '{m.best_option}', engine start included"
           if m.best_cost_usd is not None else "no box option is priced")
    return [f"At your hosted batch prices, the same job ({m.prompts_to_generate:,} prompts: "
            f"{m.predicted_input_tokens:,} input and {m.predicted_output_tokens:,} output tokens, as "
            f"{m.model}'s tokenizer counts them; a hosted model's count and answer length differ) would cost: "
            f"{offers}; {box}."]


def _interval(m: ModelForecast) -> str:
    return (f"{m.accuracy:.3f}, 95% interval {m.accuracy_low:.3f}-{m.accuracy_high:.3f} "
            f"on {m.scored_rows} rows")  # the rows with a truth


def tradeoff(m: ModelForecast, ref: ModelForecast, has_gold: bool) -> str | None:
    """``m`` against ``ref`` in words: cost of the whole job (engine start included, each on its
    cheapest node option) and accuracy in points, e.g. 'A is 8% cheaper and 2.5 points more
    accurate than B'. None when either fits no node option."""
    if m.best_cost_usd is None or ref.best_cost_usd is None:
        return None
    pct = (m.best_cost_usd / ref.best_cost_usd - 1) * 100 if ref.best_cost_usd else 0.0
    cost = (f"{-pct:.0f}% cheaper" if pct <= -0.5 else f"{pct:.0f}% dearer" if pct >= 0.5 else None)
    money = (f"${m.best_cost_usd:.4f} vs ${ref.best_cost_usd:.4f} for the whole job, engine start included")
    if not has_gold or m.accuracy is None or ref.accuracy is None:
        what = f"is {cost} than" if cost else "costs about the same as"
        return f"{m.model} {what} {ref.model} ({money}); quality not measured (no gold_column)."
    points = (m.accuracy - ref.accuracy) * 100
    acc = (f"{points:.1f} points more accurate" if points >= 0.05
           else f"{-points:.1f} points less accurate" if points <= -0.05 else None)
    (m_low, m_high), (ref_low, ref_high) = _bounds(m), _bounds(ref)
    noise = ("" if m_low > ref_high or ref_low > m_high
             else "; the intervals overlap, so the accuracy gap is within the samples' noise")
    detail = (f"({money}; accuracy {m.accuracy:.3f} vs {ref.accuracy:.3f} on {m.scored_rows} and "
              f"{ref.scored_rows} rows{noise if acc else ''})")
    if cost and acc:
        same_way = (pct < 0) == (points > 0)  # cheaper and more accurate, or dearer and less accurate
        return f"{m.model} is {cost} {'and' if same_way else 'but'} {acc} than {ref.model} {detail}."
    if cost:
        return f"{m.model} is {cost} than {ref.model} and as accurate {detail}."
    if acc:
        return f"{m.model} costs about the same as {ref.model} and is {acc} {detail}."
    return f"{m.model} costs about the same as {ref.model} and is as accurate {detail}."


def _widened(m: ModelForecast, bar: float, cap: int) -> str:
    first_rows, first_correct, *truth = m.sample_steps[0]  # (rows, correct, rows with a truth)
    first_scored = truth[0] if truth else first_rows
    lo, hi = wilson(first_correct, first_scored)
    state = verdict(m.sample_correct, m.scored_rows, bar)
    outcome = {"clears": "it clears the bar", "fails": "it falls short of the bar"}.get(
        state or "", f"it still straddles the bar at the cap (estimate.max_sample_rows={cap})")
    return (f"Sampled {m.extra_rows} more rows of {m.model} because its interval straddled the bar "
            f"{bar} ({lo:.3f}-{hi:.3f} on {first_scored} rows); now {m.accuracy_low:.3f}-{m.accuracy_high:.3f} "
            f"on {m.scored_rows} rows: {outcome}.")


def advise(primary: ModelForecast, chosen: ModelForecast | None, est: EstimateSpec, sample_rows: int,
           batch: int, on_gpu: bool, has_gold: bool, models: list[ModelForecast] | None = None,
           total_rows: int | None = None) -> list[str]:
    """Plain-language advice: which node option, which model and why (cost and accuracy against
    the configured model, in numbers), what was re-sampled, what is already paid for, and how
    much to trust the numbers. ``primary`` is the configured model, ``models`` every model
    measured (primary first)."""
    models = models or [primary]
    bar = est.accuracy_bar
    out = []
    opts = primary.options
    out.append(measured_line(primary))
    size = f"{primary.weights_gb} GB of weights" if primary.weights_gb is not None else "weight size unknown"
    one = next((o for o in opts if o.fits and o.tensor_parallel_size == 1 and o.nodes == 1), None)
    priced = [o for o in opts if o.cost_usd is not None]
    cheapest = min(priced, key=_usd, default=None)
    if one is not None and one.cost_usd is None:
        out.append(f"{primary.model} ({size}) fits one node, but '{one.name}' is not priced: {one.why}.")
    elif one is not None:
        out.append(f"{primary.model} ({size}) fits one node: run it on '{one.name}' ({_when(one)}, engine "
                   f"start included): {one.how}.")
        for o in priced:
            if o is not one and _usd(o) > _usd(one) and o.tensor_parallel_size is not None:
                more = (_usd(o) / _usd(one) - 1) * 100 if one.cost_usd else 0.0
                more_of = "nodes" if o.nodes > 1 else "GPUs"
                out.append(f"'{o.name}' would finish in {_hm(o.wall_s)} but cost ${o.cost_usd:.4f} "
                           f"(+{more:.0f}%{', projected' if o.speed_basis == 'projected' else ''}): this job is "
                           f"throughput-bound, so more {more_of} raise the cost without raising tokens per dollar; "
                           "rent them only to meet a deadline.")
    else:
        tp = max(o.tensor_parallel_size or 1 for o in opts)
        where = (f"the cheapest option that holds it is '{cheapest.name}' ({_when(cheapest)}): {cheapest.how}"
                 if cheapest else
                 "no listed option holds it: add one with enough GPUs (NodeOption(nodes=..., gpus_per_node=...))")
        out.append(f"{primary.model} ({size}) does not fit one GPU's memory: it needs {tp} GPUs "
                   f"(tensor_parallel_size={tp}); {where}. A smaller model avoids that.")
    if sample_rows < batch:
        where = "the GPU" if on_gpu else "the engine"
        out.append(f"The sample ({sample_rows} rows) is smaller than one batch ({batch} rows): {where} was not "
                   "full, so the predicted time is an upper bound (on an H200, +38% at 80 rows, +2.5% at 1,024); "
                   "set estimate.fill_batch=True or raise estimate.sample_rows for a tighter one.")
    for m in models:
        if m.stored_rows:
            how = "" if m.stored_exact else " (extrapolated from the sample: the input is too large to check all)"
            left = (f"the prediction covers only the {m.prompts_to_generate} prompts still to generate"
                    if m.prompts_to_generate else "a run costs nothing, not even an engine start")
            of = f" of {total_rows:,}" if total_rows else ""
            out.append(f"{m.stored_rows:,}{of} rows already have {m.model}'s answer in the result store "
                       f"(paid for by an earlier run){how}: {left}.")
    for m in models:
        if has_gold and m.extra_rows and m.sample_steps:
            out.append(_widened(m, bar, est.max_sample_rows))
    switch = "" if chosen is None or chosen is primary else (
        f"; the job runs {primary.model} now: set VLLMResource(model={chosen.configured_as!r}"
        + (f", engine_kwargs={chosen.engine_kwargs!r}" if chosen.engine_kwargs else "") + ") to switch")
    if not has_gold:
        if chosen is not None:
            out.append(f"No gold_column: quality was not measured, so the model is chosen by cost alone: "
                       f"{chosen.model} (${chosen.best_cost_usd:.4f} on '{chosen.best_option}'"
                       f"{_basis(chosen)}){switch}. "
                       "Add a gold column to compare accuracy.")
        else:
            out.append("No gold_column: quality was not measured, and no model fits a listed node option.")
    elif chosen is not None:
        out.append(f"Cheapest model whose accuracy clears {bar} with 95% confidence: {chosen.model} "
                   f"({_interval(chosen)}; ${chosen.best_cost_usd:.4f} for the whole job on "
                   f"'{chosen.best_option}', engine start included{_basis(chosen)}){switch}.")
    else:
        scored = [m for m in models if m.accuracy_low is not None]
        closest = max(scored, key=lambda m: _bounds(m)[0], default=None)
        text = f"No model's 95% accuracy interval clears {bar}"
        if closest is not None:
            if verdict(closest.sample_correct, closest.scored_rows, bar) == "fails":
                then = "its whole interval is under the bar"
            elif (need := rows_to_decide(closest.accuracy or 0.0, bar, closest.scored_rows)) is None:
                then = "its interval straddles the bar and no sample size decides it (its accuracy sits on the bar)"
            else:
                outcome = "clears" if (closest.accuracy or 0.0) > bar else "falls short"
                then = (f"its interval straddles the bar; at that accuracy about {need:,} rows would show it "
                        f"{outcome} (raise estimate.max_sample_rows, now {est.max_sample_rows})")
            text += f". Closest: {closest.model} ({_interval(closest)}): {then}"
        out.append(text + ". Try larger models, or a better prompt.")
    if has_gold:
        for m in models:
            if m is not chosen and m.accuracy_low is not None and not clears(m, bar):
                state = verdict(m.sample_correct, m.scored_rows, bar)
                why = "still straddles the bar" if state == "straddles" else "falls short of the bar"
                out.append(f"{m.model} does not clear {bar}: {why} ({_interval(m)}).")
    for m in models:
        if m is not primary:
            line = tradeoff(m, primary, has_gold)
            if line:
                out.append(line)
    return out
