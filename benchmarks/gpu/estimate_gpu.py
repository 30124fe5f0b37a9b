"""Estimate vs reality in one process on one engine (for a GPU box, where starting vLLM twice
costs minutes of rented time): estimates with a small and a batch-sized sample, then the full
Dagster run, each compared with the measured generation time.

    python -m benchmarks.gpu.estimate_gpu --mode debian --rows 40000 --model /tmp/llama-1b \
        --load-format dummy --gpu --samples 80,1024          # an H200 (see benchmarks/runners/h200.sh)
    python -m benchmarks.gpu.estimate_gpu --mode debian --rows 1500 --samples 80   # this CPU

Prints one JSON line (``--out``: also a result file): per sample size the predicted time and
its error against the run.
"""

from __future__ import annotations

import time

from benchmarks.lib.machine import machine
from benchmarks.lib.results_io import emit
from benchmarks.lib.workload import arg_parser, set_up, shape_of
from sparkbatch_dagster import VLLMResource, build_batch_assets
from sparkbatch_dagster.spec import EstimateSpec


def main() -> None:
    p = arg_parser(__doc__, mode="debian", rows=1500)
    p.add_argument("--samples", default="80", help="sample sizes to try, comma-separated")
    p.add_argument("--out", default=None, help="also write the result object to this file")
    args = p.parse_args()

    from dagster import DagsterInstance, materialize

    spec, kw, engine, engine_start_s = set_up(args)
    resource = VLLMResource(**kw)
    res = {"vllm": resource}
    inst = DagsterInstance.get()
    job = build_batch_assets(spec=spec)
    materialize(job.assets, selection=[job.keys["input_shards"]], resources=res, instance=inst)

    predictions = {}
    for n in (int(x) for x in args.samples.split(",")):
        t = time.perf_counter()
        # fill_batch off: this measures what each sample size gives, small ones included.
        report = job.estimate(resource, EstimateSpec(sample_rows=n, warmup_rows=min(64, n), fill_batch=False)).to_json()
        predictions[n] = {"predicted_wall_s": report["predicted_wall_s"],
                          "sample_s": report["sample_s"], "estimate_s": round(time.perf_counter() - t, 1),
                          "advice": report["advice"]}
    if getattr(engine, "_llm", None) is not None:
        engine._llm.reset_prefix_cache()  # type: ignore[attr-defined]  # the run starts cold, as a real one
    keys = inst.get_dynamic_partitions(job.partitions_def.name)
    tags = {"dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]}
    materialize(job.assets, selection=[job.keys["labeled_outputs"]], resources=res, instance=inst, tags=tags)
    result = materialize(job.assets, selection=[job.keys["run_metrics"]], resources=res, instance=inst, tags=tags)
    md = result.asset_materializations_for_node("bench__run_metrics")[0].metadata
    actual = md["job_actual_wall_s"].value if "job_actual_wall_s" in md else sum(
        m.metadata["wall_s"].value for m in result.asset_materializations_for_node("bench__run_metrics"))
    for pred in predictions.values():
        pred["error_pct"] = round((pred["predicted_wall_s"] - actual) / actual * 100, 1)
    resource.shutdown()  # else the interpreter's exit waits on vLLM's engine-core process
    emit({"benchmark": "estimate_gpu", "mode": args.mode, "rows": args.rows, "model": engine.model_id,
          "shape": shape_of(engine.model_id), "machine": machine(), "engine_start_s": round(engine_start_s, 1),
          "actual_wall_s": actual, "samples": predictions}, args.out)


if __name__ == "__main__":
    main()
