"""A reasoning job's thinking bounded two ways on one engine: vLLM's own budget against two requests.

    python -m benchmarks.labels.reasoning_budget --rows 64 --budget 64 --rounds 2 \
        --out benchmarks/results/reasoning-cpu.json

One offline engine of ``testing.reasoning_model()`` (a tiny model with random weights, a
Qwen3-style template, ``<think>`` / ``</think>`` tokens), started with a reasoning parser, labels
the same prompts with ``SamplingSpec(reasoning=budget)``: once with vLLM's ``thinking_token_budget``
(one request a row), once in two requests (``native_budget = False``), A-B / B-A per round after
a warm-up of each. Random weights never end their thinking, so every row thinks the whole budget:
this times the mechanics (the second request's prefill, its extra scheduling), not a real model's
thinking. Reports each way's median seconds, their ratio, the thinking and output tokens, and the
share of rows both ways gave the same label.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.lib.machine import machine
from benchmarks.lib.results_io import emit

ROOT = Path(__file__).resolve().parents[2]

LABELS = ["fruit", "vehicle", "animal"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args()
    from sparkbatch_dagster import OutputSpec, SamplingSpec, VLLMResource
    from sparkbatch_dagster.engines import EngineRequest
    from sparkbatch_dagster.testing import reasoning_model

    output = OutputSpec(kind="label", labels=LABELS)
    sampling = SamplingSpec(reasoning=args.budget, max_tokens=args.budget + 8)
    reqs = [EngineRequest(str(i), [{"role": "user", "content": f"Item {i}: is it a fruit, a vehicle or an animal?"}])
            for i in range(args.rows)]
    with tempfile.TemporaryDirectory() as tmp:
        folder = reasoning_model(Path(tmp) / "qwen3-style")
        res = VLLMResource(model=str(folder), enable_prefix_caching=False, kv_cache_memory_gb=1.0, max_model_len=1024,
                           engine_kwargs={"load_format": "dummy", "reasoning_parser": "deepseek_r1"})
        lazy = res.get_engine()
        try:
            list(lazy.generate(reqs[:1], sampling, output))
            engine = getattr(lazy, "started", None) or lazy  # a lazy engine, or the engine itself
            assert engine.native_budget, "this vLLM has no thinking_token_budget: nothing to compare"

            def timed(native: bool) -> tuple[float, dict[str, object]]:
                engine.native_budget = native
                began = time.perf_counter()
                got = {r.id: r for r in lazy.generate(reqs, sampling, output)}
                return time.perf_counter() - began, got

            for native in (True, False):
                timed(native)  # warm-up
            seconds: dict[str, list[float]] = {"native": [], "two_requests": []}
            answers: dict[str, dict[str, object]] = {}
            for n in range(args.rounds):
                for native in ((True, False) if n % 2 == 0 else (False, True)):
                    name = "native" if native else "two_requests"
                    s, answers[name] = timed(native)
                    seconds[name].append(round(s, 3))
        finally:
            res.shutdown()
    native_res, two_res = answers["native"], answers["two_requests"]
    median = {k: round(statistics.median(v), 3) for k, v in seconds.items()}
    same = sum(native_res[k].text == two_res[k].text for k in native_res)  # type: ignore[attr-defined]
    emit({
        "benchmark": "reasoning", "machine": machine(), "model": "reasoning_model (tiny, random weights)",
        "rows": args.rows, "rounds": args.rounds, "budget": args.budget, "seconds": seconds, "median_s": median,
        "two_requests_over_native": round(median["two_requests"] / median["native"], 3),
        "reasoning_tokens_mean": {k: round(statistics.mean(r.reasoning_tokens for r in v.values()), 2)  # type: ignore[attr-defined]
                                  for k, v in answers.items()},
        "output_tokens": {k: sum(r.output_tokens for r in v.values()) for k, v in answers.items()},  # type: ignore[attr-defined]
        "errors": {k: sum(r.error is not None for r in v.values()) for k, v in answers.items()},  # type: ignore[attr-defined]
        "same_answers_share": round(same / len(native_res), 4),
    }, args.out)


if __name__ == "__main__":
    main()
