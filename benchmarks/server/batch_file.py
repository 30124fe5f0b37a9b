"""The batch-file path against the column path: the same prompts, the same engine, one invocation.

    python -m benchmarks.server.batch_file --rows 400 --max-tokens 16 --repeat 2       # CPU, embedded SmolLM2
    BENCH=batch_file REPEAT=2 bash benchmarks/runners/h200.sh 1b 16000 64   # an H200 (throughput.py's options)

(a) column: the job as a table (an id and a text column) and a template, as ``throughput.py``'s
pipeline runs it: ``input_shards``, then ``labeled_outputs`` and ``run_metrics`` materialized;
(b) batch file: the same rendered messages as an OpenAI Batch input file, one line a row with its
own ``max_tokens`` (the job's default is another, so every row carries its own sampling, as a
real file's lines do), run by the same assets (``input_format: openai_batch``) and then
exported to the output file (``sparkbatch export-batch``'s work). Each round has a fresh home
for both arms; the prefix cache is reset before each arm; rounds run A-B / B-A. Reported per
arm: sharding, labeling (the two materializations), export, total wall seconds and this
process's CPU seconds; ``ratio`` is batch total / column total (above 1: the batch file costs
more). The last line is one JSON object (``--out`` also writes it to a result file).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.lib.machine import machine
from benchmarks.lib.results_io import emit
from benchmarks.lib.workload import arg_parser, set_up, shape_of, vllm_version
from sparkbatch_dagster import JobSpec, OutputSpec, SamplingSpec, VLLMResource, build_batch_assets
from sparkbatch_dagster.definitions.batch_files import batch_file_job, export_batch
from sparkbatch_dagster.spec.prompts import render

ROOT = Path(__file__).resolve().parents[2]


def text_spec(spec: JobSpec) -> JobSpec:
    """The column job with free-text output: a batch file's line has no choice of labels."""
    if spec.output.kind == "text":
        return spec
    return spec.model_copy(update={"output": OutputSpec(), "gold_column": None})


def write_batch_file(spec: JobSpec, rows: list[dict[str, Any]], path: Path) -> None:
    """The column job's rendered prompts as an OpenAI Batch input file, ids kept."""
    with path.open("w") as f:
        for r in rows:
            messages = render(spec.system_prompt, spec.user_template, {c: r[c] for c in spec.text_columns}).messages()
            body = {"model": "bench", "messages": messages, "max_tokens": spec.sampling.max_tokens}
            f.write(json.dumps({"custom_id": str(r[spec.id_column]), "method": "POST",
                                "url": "/v1/chat/completions", "body": body}) + "\n")


def cpu() -> float:
    t = os.times()
    return t.user + t.system


