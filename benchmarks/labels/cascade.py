"""A cascade against each model alone, on the same rows: what the estimate judged, then real runs.

    python -m benchmarks.labels.cascade --rows 240 --sample-rows 120 --out benchmarks/results/cascade-cpu.json
    python -m benchmarks.labels.cascade --first /tmp/llama-1b --second /tmp/llama-8b --no-estimate --rows 20000 \
        --resource '{"engine_kwargs": {"load_format": "dummy"}, "kv_cache_memory_gb": 24, \
                     "gpu_memory_utilization": 0.3}'

Debian packages of the sections in ``lib/debian_labels.py`` (gold: the archive's own section), the
embedded SmolLM2 and Gemma 3 270M. First ``job.estimate`` with Gemma as a candidate and this
machine priced at ``--hourly-usd``: each model's accuracy interval and cost, and every cascade
(``estimate/cascades.py``). Then three real Dagster runs over all the rows, each in a fresh home:
SmolLM2 alone, Gemma alone, and the cascade SmolLM2 then Gemma below ``--below`` (default: the
threshold the estimate picked for that pair). Engines are kept warm between runs (each model
starts once), so each run's generation time is compared with its engine start left out; the
starts are reported apart. Reports accuracy, generation seconds, the share of rows the cascade
sent to Gemma, and the bill of each run at ``--hourly-usd``.

``--first`` / ``--second`` name other models (a GPU box: 1B- and 8B-shaped models with dummy
weights) and ``--resource`` the engine settings (VLLMResource fields over ``SETTINGS``; on a GPU
a fixed ``kv_cache_memory_gb`` and a ``gpu_memory_utilization`` both engines fit under, as they
stay up together; ``--second-engine-kwargs`` the second model's own, ``{"load_format": "dummy"}``
after a first model with weights of its own). ``--no-estimate`` skips the estimate (random
weights have no accuracy to judge): then the threshold is ``--below`` or, left out, the one
that sends the share of the first model's answers (in its own run) nearest one half to the
second. Time and cost are what such a run measures.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.lib.debian_labels import SECTIONS, rows
from benchmarks.lib.machine import machine
from benchmarks.lib.results_io import emit

ROOT = Path(__file__).resolve().parents[2]

#: Prefix caching off: a warm engine would otherwise answer a later run's same prompts from the
#: KV cache the earlier run left, and the runs' generation times would not compare.
SETTINGS = {"kv_cache_memory_gb": 1.0, "max_num_seqs": 64, "max_model_len": 1024, "keep_warm": True,
            "enable_prefix_caching": False}


def spec_for(src: Path, home: Path, args: argparse.Namespace, cascade: list[dict[str, Any]] | None = None) -> Any:
    from sparkbatch_dagster import EstimateSpec, JobSpec, OutputSpec, SamplingSpec

    est = EstimateSpec(sample_rows=args.sample_rows, warmup_rows=4, fill_batch=False, min_sample_seconds=0,
                       models=["gemma-3-270m"], accuracy_bar=args.bar, hourly_rate_usd=args.hourly_usd,
                       max_sample_rows=args.sample_rows)
    return JobSpec(name="debian", input=str(src), id_column="package", text_columns=["package", "description"],
                   system_prompt="Sort Debian packages into their archive section. Answer with one of: "
                   + ", ".join(SECTIONS), user_template="Package: {{ package }}\n{{ description }}",
                   output=OutputSpec(kind="label", labels=SECTIONS), sampling=SamplingSpec(max_tokens=8),
                   shard_count=1, gold_column="section", home=str(home), hourly_rate_usd=args.hourly_usd,
                   estimate=est, cascade=cascade or [])


def label(spec: Any, resource: Any) -> tuple[dict[str, Any], list[float]]:
    """One real run of ``spec``: accuracy, the models that answered, and its committed stats; and
    its answers' confidences, sorted."""
    from dagster import DagsterInstance, materialize

    from sparkbatch_dagster import build_batch_assets

    job = build_batch_assets(spec=spec)
    inst = DagsterInstance.ephemeral()
    res = {"vllm": resource}
    assert materialize(job.assets, selection=[job.keys["input_shards"]], resources=res, instance=inst).success
    key = inst.get_dynamic_partitions(job.partitions_def.name)[0]
    began = time.perf_counter()
    assert materialize(job.assets, selection=[job.keys["labeled_outputs"]], resources=res, instance=inst,
                       partition_key=key).success
    took = time.perf_counter() - began
    version = job.output_version(resource)
    stats = json.loads(job.home.stats_path(version, key).read_text())
    out = job.read_outputs().to_pylist()
    gold = {r["package"]: r["section"] for r in rows_by_id}
    by_model: dict[str, int] = {}
    for r in out:
        by_model[r["model"]] = by_model.get(r["model"], 0) + 1
    sure = sorted(r["confidence"] for r in out if r.get("confidence") is not None)
    report = {"rows": len(out), "median_confidence": round(sure[len(sure) // 2], 4) if sure else None,
              "accuracy": round(sum(r["output"] == gold[r["row_id"]] for r in out) / len(out), 4),
              "run_s": round(took, 2), "engine_start_s": round(stats.get("engine_start_s", 0.0), 2),
              "generation_s": round(stats["wall_s"], 2),  # the shard's window: its engine start is apart
              "cost_usd": stats["cost_usd"], "rows_by_model": by_model}
    return report, sure


rows_by_id: list[dict[str, str]] = []


def halving_threshold(sure: list[float]) -> float:
    """The threshold that escalates the share of rows nearest one half. Not the median itself:
    with random weights many answers share one confidence, and "below the median" can be none."""
    def share(t: float) -> float:
        return sum(c < t for c in sure) / len(sure)

    candidates = sorted({round(c, 6) + 1e-6 for c in sure})
    return min(candidates, key=lambda t: abs(share(t) - 0.5))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=240)
    ap.add_argument("--sample-rows", type=int, default=120)
    ap.add_argument("--bar", type=float, default=0.25, help="the estimate's accuracy bar")
    ap.add_argument("--below", type=float, default=None, help="the cascade's threshold (default: the estimate's)")
    ap.add_argument("--hourly-usd", type=float, default=0.79)
    ap.add_argument("--first", default=None, help="the first stage's model (default: the embedded SmolLM2)")
    ap.add_argument("--second", default="gemma-3-270m", help="the second stage's model")
    ap.add_argument("--resource", default="{}", metavar="JSON", help="VLLMResource fields over SETTINGS")
    ap.add_argument("--second-engine-kwargs", default="{}", metavar="JSON",
                    help="engine_kwargs of the second model only (a dummy-weight 8B after a first model with weights)")
    ap.add_argument("--no-estimate", dest="estimate", action="store_false",
                    help="no estimate; --below, or a threshold that escalates about half the rows")
    ap.add_argument("--out")
    args = ap.parse_args()
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sparkbatch_dagster import VLLMResource
    from sparkbatch_dagster.definitions.resource import close_warm_engines

    rows_by_id.extend({k: r[k] for k in ("package", "description", "section")} for r in rows(args.rows))
    work = Path(tempfile.mkdtemp(prefix="sb-cascade-"))
    src = work / "in.parquet"
    pq.write_table(pa.Table.from_pylist(rows_by_id), src)
    resource = VLLMResource(**{**SETTINGS, **json.loads(args.resource)})
    if args.first:
        resource = resource.with_model(args.first)
    report: dict[str, Any] = {"models": [], "cascades": [], "best_buy": None, "advice": []}
    try:
        from sparkbatch_dagster import build_batch_assets
        from sparkbatch_dagster.inputs.shards import build_shards

        below = args.below
        if args.estimate:
            job = build_batch_assets(spec=spec_for(src, work / "estimate", args))
            build_shards(job.spec, job.home)
            report = job.estimate(resource, log=lambda line: print(line, file=sys.stderr, flush=True)).to_json()
            first_name = resource.model_identity().split("@")[0]
            pair = next(c for c in report["cascades"] if c["stages"][0].split("@")[0] == first_name)
            below = below if below is not None else pair["threshold"]
        first, sure = label(spec_for(src, work / "first", args), resource)
        if below is None:
            below = halving_threshold(sure)
        second_kwargs = json.loads(args.second_engine_kwargs)
        runs = {
            "first": first,
            "second": label(spec_for(src, work / "second", args), resource.with_model(args.second, second_kwargs))[0],
            "cascade": label(spec_for(src, work / "cascade", args, [
                {"below": below}, {"model": args.second, "engine_kwargs": second_kwargs}]), resource)[0],
        }
    finally:
        close_warm_engines()
    keep = ("model", "accuracy", "accuracy_low", "accuracy_high", "sample_rows", "best_option", "best_cost_usd")
    emit({
        "benchmark": "cascade", "machine": machine(), "rows": len(rows_by_id), "sample_rows": args.sample_rows,
        "labels": SECTIONS, "hourly_usd": args.hourly_usd, "accuracy_bar": args.bar, "below": below,
        "estimate": {"models": [{k: m.get(k) for k in keep} for m in report["models"]],
                     "cascades": [{k: c.get(k) for k in ("model", "threshold", "accuracy", "accuracy_low",
                                                         "accuracy_high", "escalated_share", "best_option",
                                                         "best_cost_usd", "clears", "curve")}
                                  for c in report["cascades"]],
                     "best_buy": report["best_buy"], "advice": report["advice"]},
        "first": resource.model_identity(), "second": args.second, "runs": runs, "run_order": list(runs),
        # Rows the second model answered (the models column names each stage by its identity).
        "escalated_share": round(sum(n for m, n in runs["cascade"]["rows_by_model"].items()
                                     if m.split("@")[0] != resource.model_identity().split("@")[0])
                                 / runs["cascade"]["rows"], 4),
        # The second model's (Gemma's in the CPU runs), kept under the name the first file used.
        "cascade_over_gemma_generation": round(runs["cascade"]["generation_s"] / runs["second"]["generation_s"], 3),
        "cascade_over_second_cost": round(runs["cascade"]["cost_usd"] / runs["second"]["cost_usd"], 3),
    }, args.out)


if __name__ == "__main__":
    main()
