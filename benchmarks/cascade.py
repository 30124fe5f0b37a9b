"""A cascade against each model alone, on the same rows: what the estimate judged, then real runs.

    python benchmarks/cascade.py --rows 240 --sample-rows 120 --out benchmarks/results/cascade-cpu.json

Debian packages of the sections in ``label_decoding.py`` (gold: the archive's own section), the
embedded SmolLM2 and Gemma 3 270M. First ``job.estimate`` with Gemma as a candidate and this
machine priced at ``--hourly-usd``: each model's accuracy interval and cost, and every cascade
(``estimate/cascades.py``). Then three real Dagster runs over all the rows, each in a fresh home:
SmolLM2 alone, Gemma alone, and the cascade SmolLM2 then Gemma below ``--below`` (default: the
threshold the estimate picked for that pair). Engines are kept warm between runs (each model
starts once), so each run's generation time is compared with its engine start left out; the
starts are reported apart. Reports accuracy, generation seconds, the share of rows the cascade
sent to Gemma, and the bill of each run at ``--hourly-usd``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from label_decoding import SECTIONS, machine, rows  # noqa: E402
from results_io import emit  # noqa: E402

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


def label(spec: Any, resource: Any) -> dict[str, Any]:
    """One real run of ``spec``: accuracy, the models that answered, and its committed stats."""
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
    return {"rows": len(out), "accuracy": round(sum(r["output"] == gold[r["row_id"]] for r in out) / len(out), 4),
            "run_s": round(took, 2), "engine_start_s": round(stats.get("engine_start_s", 0.0), 2),
            "generation_s": round(stats["wall_s"], 2),  # the shard's window: its engine start is apart
            "cost_usd": stats["cost_usd"], "rows_by_model": by_model}


rows_by_id: list[dict[str, str]] = []


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=240)
    ap.add_argument("--sample-rows", type=int, default=120)
    ap.add_argument("--bar", type=float, default=0.25, help="the estimate's accuracy bar")
    ap.add_argument("--below", type=float, default=None, help="the cascade's threshold (default: the estimate's)")
    ap.add_argument("--hourly-usd", type=float, default=0.79)
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
    resource = VLLMResource(**SETTINGS)
    try:
        from sparkbatch_dagster import build_batch_assets
        from sparkbatch_dagster.inputs.shards import build_shards

        job = build_batch_assets(spec=spec_for(src, work / "estimate", args))
        build_shards(job.spec, job.home)
        report = job.estimate(resource, log=lambda line: print(line, file=sys.stderr, flush=True))
        pair = next(c for c in report["cascades"] if c["stages"][0].startswith("SmolLM2"))
        below = args.below if args.below is not None else pair["threshold"]
        runs = {
            "smollm2": label(spec_for(src, work / "smol", args), resource),
            "gemma": label(spec_for(src, work / "gemma", args), resource.with_model("gemma-3-270m")),
            "cascade": label(spec_for(src, work / "cascade", args, [{"below": below}, {"model": "gemma-3-270m"}]),
                             resource),
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
        "runs": runs, "run_order": list(runs),
        "cascade_over_gemma_generation": round(runs["cascade"]["generation_s"] / runs["gemma"]["generation_s"], 3),
    }, args.out)


if __name__ == "__main__":
    main()
