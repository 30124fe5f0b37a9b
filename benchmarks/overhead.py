"""The pipeline's fixed cost per run, measured with an engine that costs nothing.

    python -m benchmarks.overhead                          # 4,000 x 8 shards, the 8B benchmark's job
    python -m benchmarks.overhead --before 2e666d9 --rounds 4 --out benchmarks/results/cpu-overhead.json

On an H200 the engine does the same work in the pipeline as in raw vLLM (``throughput.py
--trace``: the same steps, the same tokens per step); what separates them is this process's
serial work before the first request reaches the engine and after the last answer leaves it.
Here the engine is ``FakeEngine`` (answers at once), so each pipeline round (a Dagster run of
``labeled_outputs`` over every partition, then one of ``run_metrics``, as ``throughput.py``
times it) splits into:

* ``run_start_s``: from the call until the labeling step hands the engine its request stream
  (Dagster creates the run, logs its planned partitions, starts the step, inits resources; then
  the step's own preparation, ``step_prep_s``: the model identity, the job's state);
* ``first_shard_s``: until the engine gets its first request (the first shard read, rendered and
  looked up in the result store);
* ``middle_s``: first request to last answer (the per-row work; on a GPU it overlaps the engine);
* ``last_commit_s``: last answer to the end of the labeling run (the last shard's commit and
  events, the step's and run's end);
* ``metrics_run_s``: the ``run_metrics`` run, start to end (``metrics_own_s`` of it: updating
  ``metrics.duckdb``).

``to_first_request_s`` and ``tail_s`` sum the two ends: serial work before the engine starts and
after it is done, the pipeline's fixed cost per run whatever the engine.

``--before REF`` times this repository's commit REF in the same rounds, alternating A-B / B-A,
each side in its own process (one warm-up round each, as the H200 benchmark keeps one process).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.lib.machine import machine
from benchmarks.lib.results_io import emit

ROOT = Path(__file__).resolve().parents[1]

PARTS = ("run_start_s", "step_prep_s", "first_shard_s", "metrics_own_s", "middle_s", "last_commit_s",
         "metrics_run_s", "to_first_request_s", "tail_s", "total_s")


def worker(rows: int, shards: int, rounds: int) -> list[dict[str, float]]:
    """Rounds of the pipeline with an instant engine, in this process (the code on sys.path)."""
    from dagster import DagsterInstance, materialize

    from benchmarks.lib.workload import build_spec
    from sparkbatch_dagster import build_batch_assets
    from sparkbatch_dagster.definitions import job as job_module
    from sparkbatch_dagster.engines.fake import FakeEngine
    from sparkbatch_dagster.run import metrics, runner
    from sparkbatch_dagster.testing import FakeVLLMResource

    marks: dict[str, float] = {}

    class Timed(FakeEngine):
        def generate(self, requests, sampling, output):  # type: ignore[no-untyped-def]

            def watched():  # type: ignore[no-untyped-def]
                for req in requests:
                    marks.setdefault("first_request", time.perf_counter())
                    yield req

            for res in super().generate(watched(), sampling, output):
                yield res
                marks["last_answer"] = time.perf_counter()

    # When the step starts labeling (ShardRun's generation loop begins: the first shard is read next).
    generation = runner.ShardRun._generate

    def marked(self, keys):  # type: ignore[no-untyped-def]
        marks.setdefault("stream", time.perf_counter())
        yield from generation(self, keys)

    runner.ShardRun._generate = marked  # type: ignore[method-assign]
    # When the labeling step's own code starts (its first call), and the run_metrics step's own work.
    check_partitions = job_module.BatchJob.check_partitions

    def body_starts(self, keys):  # type: ignore[no-untyped-def]
        marks.setdefault("body", time.perf_counter())
        return check_partitions(self, keys)

    job_module.BatchJob.check_partitions = body_starts  # type: ignore[method-assign]
    sync = metrics.sync

    def timed_sync(*a, **kw):  # type: ignore[no-untyped-def]
        began = time.perf_counter()
        try:
            return sync(*a, **kw)
        finally:
            marks["metrics_own"] = marks.get("metrics_own", 0.0) + time.perf_counter() - began

    metrics.sync = timed_sync

    class TimedResource(FakeVLLMResource):
        def _start(self):  # type: ignore[no-untyped-def]
            return Timed(model_id=self.model_name())

    home = Path(tempfile.mkdtemp(prefix="sparkbatch-overhead-"))
    os.environ["DAGSTER_HOME"] = str(home / "dagster_home")
    Path(os.environ["DAGSTER_HOME"]).mkdir(parents=True)
    args = argparse.Namespace(mode="synthetic", rows=rows, max_tokens=128, shards=shards)
    spec = build_spec(args, home)
    res = {"vllm": TimedResource(keep_warm=True)}
    inst = DagsterInstance.get()
    out = []
    for n in range(rounds + 1):  # round 0 warms up imports and caches, as the long benchmark process is
        job = build_batch_assets(spec=spec.model_copy(update={"home": str(home / f"round-{n}")}))
        materialize(job.assets, selection=[job.keys["input_shards"]], resources=res, instance=inst)
        keys = inst.get_dynamic_partitions(job.partitions_def.name)
        tags = {"dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]}
        marks.clear()
        t0 = time.perf_counter()
        materialize(job.assets, selection=[job.keys["labeled_outputs"]], resources=res, instance=inst, tags=tags)
        labeled = time.perf_counter()
        materialize(job.assets, selection=[job.keys["run_metrics"]], resources=res, instance=inst, tags=tags)
        t1 = time.perf_counter()
        if n:
            out.append({"run_start_s": marks["stream"] - t0, "step_prep_s": marks["stream"] - marks["body"],
                        "first_shard_s": marks["first_request"] - marks["stream"],
                        "metrics_own_s": marks["metrics_own"],
                        "middle_s": marks["last_answer"] - marks["first_request"],
                        "last_commit_s": labeled - marks["last_answer"], "metrics_run_s": t1 - labeled,
                        "to_first_request_s": marks["first_request"] - t0,
                        "tail_s": t1 - marks["last_answer"], "total_s": t1 - t0})
    return out


def _checkout(ref: str) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="sparkbatch-before-"))
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(folder), ref],
                   check=True, capture_output=True)
    return folder


def _side(code: Path, args: argparse.Namespace) -> list[dict[str, float]]:
    # ``code`` first: its sparkbatch_dagster (and its benchmarks package, where it has one) is the one timed;
    # this tree after it, for an older commit's namespace-only benchmarks/ folder.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(code), str(ROOT)])}
    cmd = [sys.executable, str(code / "benchmarks" / "overhead.py"), "--worker", "--rows", str(args.rows),
           "--shards", str(args.shards), "--rounds", "1"]
    if not (code / "benchmarks" / "overhead.py").exists():  # an older commit: run this script on its code
        cmd[1] = str(Path(__file__).resolve())
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{code}: {done.stderr[-2000:]}")
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--rows", type=int, default=4000)
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--rounds", type=int, default=4, help="A-B / B-A rounds (each side: a process per round)")
    p.add_argument("--before", default=None, help="also time this commit of the repository, same rounds")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(args.rows, args.shards, args.rounds)))
        return
    sides = {"now": ROOT}
    if args.before:
        sides["before"] = _checkout(args.before)
    got: dict[str, list[dict[str, float]]] = {s: [] for s in sides}
    try:
        for n in range(args.rounds):
            order = list(sides) if n % 2 == 0 else list(sides)[::-1]
            for side in order:
                got[side] += _side(sides[side], args)
                print(f"round {n} {side}: {json.dumps({k: round(v, 3) for k, v in got[side][-1].items()})}",
                      file=sys.stderr, flush=True)
    finally:
        if "before" in sides:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(sides["before"])],
                           check=False, capture_output=True)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    result: dict[str, Any] = {"benchmark": "overhead", "rows": args.rows, "shards": args.shards,
                              "rounds": args.rounds, "engine": "FakeEngine (answers at once)",
                              "machine": machine(cpu_only=True),
                              "commit": head.stdout.strip(), "before_commit": args.before}
    for side, runs in got.items():
        result[side] = {k: round(statistics.median(r[k] for r in runs), 3) for k in PARTS}
        result[f"{side}_rounds"] = [{k: round(v, 3) for k, v in r.items()} for r in runs]
    if args.before:
        result["fixed_cost_ratio"] = {  # before / now: above 1, the new code pays less
            k: round(result["before"][k] / result["now"][k], 3) for k in ("to_first_request_s", "tail_s")}
    emit(result, args.out)


if __name__ == "__main__":
    main()
