"""The asset factory: one call turns a :class:`JobSpec` into partitioned Dagster assets.

    input_shards  -> labeled_outputs (one partition per shard) -> run_metrics -> analytics
                  -> estimate (a timed sample: duration, cost per node option, model choice)
"""


import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Optional

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    BackfillPolicy,
    Config,
    DynamicPartitionsDefinition,
    MaterializeResult,
    MetadataValue,
    asset,
)

from . import metrics
from .engines.base import LazyEngine
from .errors import SparkbatchError
from .progress import Relay
from .resources import VLLMResource, on_cpu
from .runner import ShardRun
from .shards import build_shards
from .spec import EstimateSpec, JobSpec, fingerprint
from .store import JobHome, atomic_write_text

# One run per backfill is the point of this plugin (one engine start); Dagster marks the
# parameter beta, a notice no user of these assets can act on.
warnings.filterwarnings("ignore", message=r"Parameter `backfill_policy` of function `asset` is currently in beta")


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
        model = resource.model_identity()
        return fingerprint({"prompt": self.spec.prompt_fingerprint(), "model": model, "input": manifest["signature"]})

    def estimate(self, resource: VLLMResource, est: EstimateSpec | None = None) -> dict[str, Any]:
        """Time a sample on the configured model and on each candidate in ``est.models`` (one
        engine at a time, open only while that model samples; a model whose accuracy interval
        straddles the bar samples more rows first); count the rows the result store already
        answers; predict duration and cost of the whole job (engine start included) per node
        option; name the best buy; write JSON + chart; return the report.

        Example::

            report = job.estimate(VLLMResource(), EstimateSpec(models=["gemma-3-270m"], accuracy_bar=0.2))
            report["predicted_wall_s"], report["chosen_model"], report["chart"]
        """
        from . import choice as C
        from . import estimate as E
        from .model import weights_gb
        from .results import ResultStore

        est = est or self.spec.estimate
        on_gpu = not on_cpu()
        if on_gpu and est.fill_batch and est.sample_rows < resource.max_num_seqs:
            est = est.model_copy(update={"sample_rows": resource.max_num_seqs})
        sample = E.draw_sample(self.spec, self.home, est)
        has_gold = self.spec.gold_column is not None
        models: list[dict[str, Any]] = []
        failed: list[dict[str, str]] = []
        for candidate in [None, *[m for m in est.models if m != resource.model]]:
            res = resource if candidate is None else resource.with_model(candidate)
            try:  # one engine at a time: a small box holds one model's KV cache, not several
                name = res.model_name()
                timing = E.sample_model(self.spec, self.home, est, sample, res.get_engine())
            except SparkbatchError as exc:
                if candidate is None:  # the job's own model must run; a candidate may fail alone
                    raise
                failed.append({"model": candidate, "error": str(exc)})
                continue
            finally:  # a candidate's engine goes now, even with keep_warm: the next one needs the memory
                res.close() if candidate is None else res.shutdown()
            store = ResultStore(self.spec.result_store_path, self.spec.answer_context(res.model_identity()))
            stored = E.count_stored(self.spec, self.home, sample, store)
            models.append({**E.predict(sample, timing, est.options, weights_gb(name), stored),
                           "configured_as": res.model})
            m = models[-1]
            atomic_write_text(self.home.prediction_path(self.output_version(res)), json.dumps({
                "model": timing.model, "predicted_wall_s": m["predicted_wall_s"],
                "predicted_prompts": m["prompts_to_generate"], "stored_rows": m["stored_rows"],
                "engine_start_s": m["engine_start_s"], "best_cost_usd": m["best_cost_usd"],
                "total_rows": sample.total_rows, "sample_rows": m["sample_rows"],
                "made_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            }))
        chosen = C.choose(models, est.accuracy_bar, has_gold)
        primary = models[0]
        report = {
            "job": self.spec.name, "base_sample_rows": len(sample.rows), "sample_rows": len(sample.rows),
            "total_rows": sample.total_rows, "distinct_prompts": sample.distinct_prompts, **primary,
            "accuracy_bar": est.accuracy_bar, "max_sample_rows": est.max_sample_rows,
            "chosen_model": chosen["model"] if chosen else None,
            "chosen_configured_as": chosen["configured_as"] if chosen else None,
            "chosen_cost_usd": chosen["best_cost_usd"] if chosen else None,
            "models": models, "failed_models": failed,
            # A job smaller than one batch never fills the GPU either: compare with what the run can fill.
            "advice": C.advise(primary, chosen, est, len(sample.rows), min(resource.max_num_seqs, sample.total_rows),
                               on_gpu=on_gpu, has_gold=has_gold, models=models, total_rows=sample.total_rows)
            + [f"Candidate {f['model']!r} could not run, left out: {f['error']}" for f in failed],
        }
        return E.write_report(report, self.home.estimate_dir)

    def done_partitions(self, resource: VLLMResource) -> list[str]:
        manifest = self.home.read_manifest() or {"keys": []}
        if not manifest["keys"]:
            return []
        version = self.output_version(resource)
        return [k for k in manifest["keys"] if self.home.is_done(version, k)]


def _md_table(rows: Sequence[dict[str, Any]], cols: Sequence[str]) -> str:
    head = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
    return head + "\n".join("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows)


class EstimateConfig(Config):
    """Launchpad overrides of the job's ``estimate`` settings (unset: the spec's)."""

    sample_rows: Optional[int] = None  # noqa: UP045 - Dagster reads these annotations at runtime
    models: Optional[list[str]] = None  # noqa: UP045
    accuracy_bar: Optional[float] = None  # noqa: UP045


def _totals(stats: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("rows", "labeled", "errors", "input_tokens", "output_tokens", "wall_s", "cost_usd",
            "generated_requests", "reused_rows")
    return {k: round(sum(s.get(k, 0) for s in stats), 6) for k in keys}


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
    names = ("input_shards", "labeled_outputs", "run_metrics", "analytics", "estimate")
    job.keys = {n: AssetKey([*prefix, n]) for n in names}
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
        engine = LazyEngine(resource.model_identity(), resource.get_engine)
        computed: list[dict[str, Any]] = []
        if todo:
            context.log.info(f"labeling {len(todo)} partition(s) with {engine.model_id}; the engine starts "
                             "when the first prompt that is not in the result store needs it")
            runner = ShardRun(spec, home, version, engine, progress=Relay(context.log.info))
            computed = runner.run(todo, on_done=lambda s: context.log.info(f"{s['partition']} done: {json.dumps(s)}"))
        stats += computed
        engine_start_s = engine.start_seconds
        worst = max(stats, key=lambda s: s["errors"] / max(s["rows"], 1))
        rate = worst["errors"] / max(worst["rows"], 1)
        # Rows and tokens: every partition of the run; what was generated or reused: this run's own.
        this_run = {k: sum(s.get(k, 0) for s in computed) for k in ("generated_requests", "reused_rows")}
        return MaterializeResult(
            metadata={**_totals(stats), **this_run, "partitions_computed": len(todo), "version": version,
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
        check = metrics.prediction_check(home, version, list(committed.values()))
        if "predicted_wall_s" in check:
            context.log.info(f"predicted vs actual generation time, all committed partitions: {json.dumps(check)}")
        return MaterializeResult(metadata={
            **_totals(stats), **{k: v for k, v in check.items() if v is not None},
            "table": MetadataValue.md(_md_table(stats, cols)),
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

    @asset(key=job.keys["estimate"], deps=[input_shards], group_name=group, kinds={"vllm"},
           required_resource_keys={resource_key},
           description="Timed sample on the real engine: predicted duration, tokens/hour and cost per node "
                       "option (engine start included), and the cheapest model whose accuracy interval clears "
                       "the bar. Writes JSON + a chart.")
    def estimate(context: AssetExecutionContext, config: EstimateConfig) -> MaterializeResult:
        overrides = {k: v for k, v in config.model_dump().items() if v is not None}
        est = EstimateSpec(**{**spec.estimate.model_dump(), **overrides})  # overrides validated like the spec
        report = job.estimate(getattr(context.resources, resource_key), est)
        for line in report["advice"]:
            context.log.info(line)
        table = [{"model": m["model"], "rows": m["sample_rows"], "accuracy": m["accuracy"],
                  "95% interval": f"{m['accuracy_low']}-{m['accuracy_high']}" if m["accuracy"] is not None else "",
                  "tokens/hour": m["predicted_tokens_per_hour"], "stored rows": m["stored_rows"],
                  **{f"{o['name']} $": o["cost_usd"] for o in m["options"]}} for m in report["models"]]
        return MaterializeResult(metadata={
            **{k: report[k] for k in ("sample_rows", "total_rows", "predicted_wall_s", "predicted_tokens_per_hour",
                                      "engine_start_s", "model", "stored_rows", "prompts_to_generate")},
            **{f"cost_usd {o['name']}": o["cost_usd"] for o in report["options"] if o["cost_usd"] is not None},
            "chosen_model": str(report["chosen_model"]),
            **({"chosen_cost_usd": report["chosen_cost_usd"]} if report["chosen_cost_usd"] is not None else {}),
            "models": MetadataValue.md(_md_table(table, list(table[0]))),
            "advice": MetadataValue.md("\n".join(f"- {a}" for a in report["advice"])),
            "chart": MetadataValue.path(report["chart"]), "report": MetadataValue.path(report["json"]),
        })

    job.assets = [input_shards, labeled_outputs, run_metrics, analytics, estimate]
    return job
