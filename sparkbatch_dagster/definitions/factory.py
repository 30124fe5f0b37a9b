"""The asset factory: one call turns a :class:`JobSpec` into partitioned Dagster assets.

    input_shards -> labeled_outputs (one partition per shard) -> run_metrics -> analytics
                 -> review_queue -> human_labels (review_assets.py)
                 -> estimate (a timed sample: duration, cost per node option, model choice) -> run_metrics

``labeled_outputs`` materializes each partition the moment its shard commits, with that
partition's own numbers and checks (:mod:`.events`); ``run_metrics`` and ``analytics`` follow
new labeled partitions by themselves (``AutomationCondition.eager``) and need no engine.
"""


import json
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, Optional

from dagster import (
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    AssetSelection,
    AssetSpec,
    AutomationCondition,
    BackfillPolicy,
    Config,
    DataVersion,
    DynamicPartitionsDefinition,
    MaterializeResult,
    MetadataValue,
    asset,
    multi_asset,
)

from ..engines.platform.model import answer_settings
from ..errors import SparkbatchError, storage_errors
from ..home import open_home
from ..inputs.shards import build_shards
from ..run import attempts, metrics
from ..spec import EstimateSpec, JobSpec, fingerprint
from . import events, review_assets
from .job import BatchJob
from .labeling import LabelConfig, label_partitions
from .metadata import estimate_metadata, md_table
from .outputs_io import io_manager_def
from .resource import VLLMResource

# One run per backfill is the point of this plugin (one engine start); Dagster marks these
# parameters beta/preview, notices no user of these assets can act on.
warnings.filterwarnings("ignore", message=r"Parameter `backfill_policy` of function `asset` is currently in beta")
warnings.filterwarnings("ignore", message=r".*partitions_def.*AssetCheckSpec")
# The job's IO manager travels with its assets (resource_defs, beta): no wiring for the user.
warnings.filterwarnings("ignore", message=r"Parameter `resource_defs` of .* is currently in beta")

__all__ = ["BatchJob", "LabelConfig", "build_batch_assets"]

#: Every job built in this process, by its ``labeled_outputs`` key: how the CLI finds the jobs of
#: a Definitions, those declared in YAML (``BatchInferenceComponent``) included.
_JOBS: dict[AssetKey, BatchJob] = {}


def find_job(key: AssetKey) -> BatchJob | None:
    """The job whose ``labeled_outputs`` asset has this key (the last one built in this process)."""
    return _JOBS.get(key)


def _sync_sink(context: AssetExecutionContext, spec: JobSpec, home: Any, version: str) -> dict[str, Any]:
    """The job's table brought in step with the commits (nothing without a sink), as metadata."""
    if spec.sink is None:
        return {}
    from ..run.table_sink import sync_table  # imports deltalake: only where a sink is configured

    synced = sync_table(spec, home, version)
    if synced["shards_added"] or synced["versions_replaced"]:
        context.log.info(f"table {synced['uri']}: {len(synced['shards_added'])} shard(s) added, "
                         f"version(s) {synced['versions_replaced']} replaced")
    return {"table_uri": synced["uri"], "table_rows": synced["rows"], "table_shards_added": len(synced["shards_added"]),
            **({"table_version": synced["table_version"]} if synced["table_version"] is not None else {})}


class EstimateConfig(Config):
    """Launchpad overrides of the job's ``estimate`` settings (unset: the spec's)."""

    sample_rows: Optional[int] = None  # noqa: UP045 - Dagster reads these annotations at runtime
    models: Optional[list[str]] = None  # noqa: UP045 - 'model' or 'model@quantization=fp8'
    accuracy_bar: Optional[float] = None  # noqa: UP045
    hourly_rate_usd: Optional[float] = None  # noqa: UP045 - adds 'this machine' at the measured speed
    hosted_prices: Optional[str] = None  # noqa: UP045 - a YAML/CSV file of hosted batch prices (EstimateSpec)


def _model_config(resource: VLLMResource | None) -> Any:
    """The configured model and the settings that change its answers: part of the code version,
    so switching models shows ``labeled_outputs`` as changed in the UI (the weights' own digest
    goes into each partition's data version when it runs)."""
    if resource is None:
        return None
    try:
        cfg = resource.resolved()
    except SparkbatchError:  # an EnvVar unset where the code loads: the run will say so
        cfg = resource
    # Where it runs (offline, which servers) is not here: the same model answers the same anywhere.
    return {"model": cfg.model, **answer_settings(cfg.dtype, cfg.max_model_len, cfg.engine_kwargs)}


