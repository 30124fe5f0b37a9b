"""The pipeline on 1 GPU and on N GPUs (``VLLMResource.data_parallel_size``), same rows, one invocation.

On the 2-GPU H200 host, as for h200.sh (``.gpu/common`` and ``.bench`` carried, see
../shared/gpu/README.md), one call per shape:

    BENCH=data_parallel REPEAT=1 bash benchmarks/runners/h200.sh 1b 24000 64 synthetic --gpus 2    # about 5 min
    BENCH=data_parallel REPEAT=1 bash benchmarks/runners/h200.sh 8b 10000 128 synthetic --gpus 2 --restart  # 5 min

(result in ``$OUT/result-<shape>-synthetic-data_parallel.json``; rows enough that the 2-GPU arm
runs some 40 s, so a second of run start and batch tail does not decide the ratio; ``--restart``
gives each engine a whole GPU, as a user's run has it: kept warm at 0.45 of a GPU, the 8B shape's
1-GPU arm ran slower than a whole-GPU engine and the ratio came out at 2.22x). Directly:

    python -m benchmarks.gpu.data_parallel --model /tmp/llama-1b --load-format dummy --gpu --rows 32000 \
        --max-tokens 64 --repeat 2 --gpus 2 --out benchmarks/results/h200x2-1b-data-parallel.json
    python -m benchmarks.gpu.data_parallel --rows 60 --max-tokens 4 --repeat 1 --gpus 2   # CPU smoke test

Two resources, ``data_parallel_size=1`` (the in-process engine of every single-GPU run) and
``data_parallel_size=N`` (N worker engines), both started once before the rounds and kept warm:
each engine takes ``--memory`` of its GPU (default 0.45: the 1-GPU engine and the first of the N
share GPU 0; ``--restart`` instead starts each arm's engines in its round, untimed, at 0.9).
Each round materializes every partition of ``labeled_outputs`` once per arm (a fresh job home
each, prefix caches reset first), in A-B / B-A order. Tokens/s = the tokens the run's
partitions report / the run's wall time; ``speedup`` = the median over rounds of N-GPU tokens/s
over 1-GPU tokens/s (``speedup_labeling``: the same over the runner's own labeling time, Dagster's
run start and end left out). The last line is one JSON object (``--out`` also writes it).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.lib.machine import machine
from benchmarks.lib.results_io import emit
from benchmarks.lib.workload import arg_parser, build_spec, shape_of, vllm_version
from sparkbatch_dagster import VLLMResource, build_batch_assets
from sparkbatch_dagster.engines.settings import on_cpu, visible_gpus


def reset_prefix_cache(engine: Any) -> None:
    if getattr(engine, "_llm", None) is not None:  # the in-process engine
        engine._llm.reset_prefix_cache()
    elif hasattr(engine, "reset_prefix_cache"):  # DataParallelEngine: every worker's
        engine.reset_prefix_cache()


def main() -> None:
    p = arg_parser(__doc__, mode="synthetic", rows=4000)
    p.add_argument("--repeat", "--rounds", dest="repeat", type=int, default=2, help="rounds (A-B / B-A order)")
    p.add_argument("--gpus", type=int, default=None,
                   help="engines of the N-GPU arm (data_parallel_size); default: every visible GPU (2 on the CPU)")
    p.add_argument("--memory", type=float, default=None,
                   help="gpu_memory_utilization of every engine: default 0.45 on a GPU (0.9 with --restart)")
    p.add_argument("--restart", action="store_true",
                   help="start each arm's engines in its round (untimed) and stop them after: 0.9 of every GPU each")
    p.add_argument("--kv-cache-gb", type=float, default=None, help="KV cache per engine (default on the CPU: 0.5)")
    p.add_argument("--out", default=None, help="also write the result object to this file (benchmarks/results/...)")
    args = p.parse_args()

    from dagster import DagsterInstance, materialize

    home = Path(args.home or tempfile.mkdtemp(prefix="sparkbatch-dp-bench-"))
    os.environ.setdefault("DAGSTER_HOME", str(home / "dagster_home"))
    Path(os.environ["DAGSTER_HOME"]).mkdir(parents=True, exist_ok=True)
    spec = build_spec(args, home)
    cpu = on_cpu()
    gpus = args.gpus or (2 if cpu else len(visible_gpus()))
    kw: dict[str, Any] = {"model": args.model, "max_model_len": 2048, "keep_warm": True,
                          "max_num_seqs": args.max_num_seqs or (1024 if args.gpu else 256)}
    if args.load_format:
        kw["engine_kwargs"] = {"load_format": args.load_format}
    if cpu or args.kv_cache_gb:
        kw["kv_cache_memory_gb"] = args.kv_cache_gb or 0.5
    else:
        kw["gpu_memory_utilization"] = args.memory or (0.9 if args.restart else 0.45)
    arms = {"single": VLLMResource(**kw, data_parallel_size=1), "parallel": VLLMResource(**kw, data_parallel_size=gpus)}
    inst = DagsterInstance.get()
    starts: dict[str, list[float]] = {"single": [], "parallel": []}

    def start(arm: str) -> Any:
        t = time.perf_counter()
        engine = arms[arm].get_engine()
        starts[arm].append(round(time.perf_counter() - t, 1))
        print(f"{arm}: engine ready in {starts[arm][-1]} s", file=sys.stderr, flush=True)
        return engine

    if not args.restart:  # the 1-GPU engine first: vLLM checks free memory as each one starts
        for arm in arms:
            start(arm)

    def run(arm: str, n: int) -> dict[str, Any]:
        engine = start(arm) if args.restart else arms[arm].get_engine()
        round_spec = spec.model_copy(update={"home": str(home / f"round{n}-{arm}")})
        job = build_batch_assets(spec=round_spec)
        res = {"vllm": arms[arm]}
        materialize([job.assets[0]], resources=res, instance=inst)  # sharding: untimed
        keys = sorted(inst.get_dynamic_partitions(str(job.partitions_def.name)))
        reset_prefix_cache(engine)
        tags = {"dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]}
        t = time.perf_counter()
        result = materialize([job.assets[1]], resources=res, instance=inst, tags=tags)
        seconds = time.perf_counter() - t
        if args.restart:
            arms[arm].shutdown()
        mds = [m.metadata for m in result.asset_materializations_for_node("bench__labeled_outputs")]

        def total(name: str) -> Any:
            return sum(md[name].value for md in mds)

        assert total("rows") == args.rows or args.mode == "debian", "the pipeline lost rows"
        tokens = total("input_tokens") + total("output_tokens")
        return {"s": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds, "labeling_s": total("wall_s"),
                "errors": total("errors"), "shards": len(keys), "rows": total("rows")}

    rounds: list[dict[str, dict[str, Any]]] = []
    for n in range(args.repeat):
        order = ["single", "parallel"] if n % 2 == 0 else ["parallel", "single"]
        rounds.append({arm: run(arm, n) for arm in order})
        one, many = rounds[-1]["single"], rounds[-1]["parallel"]
        ratio = many["tokens_per_s"] / one["tokens_per_s"]
        print(f"round {n}: 1 GPU {one['tokens_per_s']:.0f} tokens/s ({one['s']:.1f} s), {gpus} GPUs "
              f"{many['tokens_per_s']:.0f} tokens/s ({many['s']:.1f} s): x{ratio:.3f}", file=sys.stderr, flush=True)
    model_id = arms["single"].model_identity()
    for res in arms.values():
        res.shutdown()
    emit(summarize(args, rounds, gpus=gpus, model_id=model_id, starts=starts, memory=kw.get("gpu_memory_utilization"),
                   max_tokens=spec.sampling.max_tokens), args.out)


def summarize(args: Any, rounds: list[dict[str, dict[str, Any]]], *, gpus: int, model_id: str,
              starts: dict[str, list[float]], memory: float | None, max_tokens: int) -> dict[str, Any]:
    """The result object: per round and arm the wall time and tokens/s, and their ratio."""

    def per(arm: str, key: str, digits: int = 2) -> list[float]:
        return [round(r[arm][key], digits) for r in rounds]

    speedups = [r["parallel"]["tokens_per_s"] / r["single"]["tokens_per_s"] for r in rounds]
    return {
        "benchmark": "data_parallel", "mode": args.mode, "model": model_id, "shape": shape_of(model_id),
        "load_format": args.load_format or "auto", "vllm": vllm_version(), "machine": machine(),
        "rows": rounds[0]["single"]["rows"], "shards": rounds[0]["single"]["shards"], "max_tokens": max_tokens,
        "rounds": len(rounds), "gpus": gpus, "gpu_memory_utilization": memory, "restart": args.restart,
        "engine_start_s": starts, "tokens": rounds[0]["single"]["tokens"],
        "single_s": per("single", "s"), "parallel_s": per("parallel", "s"),
        "single_tokens_per_s": per("single", "tokens_per_s", 1),
        "parallel_tokens_per_s": per("parallel", "tokens_per_s", 1),
        "single_labeling_s": per("single", "labeling_s"), "parallel_labeling_s": per("parallel", "labeling_s"),
        "errors": {arm: [r[arm]["errors"] for r in rounds] for arm in ("single", "parallel")},
        "speedup_by_round": [round(s, 4) for s in speedups], "speedup": round(statistics.median(speedups), 4),
        "speedup_labeling": round(statistics.median(
            r["single"]["labeling_s"] / r["parallel"]["labeling_s"] for r in rounds), 4),
    }


if __name__ == "__main__":
    main()
