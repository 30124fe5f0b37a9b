"""The asset factory: one call turns a :class:`JobSpec` into partitioned Dagster assets.

    input_shards  -> labeled_outputs (one partition per shard) -> run_metrics -> analytics
"""


import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    BackfillPolicy,
    DynamicPartitionsDefinition,
    MaterializeResult,
    MetadataValue,
    asset,
)

from . import metrics
from .errors import SparkbatchError
from .model import model_identity
from .resources import VLLMResource
from .runner import ShardRun
from .shards import build_shards
from .spec import JobSpec, fingerprint
from .store import JobHome


@dataclass
class BatchJob:
    """What :func:`build_batch_assets` returns: the assets plus what a CLI needs to drive them."""

    spec: JobSpec
    home: JobHome
    partitions_def: DynamicPartitionsDefinition
    assets: list[AssetsDefinition] = field(default_factory=list)
    keys: dict[str, AssetKey] = field(default_factory=dict)
    resource_key: str = "vllm"

    def output_version(self, resource: VLLMResource) -> str:
        """Fingerprint of prompt + sampling + model + input shards: the output folder's name."""
        manifest = self.home.read_manifest()
        if manifest is None:
            shards = self.keys["input_shards"].to_user_string()
            raise SparkbatchError(f"{self.home.root} has no shards yet: materialize {shards} first")
        model = model_identity(resource.model_name())
        return fingerprint({"prompt": self.spec.prompt_fingerprint(), "model": model, "input": manifest["signature"]})

    def done_partitions(self, resource: VLLMResource) -> list[str]:
        manifest = self.home.read_manifest() or {"keys": []}
        if not manifest["keys"]:
            return []
        version = self.output_version(resource)
        return [k for k in manifest["keys"] if self.home.is_done(version, k)]