def build_batch_assets(
    *, spec: JobSpec, key_prefix: str | Sequence[str] | None = None, group_name: str | None = None,
    resource_key: str = "vllm", upstream: Sequence[AssetsDefinition | AssetKey] = (),
    pool: str | None = "gpu", resource: VLLMResource | None = None,
    backfill_policy: BackfillPolicy | None = None,
) -> BatchJob:
    """Build the job's seven assets and their checks.

    Example::

        vllm = VLLMResource()
        job = build_batch_assets(spec=spec, resource=vllm)
        defs = Definitions(assets=job.assets, resources={"vllm": vllm})

    Args:
        spec: the job.
        key_prefix: asset key prefix (default: the job name).
        group_name: Dagster asset group (default: the job name).
        resource_key: key of the :class:`VLLMResource` in ``Definitions.resources``.
        upstream: assets that produce the input files (``input_shards`` depends on them).
        pool: Dagster concurrency pool of the assets that start an engine (``labeled_outputs``,
            ``estimate``); limit it to the number of GPUs (``dagster instance concurrency set
            gpu 1``) so two runs never start two engines on one GPU. None: no pool.
        resource: the resource the job will run with, when known here: its model and settings
            become part of ``labeled_outputs``' code version.
        backfill_policy: ``labeled_outputs``' policy. Default ``BackfillPolicy.single_run()``: one
            run and one engine start for a whole backfill. ``BackfillPolicy.multi_run(n)`` spreads a
            backfill over runs of n partitions, e.g. one per GPU machine (docs/deploy-k8s.md).
    """
    labeled_policy = backfill_policy or BackfillPolicy.single_run()
    # run_metrics must not share labeled_outputs' run (that run yields no output at its end, so
    # a step after it would be skipped); a different policy keeps them in separate runs.
    metrics_policy = BackfillPolicy.multi_run(max_partitions_per_run=1000)
    if metrics_policy == labeled_policy:
        metrics_policy = BackfillPolicy.multi_run(max_partitions_per_run=999)
    prefix = [key_prefix] if isinstance(key_prefix, str) else list(key_prefix or [spec.name])
    group = group_name or spec.name
    home = open_home(spec.home_url or spec.home_path, spec.home_path, spec.storage_options, spec.lease_seconds,
                     spec.result_store_path, spec.result_store_url)
    parts = DynamicPartitionsDefinition(name=f"{spec.name}_shards")
    job = BatchJob(spec, home, parts, resource_key=resource_key, pool=pool)
    names = ("input_shards", "labeled_outputs", "run_metrics", "analytics", "estimate", "review_queue", "human_labels")
    job.keys = {n: AssetKey([*prefix, n]) for n in names}
    labeled_key = job.keys["labeled_outputs"]
    code_version = fingerprint({"prompt": spec.prompt_fingerprint(), "model": _model_config(resource)})[:16]
    # Every asset carries the job's IO manager (under a key of its own: a user's "io_manager" stays
    # theirs), so AssetIn on labeled_outputs or run_metrics loads the committed rows (outputs_io.py).
    io: dict[str, Any] = {"io_manager_key": job.io_manager_key,
                          "resource_defs": {job.io_manager_key: io_manager_def(job)}}

    @asset(key=job.keys["input_shards"], deps=list(upstream), group_name=group, kinds={"duckdb", "parquet"}, **io,
           description=f"{spec.input} split into shards by a hash of the row id.")
    def input_shards(context: AssetExecutionContext) -> MaterializeResult:
        manifest = build_shards(spec, home)
        known = set(context.instance.get_dynamic_partitions(parts.name or ""))
        new = [k for k in manifest["keys"] if k not in known]
        if new:
            context.instance.add_dynamic_partitions(parts.name or "", new)
        for stale in sorted(known - set(manifest["keys"])):
            context.instance.delete_dynamic_partition(parts.name or "", stale)
        home.refresh()
        adopted = events.adopt(context.instance, labeled_key, home, manifest["keys"])
        if adopted:
            context.log.info(f"{len(adopted)} partition(s) of {labeled_key.to_user_string()} are committed in "
                             f"{home.location} but unknown to this Dagster instance: recorded as materialized")
        return MaterializeResult(data_version=DataVersion(manifest["signature"]), metadata={
            "rows": manifest["rows"], "shards": manifest["shard_count"], "reused": manifest["reused"],
            "path": MetadataValue.path(str(home.shards_dir)),
        })

    checks = [
        AssetCheckSpec(events.EXACTLY_ONCE, asset=labeled_key, partitions_def=parts, blocking=True,
                       description="Read back from disk: the labeled file holds every input row of the shard "
                                   "exactly once (a label or an error row). analytics is not built on a failure."),
        AssetCheckSpec(events.ERROR_RATE, asset=labeled_key, partitions_def=parts,
                       description=f"Error rows are at most {spec.max_error_rate:.0%} of the partition."),
    ]

    # Skippable, and no output at the end: each partition's materialization is yielded as its
    # shard commits (see events.py), so Dagster must not add a second one per partition.
    @multi_asset(
        name="__".join(labeled_key.path), partitions_def=parts, backfill_policy=labeled_policy,
        required_resource_keys={resource_key}, check_specs=checks, can_subset=True, pool=pool,
        resource_defs=io["resource_defs"],
        specs=[AssetSpec(labeled_key, deps=[input_shards], skippable=True, group_name=group,
                         kinds={"vllm", "parquet"}, code_version=code_version,
                         description="One shard labeled by the model; every input row exactly once (a label or "
                                     "an error). Each partition materializes as its shard commits."
                         ).with_io_manager_key(job.io_manager_key)],
    )
    def labeled_outputs(context: AssetExecutionContext, config: LabelConfig) -> Iterator[Any]:
        with storage_errors(home.root):  # a full or read-only home fails the step in one line
            yield from label_partitions(context, job, getattr(context.resources, resource_key), code_version, pool,
                                        config)

    follow = AutomationCondition.eager().ignore(AssetSelection.assets(job.keys["estimate"]))

    @asset(key=job.keys["run_metrics"], deps=[labeled_outputs, job.keys["estimate"]], partitions_def=parts,
           backfill_policy=metrics_policy, group_name=group, **io,
           kinds={"duckdb"}, automation_condition=follow,
           description="Rows, errors, tokens, time, tokens/hour and cost per partition, in metrics.duckdb; "
                       "predicted vs actual generation time when an estimate was made.")
    def run_metrics(context: AssetExecutionContext) -> MaterializeResult:
        home.refresh()  # a bucket home: every box's commits and attempts
        version = job.current_version()
        committed = metrics.sync(home, version)
        keys = context.partition_keys
        missing = [k for k in keys if k not in committed]
        if missing:
            raise SparkbatchError(f"no finished output for {missing}: materialize labeled_outputs for them first")
        for k in keys:
            context.add_asset_metadata(events.numbers(committed[k]), partition_key=k)
        cost = metrics.prediction_check(home, version, list(committed.values()))
        check = {**(cost.to_json() if cost is not None else {}),
                 **attempts.bill(metrics.sync_attempts(home, version)).to_json()}
        if "predicted_wall_s" in check:
            context.log.info(f"predicted vs actual generation time, all committed partitions: {json.dumps(check)}")
        cols = ["partition", "rows", "errors", "input_tokens", "output_tokens", "wall_s", "tokens_per_hour", "cost_usd"]
        return MaterializeResult(metadata={
            "all_committed_partitions": MetadataValue.md(md_table([s.to_json() for s in committed.values()], cols)),
            **{f"job_{k}": v for k, v in check.items() if v is not None},
            "database": MetadataValue.path(str(home.metrics_db)),
        })

    @asset(key=job.keys["analytics"], deps=[run_metrics, labeled_outputs], group_name=group, kinds={"duckdb"}, **io,
           automation_condition=AutomationCondition.eager(),
           description="Label distribution, accuracy against the gold column, cost per 1k rows, each model's "
                       "confidence calibrated on the gold rows (ECE and Brier before and after, held out), rows to "
                       "review and accuracy per confidence bucket (DuckDB views); with a sink, the Delta Lake "
                       "table synced. Not built while a partition fails its every-row-exactly-once check.")
    def analytics(context: AssetExecutionContext) -> MaterializeResult:
        home.refresh()
        version = job.current_version()
        committed = sorted(metrics.committed_stats(home, version))
        bad = events.blocked(context.instance, labeled_key, home, version, committed)
        if bad:
            raise SparkbatchError(f"partition(s) {bad[:5]} failed the {events.EXACTLY_ONCE} check: analytics is "
                                  "not built on them; materialize labeled_outputs for them again")
        fit, result = review_assets.refresh(job, version)  # calibrate on the gold rows, then the views
        dist = [{"label": k, "rows": v} for k, v in (result.label_distribution or {}).items()]
        sure = events.confidence_metadata(result.confidence, result.reliability)
        return MaterializeResult(metadata={
            **result.numbers(), **sure, **review_assets.fit_metadata(fit), **_sync_sink(context, spec, home, version),
            "label_distribution": MetadataValue.md(md_table(dist, ["label", "rows"])),
            "database": MetadataValue.path(str(home.metrics_db)),
        })

    @asset(key=job.keys["estimate"], deps=[input_shards], group_name=group, kinds={"vllm"}, **io,
           required_resource_keys={resource_key}, pool=pool,
           description="Timed sample on the real engine: predicted duration, tokens/hour and cost per node "
                       "option (engine start included), and the cheapest model whose accuracy interval clears "
                       "the bar. Writes JSON + a chart.")
    def estimate(context: AssetExecutionContext, config: EstimateConfig) -> MaterializeResult:
        overrides = {k: v for k, v in config.model_dump().items() if v is not None}
        est = EstimateSpec(**{**spec.estimate.model_dump(), **overrides})  # overrides validated like the spec
        report = job.estimate(getattr(context.resources, resource_key), est, log=context.log.info)
        for line in report.advice:
            context.log.info(line)
        return MaterializeResult(metadata=estimate_metadata(report))

    job.assets = [input_shards, labeled_outputs, run_metrics, analytics, estimate,
                  *review_assets.build_review_assets(job, io, group)]
    _JOBS[job.keys["labeled_outputs"]] = job
    return job
