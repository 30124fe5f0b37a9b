"""What one run of ``labeled_outputs`` does: label its partitions on one engine and yield each
partition's materialization and checks the moment its shard commits.

A backfill of scattered partitions (Materialize... -> Missing after a partial failure, say 1, 4
and 6 of 8) is several runs to Dagster, one per contiguous range of partitions
(``BackfillPolicy.single_run`` makes one run per range), and each run would start its own engine.
So the first run of a backfill to start also labels the backfill's other missing partitions,
on the same engine, and materializes them as they commit; the backfill's later runs, queued
behind it in the ``gpu`` pool, find their partitions done and record them as reused, starting
no engine. A partition another run is writing at that moment is left to it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Optional

from dagster import AssetExecutionContext, AssetKey, Config

from ..engines.base import LazyEngine
from ..engines.platform.spans import Spans
from ..errors import ConfigError
from ..run import attempts
from ..run.brake import DEADLINE_MARGIN_S, Brake, check_deadline, check_max_cost, parse_deadline, price
from ..run.calibration_map import Calibration, stored
from ..run.progress import Relay, tell
from ..run.records import ShardStats
from ..run.review_marks import job_labels
from ..run.runner import ShardRun
from ..run.shard_stats import read_stats
from ..run.table_sink import check_sink
from ..spec import JobSpec, fingerprint
from . import events
from .cascade import CascadePlan
from .deploy import pool_limit

if TYPE_CHECKING:
    from ..estimate.records import Prediction
    from .job import BatchJob
    from .resource import VLLMResource


class LabelConfig(Config):
    """Launchpad settings of a ``labeled_outputs`` run (the UI, a backfill, ``sparkbatch run``).

    ``estimate``: time a sample of the job's configured model on this run's engine first, write
    the estimate report and print the prediction, then label on the same engine (one start).
    ``max_cost_usd`` / ``deadline`` (unset: the spec's): the brake (``run/brake.py``); ``deadline``
    is a time with its zone or a duration from the run's start (``2h30m``);
    ``deadline_margin_s``: seconds kept to commit before it (default 30, plus twice the longest commit).
    """

    estimate: bool = False
    max_cost_usd: Optional[float] = None  # noqa: UP045 - Dagster reads these annotations at runtime
    deadline: Optional[str] = None  # noqa: UP045
    deadline_margin_s: Optional[float] = None  # noqa: UP045


def label_partitions(context: AssetExecutionContext, job: BatchJob, resource: VLLMResource,
                     code_version: str, pool: str | None, config: LabelConfig | None = None) -> Iterator[Any]:
    """The body of ``labeled_outputs``: the run's partitions, then the rest of its backfill's gaps."""
    spec, home = job.spec, job.home
    spans = Spans(collect=True)  # where the step's time goes: its attempt's record, `sparkbatch run`'s timings_s
    config = config or LabelConfig()
    keys = context.partition_keys  # each read asks the instance for the dynamic partitions
    home.refresh(write=True)  # a bucket home: its shards and commits; bad credentials stop here
    job.check_partitions(keys)  # before any engine starts
    check_sink(spec)  # a sink this machine cannot write stops here too, not after the bill
    with spans.span("identity"):
        # A cascade answers with its stages' engines, each started when first needed (definitions/cascade.py).
        plan = CascadePlan(spec, resource, home, context.log) if spec.cascade else None
        model_id = plan.model_id if plan else resource.model_identity()  # once: for a server, a request
    version = job.version_for(model_id)
    planned = (home.read_manifest() or {}).get("signature")
    home.heal_current()
    current = home.read_current()
    if current is None or current.version != version:  # refresh() brought the current one
        home.pull_version(version)
    brake = make_brake(job, version, config)  # a bad max cost or deadline stops here, before the engine
    resource.use_home(home, context.log)  # a cold start restores the compile cache from it, and saves it there
    # A log line when the engine starts loading and when it is ready: a minute of silence reads as a hang.
    engine = LazyEngine(model_id, plan.start if plan else resource.get_engine, log=context.log.info,
                        settings=_settings_line(resource), spans=spans,
                        cold_starts=plan.cold_starts if plan else resource.cold_starts)
    try:
        yield from _label(context, job, resource, config, engine, plan, version, planned, brake, code_version, pool,
                          keys)
    finally:
        if plan is not None:
            plan.close()


def _label(context: AssetExecutionContext, job: BatchJob, resource: VLLMResource, config: LabelConfig,
           engine: LazyEngine, plan: CascadePlan | None, version: str, planned: str | None, brake: Brake,
           code_version: str, pool: str | None, keys: list[str]) -> Iterator[Any]:
    """:func:`label_partitions` once the engine is set up: what is done, then what is left."""
    spec, home, key = job.spec, job.home, job.keys["labeled_outputs"]
    starts = plan.cold_starts if plan is not None else resource.cold_starts
    # Downstream assets read the current version: it moves to this one only once it has a
    # committed partition, so a run that fails under new settings never empties them; and only
    # while the input is still the one this run sharded (a late run of an old input never moves
    # readers back to it: home/pointer.py).
    current = home.has_commits(version) and home.advance_current(version, engine.model_id, planned)
    todo = [k for k in keys if not home.is_done(version, k)]
    tags = {"dagster/code_version": code_version, "dagster/data_version_is_user_provided": "true",
            **_input_provenance(context.instance, job.keys["input_shards"])}
    if context.run.tags.get("dagster/backfill"):
        tags["dagster/backfill"] = context.run.tags["dagster/backfill"]

    # Which calibrations the rows' confidences are written with (a cascade's rows: each stage's own):
    # this run's rows, the maps the run read at its start; a partition done before, the home's now.
    models = [engine.model_id, *(plan.names if plan is not None else [])]
    on_disk = functools.cache(lambda: stored(home.calibration_dir, job_labels(spec)))

    def emit(stats: ShardStats, this_run: bool, maps: dict[str, Calibration] | None = None) -> Iterator[Any]:
        data_version = fingerprint([version, stats.partition])[:16]
        known = on_disk() if maps is None else maps
        yield events.materialization(key, stats, this_run=this_run, home=home,
                                     tags={**tags, "dagster/data_version": data_version},
                                     calibrations=[known[m] for m in models if m in known])
        yield from events.checks(key, spec, home, stats)

    done = [k for k in keys if k not in todo]
    if done:
        context.log.info(f"{len(done)} partition(s) already done under version {version}: recorded as "
                         "reused (nothing generated, cost 0 in this run)")
    for k in done:
        yield from emit(read_stats(home.stats_path(version, k)), this_run=False)
    home.remove_stale_parts(version)
    gaps = [k for k in backfill_partitions(context, key, pool) if k not in keys and not home.is_done(version, k)]
    if todo and gaps:
        context.log.info(f"this backfill also misses {len(gaps)} partition(s) outside this run ({_span(gaps)}): "
                         "labeled here on the same engine; their own runs will find them done")
    if todo:
        context.log.info(f"labeling {len(todo) + len(gaps)} partition(s) with {engine.model_id}; the engine starts "
                         "when the first prompt that is not in the result store needs it")
        base = starts()
        runner = ShardRun(spec, home, version, engine, progress=Relay(context.log.info), run_id=context.run_id,
                          brake=brake, engine_starts=lambda: starts() - base)
        runner.pace.expected_rows_per_s = job.expected_rows_per_s(version)
        before = _estimate_first(job, resource, engine, runner, context.log.info) if config.estimate else None
        for stats in runner.stream(todo + gaps, optional=set(gaps), before=before):
            if not current:
                current = home.advance_current(version, engine.model_id, planned)
            context.log.info(f"{stats.partition} committed: {stats.rows} rows, {stats.errors} errors, "
                             f"{stats.generated_requests} prompts generated, {stats.reused_rows} reused, "
                             f"${stats.cost_usd:.4f}{_truncation_note(spec, stats)}")
            yield from emit(stats, this_run=True, maps=runner.marks.calibrations)
        for k in runner.committed_elsewhere:
            context.log.info(f"{k} was committed by another run while this one waited for its lease: recorded as "
                             "reused (nothing generated here)")
            yield from emit(read_stats(home.stats_path(version, k)), this_run=False)


def make_brake(job: BatchJob, version: str, config: LabelConfig) -> Brake:
    """The run's brake from its launchpad config and the spec (the config wins), checked now:
    before any engine starts. The version's earlier attempts are its bill so far; an earlier
    estimate of this version gives the rate to refuse with before the run measures its own."""
    spec = job.spec
    max_cost = check_max_cost(config.max_cost_usd if config.max_cost_usd is not None else spec.max_cost_usd)
    deadline = parse_deadline(config.deadline) if config.deadline else spec.deadline
    if deadline is not None:
        check_deadline(deadline)
    margin = config.deadline_margin_s
    if margin is not None and margin < 0:
        raise ConfigError(f"deadline_margin_s={margin} is negative: give the seconds kept to commit (default "
                          f"{DEADLINE_MARGIN_S:g})")
    brake = Brake(spec.hourly_rate_usd, max_cost, deadline,
                  margin_s=DEADLINE_MARGIN_S if margin is None else margin)
    if brake.active:
        brake.spent_before_usd = attempts.bill(attempts.load(job.home, version)).attempts_cost_usd
        _use_prediction(brake, job.prediction(version))
    return brake


def _use_prediction(brake: Brake, pred: Prediction | None) -> None:
    """Give the brake the estimate's rate (input rows per second, stored ones averaged in) and
    engine start, when this version has a prediction."""
    if pred is None:
        return
    if pred.predicted_wall_s:
        brake.predicted_rows_per_s = pred.total_rows / pred.predicted_wall_s
    brake.restart_s = float(pred.engine_start_s or 0.0)


def _estimate_first(job: BatchJob, resource: VLLMResource, engine: LazyEngine, runner: ShardRun,
                    log: Callable[[str], None]) -> Callable[[], None]:
    """What ``estimate: true`` runs inside the attempt before the first prompt: the sample on the
    run's engine (it starts here, once), the report and prediction file, the prediction told."""

    def first() -> None:
        report = job.estimate_in_run(resource, engine, engine.model_id, log=log).primary
        pred = job.prediction(runner.version)  # just written: read once for the ETA and the brake
        runner.pace.expected_rows_per_s = job.expected_rows_per_s(runner.version, pred)
        if runner.brake is not None:
            _use_prediction(runner.brake, pred)
        cost = price(report.predicted_wall_s + report.engine_start_s, job.spec.hourly_rate_usd)
        line = (f"estimate: {report.prompts_to_generate:,} prompts to generate, predicted "
                f"{report.predicted_wall_s:.0f} s of generation + {report.engine_start_s:.0f} s engine start "
                f"(paid once, for the sample and the run): ${cost:.4f} at ${job.spec.hourly_rate_usd:g}/h")
        log(line)
        tell(line)

    return first


def backfill_partitions(context: AssetExecutionContext, key: AssetKey, pool: str | None) -> list[str]:
    """The partitions of ``key`` that this run's backfill targets, in the order they were
    registered; [] outside a backfill (or for one Dagster stored in an older form), and [] unless
    the ``gpu`` pool runs one run at a time: then the backfill's runs never race for a partition."""
    backfill_id = context.run.tags.get("dagster/backfill")
    if not backfill_id:
        return []
    if pool is None:
        return []
    if pool_limit(context.instance, pool) != 1:
        context.log.info(f"this run is one of its backfill's runs, each with its own engine start: on one "
                         f"machine, limit the {pool!r} pool to one run at a time (dagster instance concurrency set "
                         f"{pool} 1) and the first run labels every gap of the backfill on one engine")
        return []
    backfill = context.instance.get_backfill(backfill_id)
    data = getattr(backfill, "asset_backfill_data", None)
    if data is None or key not in data.target_subset.asset_keys:
        return []
    targets = set(data.target_subset.get_partitions_subset(key).get_partition_keys())
    order = context.instance.get_dynamic_partitions(context.assets_def.partitions_def.name)  # type: ignore[union-attr]
    return [k for k in order if k in targets]


def _span(keys: list[str]) -> str:
    return ", ".join(keys) if len(keys) <= 4 else f"{keys[0]}, {keys[1]} .. {keys[-1]}"


def _truncation_note(spec: JobSpec, stats: ShardStats) -> str:
    """What a run's log line says of answers cut at max_tokens, with the fix."""
    cut = stats.truncated_rows
    if not cut:
        return ""
    return (f"; {cut} answers hit max_tokens={spec.sampling.max_tokens} (cut; labels and JSON became error rows): "
            "raise sampling.max_tokens")


def _settings_line(resource: VLLMResource) -> str:
    """The engine settings a log reader wants to see (what is set, no secrets)."""
    shown = {k: v for k, v in resource.model_dump().items()
             if v not in (None, {}, "") and k not in ("model", "keep_warm", "api_key")}
    dtype, why = resource.dtype_choice()
    shown["dtype"] = f"{dtype} ({why})"
    return "with " + json.dumps(shown, default=str)


def _input_provenance(instance: Any, key: AssetKey) -> dict[str, str]:
    """The tags Dagster writes on a materialization to say which upstream version it was built
    from; without them the UI calls every partition stale ("new dependency")."""
    from dagster._core.definitions.data_version import get_input_data_version_tag, get_input_event_pointer_tag

    records = instance.fetch_materializations(key, limit=1).records
    if not records:
        return {}
    version = records[0].asset_materialization.tags.get("dagster/data_version")
    return {get_input_data_version_tag(key): version, get_input_event_pointer_tag(key): str(records[0].storage_id)
            } if version else {}
