"""What a `sparkbatch` command costs on its own: `run` and `status` as fresh processes, with an engine
that answers at once (``FakeVLLMResource``), so what is timed is the command (Python, Dagster, the
job's home), not a model.

    python -m benchmarks.cli_cost --rounds 5 --before 540c42d --out benchmarks/results/cpu-cli-cost.json

Each round gives every side a new job home and Dagster home, then times ``sparkbatch run`` (90 rows,
3 shards, a gold column: shards, labels, metrics, analytics and the review queue) and ``sparkbatch
status`` after it, wall and CPU (user + system, the process and its children). ``--before REF``
times this repository's commit REF the same way, in the same rounds, the order alternating (A-B,
B-A). The e2e tests run hundreds of these commands, and a user pays the same seconds at every
command's start and end: ``before_over_now`` above 1 means the new code costs less.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.lib.machine import machine
from benchmarks.lib.results_io import commit_of, emit

ROOT = Path(__file__).resolve().parents[1]
LABELS = ("fruit", "vehicle", "animal")
DEFS = """
from dagster import Definitions
from sparkbatch_dagster import JobSpec, OutputSpec, build_batch_assets
from sparkbatch_dagster.testing import FakeVLLMResource
spec = JobSpec(name="things", input={src!r}, id_column="id", text_columns=["text"],
               system_prompt="Answer with one word.", user_template="What is this? {{{{ text }}}}",
               output=OutputSpec(kind="label", labels={labels!r}), shard_count=3, gold_column="gold",
               home={home!r})
job = build_batch_assets(spec=spec)
defs = Definitions(assets=job.assets, resources={{"vllm": FakeVLLMResource()}})
"""


def write_input(folder: Path, rows: int) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = folder / "rows.parquet"
    pq.write_table(pa.Table.from_pylist([{"id": f"id-{i:05d}", "text": f"Item {i}: a thing seen on day {i % 11}.",
                                          "gold": LABELS[i % 3]} for i in range(rows)]), path)
    return path


def timed(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, str]:
    """Wall and CPU seconds of one command (its children's CPU included), and its stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)}: {proc.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.stdout


def one_side(code: Path, src: Path, work: Path) -> dict[str, float]:
    """``sparkbatch run`` then ``status`` of ``code``'s package, in a new job home and Dagster home."""
    shutil.rmtree(work, ignore_errors=True)
    (work / "dagster").mkdir(parents=True)
    defs = work / "defs.py"
    defs.write_text(DEFS.format(src=str(src), labels=list(LABELS), home=str(work / "home")))
    env = {**os.environ, "PYTHONPATH": str(code), "DAGSTER_HOME": str(work / "dagster")}
    cli = [sys.executable, "-m", "sparkbatch_dagster.cli"]
    run_wall, run_cpu, out = timed([*cli, "run", "-f", str(defs)], env, work)
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["success"] and summary["generated"] > 0, summary
    status_wall, status_cpu, _ = timed([*cli, "status", "-f", str(defs)], env, work)
    return {"run_wall_s": round(run_wall, 3), "run_cpu_s": round(run_cpu, 3), "status_wall_s": round(status_wall, 3),
            "status_cpu_s": round(status_cpu, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rows", type=int, default=90)
    ap.add_argument("--before", help="also time this commit of the repository (git archive), same rounds")
    ap.add_argument("--out", help="write the result here too (benchmarks/results/...)")
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="sparkbatch-cli-cost-"))
    try:
        sides = {"now": ROOT}
        if args.before:
            sides["before"] = scratch / "before"
            sides["before"].mkdir()
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.before], capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", str(sides["before"])], input=archive.stdout, check=True)
        src = write_input(scratch, args.rows)
        got: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
        names = list(sides)
        for r in range(args.rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                got[name].append(one_side(sides[name], src, scratch / f"work-{name}"))
                print(json.dumps({"round": r, "side": name, **got[name][-1]}), file=sys.stderr)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result: dict = {"benchmark": "cli_cost", "machine": machine(cpu_only=True), "code": commit_of(ROOT),
                    "rows": args.rows, "rounds": args.rounds, "command": " ".join(["python -m benchmarks.cli_cost",
                                                                                  *sys.argv[1:]])}
    for name, runs in got.items():
        result[name] = {k: [r[k] for r in runs] for k in runs[0]}
        result[f"{name}_median"] = {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]}
    if args.before:
        result["before_commit"] = args.before
        result["before_over_now"] = {k: round(sum(result["before"][k]) / sum(result["now"][k]), 3)
                                     for k in result["now"]}
    emit(result, args.out)


if __name__ == "__main__":
    main()