def _md_table(rows: Sequence[dict[str, Any]], cols: Sequence[str]) -> str:
    head = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
    return head + "\n".join("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows)


def _totals(stats: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("rows", "labeled", "errors", "input_tokens", "output_tokens", "wall_s", "cost_usd")
    return {k: round(sum(s[k] for s in stats), 6) for k in keys}


def build_batch_assets(
    *, spec: JobSpec, key_prefix: str | Sequence[str] | None = None, group_name: str | None = None,
    resource_key: str = "vllm", upstream: Sequence[AssetsDefinition | AssetKey] = (),
) -> BatchJob:
    """Build the job's four assets and one asset check.

    Example::

        job = build_batch_assets(spec=spec)
        defs = Definitions(assets=job.assets, resources={"vllm": VLLMResource()})

    Args:
        spec: the job.
        key_prefix: asset key prefix (default: the job name).
        group_name: Dagster asset group (default: the job name).
        resource_key: key of the :class:`VLLMResource` in ``Definitions.resources``.
        upstream: assets that produce the input files (``input_shards`` depends on them).
    """
    prefix = [key_prefix] if isinstance(key_prefix, str) else list(key_prefix or [spec.name])
    group = group_name or spec.name
    home = JobHome(spec.home_path)
    parts = DynamicPartitionsDefinition(name=f"{spec.name}_shards")
    job = BatchJob(spec, home, parts, resource_key=resource_key)
    job.keys = {n: AssetKey([*prefix, n]) for n in ("input_shards", "labeled_outputs", "run_metrics", "analytics")}
    policy = BackfillPolicy.single_run()  # one run, one engine start, for a whole backfill

    @asset(key=job.keys["input_shards"], deps=list(upstream), group_name=group, kinds={"duckdb", "parquet"},
           description=f"{spec.input} split into shards by a hash of the row id.")
    def input_shards(context: AssetExecutionContext) -> MaterializeResult:
        manifest = build_shards(spec, home)
        known = set(context.instance.get_dynamic_partitions(parts.name or ""))
        new = [k for k in manifest["keys"] if k not in known]
        if new:
            context.instance.add_dynamic_partitions(parts.name or "", new)
        for stale in sorted(known - set(manifest["keys"])):
            context.instance.delete_dynamic_partition(parts.name or "", stale)
        return MaterializeResult(metadata={
            "rows": manifest["rows"], "shards": manifest["shard_count"], "reused": manifest["reused"],
            "path": MetadataValue.path(str(home.shards_dir)),
        })

    check = AssetCheckSpec("error_rate", asset=job.keys["labeled_outputs"],
                           description=f"Error rows are at most {spec.max_error_rate:.0%} of each partition.")

    @asset(key=job.keys["labeled_outputs"], deps=[input_shards], partitions_def=parts, backfill_policy=policy,
           group_name=group, kinds={"vllm", "parquet"}, required_resource_keys={resource_key},
           code_version=spec.prompt_fingerprint(), check_specs=[check],
           description="One shard labeled by the model; every input row exactly once (a label or an error).")
    def labeled_outputs(context: AssetExecutionContext) -> MaterializeResult:
        resource: VLLMResource = getattr(context.resources, resource_key)
        version = job.output_version(resource)
        todo = [k for k in context.partition_keys if not home.is_done(version, k)]
        stats = [json.loads(home.stats_path(version, k).read_text()) for k in context.partition_keys if k not in todo]
        if stats:
            context.log.info(f"{len(stats)} partition(s) already done under version {version}: not recomputed")
        home.remove_stale_parts(version)
        engine_start_s = 0.0
        if todo:
            engine = resource.get_engine()
            engine_start_s = engine.start_seconds
            context.log.info(f"labeling {len(todo)} partition(s); engine started in {engine_start_s:.1f}s")
            runner = ShardRun(spec, home, version, engine, progress=lambda p: context.log.info(json.dumps(p)))
            stats += runner.run(todo, on_done=lambda s: context.log.info(f"{s['partition']} done: {json.dumps(s)}"))
        worst = max(stats, key=lambda s: s["errors"] / max(s["rows"], 1))
        rate = worst["errors"] / max(worst["rows"], 1)
        return MaterializeResult(
            metadata={**_totals(stats), "partitions_computed": len(todo), "version": version,
                      "engine_start_s": round(engine_start_s, 2),
                      "path": MetadataValue.path(str(home.version_dir(version) / "labeled"))},
            check_results=[AssetCheckResult(
                passed=rate <= spec.max_error_rate, severity=AssetCheckSeverity.ERROR,
                metadata={"worst_partition": worst["partition"], "error_rate": round(rate, 4),
                          "max_error_rate": spec.max_error_rate,
                          "error_reasons": MetadataValue.json(worst["error_reasons"])},
            )],
        )

    @asset(key=job.keys["run_metrics"], deps=[labeled_outputs], partitions_def=parts, backfill_policy=policy,
           group_name=group, kinds={"duckdb"}, required_resource_keys={resource_key},
           description="Rows, errors, tokens, time, tokens/hour and cost per partition, in metrics.duckdb.")
    def run_metrics(context: AssetExecutionContext) -> MaterializeResult:
        version = job.output_version(getattr(context.resources, resource_key))
        committed = metrics.sync(home, version)
        missing = [k for k in context.partition_keys if k not in committed]
        if missing:
            raise SparkbatchError(f"no finished output for {missing}: materialize labeled_outputs for them first")
        stats = [committed[k] for k in context.partition_keys]
        cols = ["partition", "rows", "errors", "input_tokens", "output_tokens", "wall_s", "tokens_per_hour", "cost_usd"]
        return MaterializeResult(metadata={
            **_totals(stats), "table": MetadataValue.md(_md_table(stats, cols)),
            "database": MetadataValue.path(str(home.metrics_db)),
        })

    @asset(key=job.keys["analytics"], deps=[run_metrics], group_name=group, kinds={"duckdb"},
           required_resource_keys={resource_key},
           description="Label distribution, accuracy against the gold column, cost per 1k rows (DuckDB views).")
    def analytics(context: AssetExecutionContext) -> MaterializeResult:
        version = job.output_version(getattr(context.resources, resource_key))
        result = metrics.analytics(spec, home, version)
        dist = [{"label": k, "rows": v} for k, v in result.pop("label_distribution").items()]
        return MaterializeResult(metadata={
            **{k: v for k, v in result.items() if v is not None},
            "label_distribution": MetadataValue.md(_md_table(dist, ["label", "rows"])),
            "database": MetadataValue.path(str(home.metrics_db)),
        })

    job.assets = [input_shards, labeled_outputs, run_metrics, analytics]
    return job
