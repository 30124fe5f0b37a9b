"""The estimate of a built job, the way the ``estimate`` asset, ``sparkbatch estimate`` and
``sparkbatch run --estimate`` run it: the sample drawn once, each model timed on its engine
(one at a time), priced on every node option with where its speed comes from, the best buy
named, the report (JSON + chart) and each version's prediction file written.

``estimate`` compares the configured model with the candidates, each on an engine of its own;
``estimate_in_run`` times the configured model alone on the run's engine, which then labels.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from msgspec.structs import replace

from ..engines.settings import on_cpu
from ..errors import ConfigError, SparkbatchError
from ..estimate.records import BestBuy, Cascade, EstimateReport, LeftOut, ModelForecast, Prediction
from ..home import JobHome, atomic_write_text
from ..spec import THIS_MACHINE, EstimateSpec, HostedPrice, JobSpec, ModelCandidate, NodeOption
from .resource import VLLMResource

if TYPE_CHECKING:
    from ..estimate.machine import Machine
    from ..estimate.sample import Sample, Stored, Timing

Log = Callable[[str], None]


class BatchJob(Protocol):
    """What the estimate needs of a :class:`~.job.BatchJob` (which calls in here)."""

    spec: JobSpec
    home: JobHome

    def version_for(self, model_id: str) -> str: ...


def estimate(job: BatchJob, resource: VLLMResource, est: EstimateSpec, log: Log) -> EstimateReport:
    """:meth:`BatchJob.estimate`: the configured model, then every runnable candidate."""
    from .. import estimate as E
    from ..estimate.machine import cannot_run

    on_gpu = not on_cpu()
    job.home.refresh(write=True)  # a bucket home: its shards and stored answers; bad credentials stop here
    est, batch, machine, options = _setup(job, resource, est)
    sample = E.draw_sample(job.spec, job.home, est)
    candidates = [c for c in est.candidates() if c.model != resource.model or c.engine_kwargs]
    unrunnable = [LeftOut(model=c.label, error=why) for c in candidates
                  if (why := cannot_run(c.engine_kwargs, on_cpu=not on_gpu))]
    runnable = [c for c in candidates if not cannot_run(c.engine_kwargs, on_cpu=not on_gpu)]
    log(f"estimate: {len(sample.rows)} sample rows of {sample.total_rows:,} on {machine.description}; models: "
        f"{[resource.model or 'default', *[c.label for c in runnable]]}")
    models: list[ModelForecast] = []
    timings: list[Timing] = []  # each model's sample, row by row: the cascades are judged on them
    failed: list[LeftOut] = []
    for candidate in [None, *runnable]:
        res = resource if candidate is None else _candidate_resource(resource, candidate)
        try:  # one engine at a time: a small box holds one model's KV cache, not several
            name = res.model_name()
            log(f"estimate: starting {name} and timing the sample on it")
            timing = E.sample_model(job.spec, job.home, est, sample, res.get_engine())
        except SparkbatchError as exc:
            if candidate is None:  # the job's own model must run; a candidate may fail alone
                raise
            failed.append(LeftOut(model=candidate.label, error=str(exc)))
            continue
        finally:  # a candidate's engine goes now, even with keep_warm: the next one needs the memory
            res.close() if candidate is None else res.shutdown()
        models.append(_forecast(job, res, sample, timing, options, machine, res.model_identity(), name, candidate,
                                log, est.hosted_prices))
        timings.append(timing)
    extra = ([f"Candidate {f.model!r} could not run, left out: {f.error}" for f in failed]
             + [f"Candidate {u.model!r} is listed, not timed: {u.error}." for u in unrunnable])
    return _report(job, sample, est, models, batch, failed, unrunnable, extra, timings)


def estimate_in_run(job: BatchJob, resource: VLLMResource, engine: Any, model_id: str, log: Log) -> EstimateReport:
    """:meth:`BatchJob.estimate_in_run`: the configured model alone, on ``engine`` (the run's)."""
    from .. import estimate as E

    est, batch, machine, options = _setup(job, resource, job.spec.estimate.model_copy(update={"models": []}))
    sample = E.draw_sample(job.spec, job.home, est)
    log(f"estimate: timing {len(sample.rows)} sample rows of {sample.total_rows:,} on this run's engine "
        f"({machine.description})")
    timing = E.sample_model(job.spec, job.home, est, sample, engine)
    model = _forecast(job, resource, sample, timing, options, machine, model_id, resource.model_name(), None, log,
                      est.hosted_prices)
    return _report(job, sample, est, [model], batch, [], [], [])


def _setup(job: BatchJob, resource: VLLMResource,
           est: EstimateSpec) -> tuple[EstimateSpec, int, Machine, list[NodeOption]]:
    """Checks before any engine starts, then: ``est`` with a full batch on every engine
    (``fill_batch``), that batch, the machine the sample runs on, and the options to price."""
    from ..estimate.machine import cannot_run, sample_machine

    own = cannot_run(resource.engine_kwargs, on_cpu=on_cpu())
    if own:  # the job's own model must run: stop before any engine starts
        raise ConfigError(f"VLLMResource(engine_kwargs={resource.engine_kwargs!r}) {own}")
    machine = sample_machine(est.sample_hardware, on_cpu=on_cpu(), remote=bool(resource.engine_settings().endpoints))
    options = est.options + ([NodeOption(name="this machine", hourly_usd=est.hourly_rate_usd, hardware=THIS_MACHINE)]
                             if est.hourly_rate_usd is not None else [])
    # A full batch on every engine (max_num_seqs, or this platform's default): N engines share the sample.
    batch = resource.resolved_max_num_seqs() * resource.engine_count()
    if est.fill_batch and est.sample_rows < batch:
        est = est.model_copy(update={"sample_rows": batch})
    return est, batch, machine, options


def _forecast(job: BatchJob, res: VLLMResource, sample: Sample, timing: Timing, options: list[NodeOption],
              machine: Machine, model_id: str, name: str, candidate: ModelCandidate | None, log: Log,
              hosted: list[HostedPrice]) -> ModelForecast:
    """One model's prediction for the whole job (its tokens at the ``hosted`` batch prices too);
    also written as its version's prediction file."""
    from .. import estimate as E
    from ..run.result_store import open_store

    store = open_store(job.spec, job.home, model_id)
    stored = E.count_stored(job.spec, job.home, sample, store)
    dtype, why = res.dtype_choice()
    m = replace(_priced(sample, timing, options, stored, res.engine_count(), machine, res, name, candidate, hosted),
                identity=model_id, dtype=dtype, dtype_reason=why)
    m = _confidence(job, m, timing, model_id, log)
    log(f"estimate: {m.model} in {dtype} ({why})")
    log(f"estimate: {m.model}: {m.sample_rows} rows sampled, accuracy {m.accuracy}, predicted "
        f"{m.predicted_wall_s:.0f} s of generation, best cost ${m.best_cost_usd} ({m.best_speed_basis})")
    prediction = job.home.prediction_path(job.version_for(model_id))
    atomic_write_text(prediction, json.dumps(Prediction(
        model=timing.model, predicted_wall_s=m.predicted_wall_s, predicted_prompts=m.prompts_to_generate,
        stored_rows=m.stored_rows, engine_start_s=m.engine_start_s, best_cost_usd=m.best_cost_usd,
        total_rows=sample.total_rows, sample_rows=m.sample_rows,
        made_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    ).to_json()))
    job.home.publish(prediction)
    return m


def _confidence(job: BatchJob, m: ModelForecast, timing: Timing, model_id: str, log: Log) -> ModelForecast:
    """``m`` with its confidence judged on the sample's gold rows (``estimate/review_figures.py``):
    the calibration (saved under the job's home for runs, keyed by ``model_id``, the identity rows
    carry), the review budget, ``JobSpec.review``'s plan and their chart; ``m`` as it is without
    a gold column or confidences."""
    from ..estimate import calibration as cal
    from ..estimate.review_figures import judge

    if job.spec.gold_column is None or timing.correct is None or not timing.sure:
        return m
    labels = job.spec.output.labels
    chart = job.home.estimate_dir / f"review-{cal.calibration_key(model_id, labels).removesuffix('.json')}.png"
    f = judge(timing.sure, model_id, labels, job.spec.review, job.home.calibration_dir, chart)
    for path in (Path(f.calibration.path) if f.calibration.path else None, f.chart):
        if path is not None:
            job.home.publish(path)
    log(f"estimate: {m.model}: confidence {f.calibration.method} on {f.calibration.rows} gold rows, ECE "
        f"{f.calibration.ece_before} -> {f.calibration.ece_after}, Brier {f.calibration.brier_before} -> "
        f"{f.calibration.brier_after} (held out)")
    return replace(m, calibration=f.calibration, review_budget=f.budget, review_plan=f.plan,
                   review_chart=str(f.chart) if f.chart else None)


def _report(job: BatchJob, sample: Sample, est: EstimateSpec, models: list[ModelForecast], batch: int,
            failed: list[LeftOut], unrunnable: list[LeftOut], extra_advice: list[str],
            timings: list[Timing] | None = None) -> EstimateReport:
    """The estimate's report (the configured model first), written as JSON + charts."""
    from .. import estimate as E
    from ..estimate import cascades as K
    from ..estimate import choice as C

    has_gold = job.spec.gold_column is not None
    chosen = C.choose(models, est.accuracy_bar, has_gold)
    pairs = K.evaluate(models, timings, est.accuracy_bar) if has_gold and timings and len(timings) > 1 else []
    primary = models[0]
    # A job smaller than one batch never fills the GPU either: compare with what the run can fill.
    advice = (C.advise(primary, chosen, est, len(sample.rows), min(batch, sample.total_rows), on_gpu=not on_cpu(),
                       has_gold=has_gold, models=models, total_rows=sample.total_rows)
              + C.hosted_line(primary) + _reliability_advice(models) + _review_advice(models)
              + K.advice(pairs, chosen, est.accuracy_bar)
              + extra_advice)
    chart = K.write_chart(pairs, job.home.estimate_dir / "cascade.png")
    report = EstimateReport(
        job=job.spec.name, base_sample_rows=len(sample.rows), total_rows=sample.total_rows,
        distinct_prompts=sample.distinct_prompts, primary=primary, accuracy_bar=est.accuracy_bar,
        max_sample_rows=est.max_sample_rows, chosen=chosen, models=models, failed_models=failed,
        unrunnable_models=unrunnable, advice=advice, cascades=pairs, best_buy=_best_buy(chosen, K.cheapest(pairs)),
        cascade_chart=str(chart) if chart else None)
    written = E.write_report(report, job.home.estimate_dir)
    for path in (written.json_path, written.chart, written.cascade_chart):
        if path and Path(path).exists():
            job.home.publish(Path(path))
    return written


def _best_buy(model: ModelForecast | None, cascade: Cascade | None) -> BestBuy | None:
    """The cheapest that clears the bar: the model chosen alone, or a cascade (the model on a tie)."""
    found: list[BestBuy] = []
    if model is not None and model.best_cost_usd is not None:
        found.append(BestBuy(kind="model", model=model.model, cost_usd=model.best_cost_usd,
                             configured_as=model.configured_as))
    if cascade is not None and cascade.pick.best_cost_usd is not None:
        found.append(BestBuy(kind="cascade", model=cascade.model, cost_usd=cascade.pick.best_cost_usd,
                             configured_as=cascade.configured_as))
    return min(found, key=lambda b: b.cost_usd, default=None)


def _reliability_advice(models: list[ModelForecast]) -> list[str]:
    """How far each model's confidence can be trusted on the sample, in words (with a gold column)."""
    from ..run.reliability import describe

    return [f"{m.model}'s confidence against the gold column on the sample: {'; '.join(describe(m.reliability))}."
            for m in models if m.reliability]


def _review_advice(models: list[ModelForecast]) -> list[str]:
    """Each model's calibration, review budget and review plan, in words (with a gold column)."""
    from ..estimate.review_figures import advice

    return [line for m in models for line in advice(m.model, m.calibration, m.review_budget, m.review_plan)]


def _candidate_resource(resource: VLLMResource, candidate: ModelCandidate) -> VLLMResource:
    """The job's resource with the candidate's model (and its engine settings merged in)."""
    if not candidate.engine_kwargs:
        return resource.with_model(candidate.model)
    return resource.with_model(candidate.model, candidate.engine_kwargs)


def _priced(sample: Sample, timing: Timing, options: list[NodeOption], stored: Stored, engines: int,
            machine: Machine, res: VLLMResource, name: str, candidate: ModelCandidate | None,
            hosted: list[HostedPrice]) -> ModelForecast:
    """One model's prediction, sized by its precision (fp8 weights are 1 byte a parameter), named in
    the report by its identity plus any engine settings of its own (fp8 and bf16 of one model
    differ in the hash alone)."""
    from ..engines.platform.model import weights_gb
    from ..engines.settings import GPU_DEFAULTS
    from ..estimate.forecast import predict
    from ..estimate.roofline import model_shape

    cfg = res.resolved()
    shape = model_shape(name, cfg.engine_kwargs, cfg.dtype)
    size = shape.weights_gb if shape is not None else weights_gb(name)
    # Projected hardware is a GPU box: the GPU default batch unless the resource sets one.
    concurrency = cfg.max_num_seqs or int(GPU_DEFAULTS["max_num_seqs"])
    m = predict(sample, timing, options, size, stored, engines, machine=machine, shape=shape, concurrency=concurrency,
                hosted=hosted)
    settings = candidate.engine_kwargs if candidate is not None else {}
    label = f"{timing.model} ({', '.join(f'{k}={v}' for k, v in sorted(settings.items()))})" if settings else None
    return replace(m, model=label or timing.model, configured_as=res.model, engine_kwargs=settings)
