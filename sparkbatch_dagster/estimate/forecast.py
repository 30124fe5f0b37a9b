"""From a timed sample to the whole job: predicted wall time, tokens per hour and cost on every
node option (engine start included; each price says where its speed comes from, :mod:`.pricing`),
and the report the ``estimate`` asset and ``sparkbatch estimate`` write (JSON + chart).
"""

from __future__ import annotations

import json
from pathlib import Path

from msgspec.structs import replace

from ..home import atomic_write_text
from ..run.reliability import reliability
from ..spec import HostedPrice, NodeOption
from .choice import wilson
from .machine import Machine
from .pricing import price_hosted, price_options
from .records import EstimateReport, ModelForecast
from .roofline import ModelShape, Workload
from .sample import Sample, Stored, Timing


def predict(sample: Sample, timing: Timing, options: list[NodeOption], weights_gb: float | None,
            stored: Stored | None = None, engines: int = 1, *, machine: Machine | None = None,
            shape: ModelShape | None = None, concurrency: int = 1024,
            hosted: list[HostedPrice] | None = None) -> ModelForecast:
    """Extrapolate one model's timed sample to the prompts the job still has to generate, and
    price the whole job (engine start included) on every node option, each with its
    ``speed_basis`` (:mod:`.pricing`): measured on ``machine``'s kind (default: unknown), else
    projected from the option's hardware figures, ``shape`` and the sample's token counts with
    ``concurrency`` (``max_num_seqs``) sequences at once, else unknown.

    ``stored`` (default: nothing stored) says which prompts the result store already answers:
    they are not predicted, and a job with nothing left to generate starts no engine.
    ``engines``: how many engines timed the sample together (a data-parallel resource, several
    servers): ``predicted_wall_s`` is this setup's, each option's is that of its own engines.
    ``hosted``: the user's hosted batch prices; ``hosted`` in the result prices the same input and
    output tokens (per distinct prompt, times the prompts to generate) at each.
    """
    machine = machine or Machine("unknown", "an unknown machine")
    stored = stored or Stored(0, 0, sample.distinct_prompts)
    tokens = timing.prompt_tokens + timing.output_tokens
    tps = tokens / timing.seconds if timing.seconds > 0 else 0.0
    # Per distinct prompt generated (error rows with 0 tokens stay in the mean); duplicates in
    # a shard are generated once, stored prompts not at all.
    requests = max(timing.requests or timing.rows, 1)
    per_request = tokens / requests
    predicted_tokens = per_request * stored.to_generate
    wall = predicted_tokens / tps if tps else 0.0
    if timing.s_per_token > 0:  # two draws fitted: the engine's fill-up paid once, as in the run
        tps = 1 / timing.s_per_token
        wall = timing.fill_s + predicted_tokens * timing.s_per_token if stored.to_generate else 0.0
    start = timing.engine_start_s if stored.to_generate else 0.0
    accuracy = low = high = None
    if timing.correct is not None and timing.scored:  # over the rows with a truth only
        accuracy = timing.correct / timing.scored
        low, high = wilson(timing.correct, timing.scored)
    scale = stored.to_generate / requests
    work = Workload(stored.to_generate, timing.prompt_tokens * scale, timing.output_tokens * scale, concurrency)
    priced = price_options(options, wall=wall, engines=engines, start=start, weights_gb=weights_gb,
                           machine=machine, work=work, shape=shape)
    hosted_rows = price_hosted(hosted or [], work.prompt_tokens, work.output_tokens)
    best = min((o for o in priced if o.cost_usd is not None), key=lambda o: o.cost_usd or 0.0, default=None)
    first_rows = timing.steps[0][0] if timing.steps else timing.rows
    return ModelForecast(
        model=timing.model, weights_gb=round(weights_gb, 3) if weights_gb is not None else None,
        engine_start_s=round(timing.engine_start_s, 1), sample_rows=timing.rows,
        extra_rows=timing.rows - first_rows, sample_steps=[list(s) for s in timing.steps],
        sample_correct=timing.correct, sample_truth_rows=timing.truth_rows, sample_s=round(timing.seconds, 2),
        sample_tokens=tokens,
        sample_errors=timing.errors,
        accuracy=round(accuracy, 4) if accuracy is not None else None,
        accuracy_low=round(low, 4) if low is not None else None,
        accuracy_high=round(high, 4) if high is not None else None,
        stored_rows=stored.rows, stored_prompts=stored.prompts, stored_exact=stored.exact,
        prompts_to_generate=stored.to_generate,
        predicted_tokens=round(predicted_tokens), predicted_wall_s=round(wall, 1),
        predicted_tokens_per_hour=round(tps * 3600), sample_engines=engines, options=priced,
        predicted_input_tokens=round(work.prompt_tokens), predicted_output_tokens=round(work.output_tokens),
        hosted=hosted_rows,
        measured_on=machine.description, measured_kind=machine.kind, measured_tokens_per_s=round(tps, 1),
        best_speed_basis=best.speed_basis if best else None,
        best_option=best.name if best else None, best_cost_usd=best.cost_usd if best else None,
        # How far the model's confidence can be trusted, on the sample: with a gold column and confidences.
        reliability=reliability(timing.sure) if timing.correct is not None and timing.sure else None,
    )


def write_report(report: EstimateReport, folder: Path) -> EstimateReport:
    """Write ``estimate.json`` and ``estimate.png`` into ``folder``; return the report with both paths."""
    from .chart import write_chart

    folder.mkdir(parents=True, exist_ok=True)
    report = replace(report, json_path=str(folder / "estimate.json"), chart=str(folder / "estimate.png"))
    write_chart(report, folder / "estimate.png")
    atomic_write_text(folder / "estimate.json", json.dumps(report.to_json(), indent=2))
    return report