def arm(job: Any, res: dict[str, Any], inst: Any, engine: Any, export_to: Path | None) -> dict[str, float]:
    """Shard, label, metrics (and export) one job; seconds of each, CPU seconds, tokens."""
    from dagster import materialize

    began, cpu0 = time.perf_counter(), cpu()
    materialize(job.assets, selection=[job.keys["input_shards"]], resources=res, instance=inst)
    sharded = time.perf_counter()
    keys = inst.get_dynamic_partitions(job.partitions_def.name)
    if getattr(engine, "_llm", None) is not None:
        engine._llm.reset_prefix_cache()
    tags = {"dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]}
    result = materialize(job.assets, selection=[job.keys["labeled_outputs"]], resources=res, instance=inst, tags=tags)
    materialize(job.assets, selection=[job.keys["run_metrics"]], resources=res, instance=inst, tags=tags)
    labeled = time.perf_counter()
    written = export_batch(job, export_to).to_json() if export_to is not None else None
    ended = time.perf_counter()
    mds = [m.metadata for m in result.asset_materializations_for_node("__".join(job.keys["labeled_outputs"].path))]
    out = {"sharding_s": sharded - began, "labeling_s": labeled - sharded, "export_s": ended - labeled,
           "total_s": ended - began, "cpu_s": cpu() - cpu0,
           "rows": sum(md["rows"].value for md in mds), "errors": sum(md["errors"].value for md in mds),
           "tokens": sum(md["input_tokens"].value + md["output_tokens"].value for md in mds)}
    if written is not None:
        assert written["complete"] and written["written"] + written["errors"] == out["rows"], written
    return out


def main() -> None:
    p = arg_parser(__doc__, mode="synthetic", rows=400)
    p.add_argument("--repeat", type=int, default=2, help="rounds of column + batch file (A-B / B-A order)")
    p.add_argument("--out", default=None, help="also write the result object to this file (benchmarks/results/...)")
    args = p.parse_args()

    import pyarrow.parquet as pq
    from dagster import DagsterInstance

    spec, kw, engine, engine_start_s = set_up(args)
    spec = text_spec(spec)
    home = spec.home_path
    res = {"vllm": VLLMResource(**kw)}
    inst = DagsterInstance.get()
    rows = pq.read_table(spec.input).to_pylist()
    batch_input = home / "requests.jsonl"
    write_batch_file(spec, rows, batch_input)
    # The job's default max_tokens differs from every line's: each row carries its own sampling.
    default = SamplingSpec(**{**spec.sampling.model_dump(), "max_tokens": spec.sampling.max_tokens + 1})

    def column(n: int) -> dict[str, float]:
        job = build_batch_assets(spec=spec.model_copy(update={"home": str(home / f"column-{n}")}))
        return arm(job, res, inst, engine, None)

    def batch(n: int) -> dict[str, float]:
        job, _ = batch_file_job(batch_input, "openai_batch", home=home / f"batch-{n}", name="bench_batch",
                                resource=res["vllm"], sampling=default, shard_count=spec.shard_count, shard_size=None)
        return arm(job, res, inst, engine, home / f"batch-{n}-out.jsonl")

    runs: dict[str, list[dict[str, float]]] = {"column": [], "batch": []}
    for n in range(args.repeat):
        order = [("column", column), ("batch", batch)]
        for name, fn in order if n % 2 == 0 else order[::-1]:
            runs[name].append(fn(n))
        c, b = runs["column"][-1], runs["batch"][-1]
        print(f"round {n}: column {c['total_s']:.2f} s, batch file {b['total_s']:.2f} s, "
              f"ratio {b['total_s'] / c['total_s']:.3f}", file=sys.stderr, flush=True)
    res["vllm"].shutdown()
    emit(summarize(args, engine.model_id, len(rows), spec, runs, engine_start_s), args.out)


def summarize(args: Any, model_id: str, rows: int, spec: JobSpec, runs: dict[str, list[dict[str, float]]],
              engine_start_s: float) -> dict[str, Any]:
    """The result object: per-round figures of each arm, and batch / column ratios of their sums."""
    def total(name: str, key: str) -> float:
        return sum(r[key] for r in runs[name])

    tokens = {name: {r["tokens"] for r in rs} for name, rs in runs.items()}
    return {
        "benchmark": "batch_file", "mode": args.mode, "model": model_id, "shape": shape_of(model_id),
        "load_format": args.load_format or "auto", "vllm": vllm_version(), "machine": machine(), "rows": rows,
        "shards": spec.shard_count, "max_tokens": spec.sampling.max_tokens, "rounds": args.repeat,
        "engine_start_s": round(engine_start_s, 1),
        "column": [{k: round(v, 3) for k, v in r.items()} for r in runs["column"]],
        "batch": [{k: round(v, 3) for k, v in r.items()} for r in runs["batch"]],
        "ratio": round(total("batch", "total_s") / total("column", "total_s"), 4),
        "labeling_ratio": round(total("batch", "labeling_s") / total("column", "labeling_s"), 4),
        "sharding_ratio": round(total("batch", "sharding_s") / total("column", "sharding_s"), 4),
        "cpu_ratio": round(total("batch", "cpu_s") / total("column", "cpu_s"), 4),
        "export_s_per_1k_rows": round(total("batch", "export_s") / args.repeat / rows * 1000, 4),
        "same_tokens": tokens["column"] == tokens["batch"] and len(tokens["column"]) == 1,
    }


if __name__ == "__main__":
    main()
