"""What a forked engine core pays for the heap it inherits, frozen or not (issue 61).

    python -m benchmarks.engine.fork_heap --rounds 4 --out benchmarks/results/cpu-fork-heap.json

vLLM forks its engine core from the process that calls ``vllm.LLM(...)`` and freezes the core's
heap only once its start is over (weights, compile, CUDA graphs). Until then every full collection
in the core walks what it inherited, and writing each object's collector fields copies its page.
`sparkbatch run` forks from a process holding Dagster, DuckDB and the run's objects; a plain vLLM
script from one holding vLLM alone. ``engines/offline/llm_start.py`` freezes the heap around
``LLM(...)`` (``gc.freeze``), so the core's collections skip the inherited objects.

Here the parent imports what `sparkbatch run` holds when it starts the engine (Dagster and its
instance, DuckDB, Arrow, the CLI, vLLM), then forks a child that does Python-heavy work that keeps
part of what it allocates, as Dynamo's bytecode transform and the graph capture do: 60 rounds of
20,000 small objects, one in ten kept. Each round forks one child with the heap frozen and one
without, the order alternating; the child's own seconds and full collections are reported. No GPU:
this measures the mechanism, not a start.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.lib.machine import machine
from benchmarks.lib.results_io import commit_of, emit

ROOT = Path(__file__).resolve().parents[2]


def child_work() -> dict[str, float]:
    t0 = time.perf_counter()
    kept: list[Any] = []
    for i in range(60):
        made = [{"a": [i, (j, str(j))], "b": object()} for j in range(20_000)]
        kept.append(made[::10])
    return {"seconds": round(time.perf_counter() - t0, 3), "full_collections": gc.get_stats()[2]["collections"]}


def forked(frozen: bool) -> dict[str, float]:
    """One child's work, forked from this process with its heap frozen or not."""
    if frozen:
        gc.freeze()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: work, report, leave without Python's exit
        os.close(read)
        os.write(write, json.dumps(child_work()).encode())
        os._exit(0)
    if frozen:
        gc.unfreeze()
    os.close(write)
    with os.fdopen(read) as pipe:
        got = json.loads(pipe.read())
    os.waitpid(pid, 0)
    return dict(got)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", help="write the result here too (benchmarks/results/...)")
    args = ap.parse_args()
    import dagster  # noqa: F401  what `sparkbatch run` holds when it starts the engine
    import duckdb  # noqa: F401
    import pyarrow  # noqa: F401
    import vllm  # noqa: F401
    from dagster import DagsterInstance

    import sparkbatch_dagster.cli.commands  # noqa: F401

    DagsterInstance.ephemeral()
    gc.collect()
    objects = len(gc.get_objects())
    arms: dict[str, list[dict[str, float]]] = {"frozen": [], "unfrozen": []}
    for r in range(args.rounds):
        for arm in ("frozen", "unfrozen") if r % 2 == 0 else ("unfrozen", "frozen"):
            arms[arm].append(forked(arm == "frozen"))
            print(json.dumps({"round": r, "arm": arm, **arms[arm][-1]}), file=sys.stderr)
    seconds = {arm: [x["seconds"] for x in runs] for arm, runs in arms.items()}
    emit({"benchmark": "fork_heap", "machine": machine(cpu_only=True), "code": commit_of(ROOT), "rounds": args.rounds,
        "parent_objects": objects, "frozen_s": seconds["frozen"], "unfrozen_s": seconds["unfrozen"],
        "frozen_full_collections": [x["full_collections"] for x in arms["frozen"]],
        "unfrozen_full_collections": [x["full_collections"] for x in arms["unfrozen"]],
        "unfrozen_over_frozen": round(statistics.median(seconds["unfrozen"]) / statistics.median(seconds["frozen"]), 3),
        "command": " ".join(["python -m benchmarks.engine.fork_heap", *sys.argv[1:]])}, args.out)


if __name__ == "__main__":
    main()
