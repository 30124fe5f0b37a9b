"""Where an arm's time goes, seen from the process that drives vLLM (``throughput.py --trace``).

vLLM's engine core runs in its own process; this process adds requests, calls
``llm_engine.step()`` (which waits for the core's next outputs) and does its own work between
calls. Per arm this records:

- ``steps``, ``in_step_s`` (waiting on the core) and ``between_steps_s`` (this process's own
  work between two calls: rendering, tokenizing, writing rows, Dagster), and the longest gaps;
- ``main_cpu_s``: CPU time of this process (all its threads) over the arm: near ``wall_s``
  means this process, not the GPU, set the pace;
- ``first_output_s`` / ``last_output_s``: when the first and the last results came, from the
  arm's start (before the first: rendering and prefill; after the last: finalize, Dagster);
- ``finished_by_decile``: requests finished in each tenth of the arm's wall time (a batch that
  drains early shows as a thin tail);
- ``first_step_s`` and ``start_by_second``: when the first ``step()`` call came, and for each of
  the arm's first ``START_SECONDS`` seconds the step calls and finished requests in it;
- ``first_request_s`` / ``last_request_s``: when this process handed the engine its first and its
  last request. The engine starts at the first request, not at the first ``step()`` call (raw
  ``LLM.chat`` calls ``step()`` only after adding every prompt): time the engine from here;
- ``occupancy_by_second``: batch occupancy over the arm, from the scheduler's own numbers that
  come with each engine step's outputs (with stats on): per second of the arm, the mean requests
  running and waiting and the mean KV-cache use (a batch below ``max_num_seqs`` while requests
  wait, or no requests waiting while the batch drains, shows here);
- from vLLM's own metrics when it keeps them (``disable_log_stats=False``): engine steps,
  tokens per step (``iteration_tokens``) and preemptions over the arm.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any

#: Seconds from an arm's start that ``start_by_second`` covers.
START_SECONDS = 20

#: vLLM metrics read before and after an arm: the delta is the arm's.
METRICS = ("vllm:iteration_tokens_total", "vllm:num_preemptions", "vllm:prompt_tokens", "vllm:generation_tokens",
           "vllm:prefix_cache_hits", "vllm:prefix_cache_queries")


def _metrics(llm: Any) -> dict[str, float]:
    get = getattr(llm, "get_metrics", None)
    if get is None:
        return {}
    out: dict[str, float] = {}
    try:
        for m in get():
            if m.name not in METRICS:
                continue
            if hasattr(m, "count"):  # a histogram: how many observations and their sum
                out[m.name + ":count"] = out.get(m.name + ":count", 0) + m.count
                out[m.name + ":sum"] = out.get(m.name + ":sum", 0) + m.sum
            else:
                out[m.name] = out.get(m.name, 0) + getattr(m, "value", 0)
    except Exception:  # noqa: BLE001 - metrics are a bonus; the timings stand alone
        return {}
    return out


@contextmanager
def trace(llm: Any, enabled: bool = True) -> Any:
    """Time ``llm.llm_engine.step`` calls while the block runs; yields a dict filled at exit."""
    summary: dict[str, Any] = {}
    if not enabled:
        yield summary
        return
    engine = llm.llm_engine
    calls: list[tuple[float, float, int]] = []  # (start, end, finished requests)
    adds: list[float] = []
    sched: list[tuple[float, int, int, float]] = []  # (time, running, waiting, KV-cache use)
    original, original_add = engine.step, engine.add_request
    core = engine.engine_core
    original_get = getattr(core, "get_output", None)

    def step() -> Any:
        t0 = time.perf_counter()
        outputs = original()
        calls.append((t0, time.perf_counter(), sum(1 for o in outputs if o.finished)))
        return outputs

    def add_request(*args: Any, **kwargs: Any) -> Any:
        adds.append(time.perf_counter())
        return original_add(*args, **kwargs)

    def get_output() -> Any:
        out = original_get()  # type: ignore[misc]
        if (stats := getattr(out, "scheduler_stats", None)) is not None:
            sched.append((time.perf_counter(), stats.num_running_reqs, stats.num_waiting_reqs,
                          float(getattr(stats, "kv_cache_usage", 0.0))))
        return out

    before = _metrics(llm)
    cpu0, t_start = time.process_time(), time.perf_counter()
    engine.step, engine.add_request = step, add_request
    if original_get is not None:
        core.get_output = get_output
    try:
        yield summary
    finally:
        engine.step, engine.add_request = original, original_add
        if original_get is not None:
            del core.get_output  # the instance attribute goes; the class's method shows again
        wall = time.perf_counter() - t_start
        summary.update(_summarize(calls, t_start, wall, time.process_time() - cpu0))
        summary["first_request_s"] = round(adds[0] - t_start, 3) if adds else None
        summary["last_request_s"] = round(adds[-1] - t_start, 3) if adds else None
        summary["occupancy_by_second"] = _occupancy(sched, t_start)
        after = _metrics(llm)
        delta = {k: round(after[k] - before.get(k, 0), 3) for k in after}
        if delta:
            steps = delta.get("vllm:iteration_tokens_total:count")
            summary["vllm"] = {**delta, **({"tokens_per_step": round(
                delta["vllm:iteration_tokens_total:sum"] / steps, 1)} if steps else {})}


def _summarize(calls: list[tuple[float, float, int]], t_start: float, wall: float, cpu: float) -> dict[str, Any]:
    in_step = sum(b - a for a, b, _ in calls)
    gaps = sorted((calls[i + 1][0] - calls[i][1] for i in range(len(calls) - 1)), reverse=True)
    with_output = [b for _, b, n in calls if n]
    deciles = [0] * 10
    start = [[0, 0] for _ in range(START_SECONDS)]  # [step calls, finished requests] per second
    for _, b, n in calls:
        deciles[min(9, int((b - t_start) / wall * 10))] += n
        if (second := int(b - t_start)) < START_SECONDS:
            start[second][0] += 1
            start[second][1] += n
    return {
        "wall_s": round(wall, 3), "steps": len(calls), "in_step_s": round(in_step, 3),
        "between_steps_s": round(sum(gaps), 3), "longest_gaps_s": [round(g, 3) for g in gaps[:5]],
        "main_cpu_s": round(cpu, 3),
        "first_output_s": round(with_output[0] - t_start, 3) if with_output else None,
        "last_output_s": round(with_output[-1] - t_start, 3) if with_output else None,
        "finished_by_decile": deciles,
        "first_step_s": round(calls[0][0] - t_start, 3) if calls else None,
        "start_by_second": start,
    }


def _occupancy(sched: list[tuple[float, int, int, float]], t_start: float) -> list[list[float]]:
    """Per second of the arm: [mean running, mean waiting, mean KV-cache use] over its engine steps."""
    seconds: dict[int, list[tuple[int, int, float]]] = {}
    for t, running, waiting, kv in sched:
        seconds.setdefault(int(t - t_start), []).append((running, waiting, kv))
    out = []
    for second in range(max(seconds) + 1 if seconds else 0):
        got = seconds.get(second, [])
        n = len(got) or 1
        out.append([round(sum(g[0] for g in got) / n, 1), round(sum(g[1] for g in got) / n, 1),
                    round(sum(g[2] for g in got) / n, 3)])
    return out
