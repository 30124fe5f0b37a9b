"""The fault harness's long run: many seeds of tests/support/harness.py, one result file.

    export PYTHONPATH=.:tests/support   # the tests' shared code these use (benchmarks/lib/support.py)
    python -m benchmarks.fault_harness --episodes 2000 --start-seed 0 &          # hours, in the background
    python -m benchmarks.fault_harness --episodes 20 --home folder --out /tmp/f.json

Each seed is one episode (its own home on moto's S3 server or in a folder, its boxes, its
faults) checked for every invariant of tests/support/checker.py. The result file is rewritten after
every episode, so a run stopped at any point leaves a whole, valid file: episodes done, faults
injected per kind, the breaks per invariant, and each failing seed with its breaks and the one
command that replays it. The same object is printed as one JSON line at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks.lib.machine import machine
from benchmarks.lib.results_io import commit_of, emit
from benchmarks.lib.support import support

ROOT = Path(__file__).resolve().parents[1]

#: Episodes between two restarts of moto's server: its memory and request log grow with every one.
SERVER_EPISODES = 50


def _code() -> str:
    """The commit the run tested (``+dirty`` when the tree had changes).

    A copy without its git history (a device machine) names it in SPARKBATCH_CODE.
    """
    if os.environ.get("SPARKBATCH_CODE"):
        return os.environ["SPARKBATCH_CODE"]
    return commit_of(ROOT)


def _child_env() -> dict[str, str]:
    """A worker's environment: this tree (``-m benchmarks...``) and the tests' shared code on its path."""
    path = [str(ROOT), str(ROOT / "tests" / "support"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}


class Server:
    """moto's S3 server, started when an S3 episode needs it and renewed every SERVER_EPISODES."""

    def __init__(self) -> None:
        self.server: Any = None
        self.used = 0

    def get(self) -> Any:
        S3Server = support("s3_server").S3Server

        if self.server is not None and (self.used >= SERVER_EPISODES or self.server.proc.poll() is not None):
            self.stop()
        if self.server is None:
            self.server, self.used = S3Server.start(), 0
        self.used += 1
        return self.server

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            shutil.rmtree(self.server.log_path.parent, ignore_errors=True)
            self.server = None


def run(args: argparse.Namespace) -> dict[str, Any]:
    replay_command = support("harness").replay_command
    run_seed = support("harness").run_seed
    FAULT_KINDS = support("harness_plan").FAULT_KINDS
    make_plan = support("harness_plan").make_plan

    began = time.monotonic()
    result: dict[str, Any] = {
        "benchmark": "fault_harness", "date": datetime.now(timezone.utc).date().isoformat(),
        "machine": machine(cpu_only=True),
        "code": _code(), "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m benchmarks.fault_harness " + " ".join(sys.argv[1:]), "start_seed": args.start_seed,
        "episodes_planned": args.episodes, "episodes": 0, "passed": 0, "homes": {}, "faults": {},
        "invariant_breaks": {}, "failing_seeds": [], "harness_errors": [], "wall_s": 0.0,
    }
    faults, homes, breaks = Counter({k: 0 for k in FAULT_KINDS}), Counter(), Counter()
    server = Server()
    work = Path(tempfile.mkdtemp(prefix="fault-harness-"))
    try:
        for seed in range(args.start_seed, args.start_seed + args.episodes):
            if args.time_limit_s and time.monotonic() - began > args.time_limit_s:
                break  # no new episode past the limit: the file holds every episode run
            home = make_plan(seed, args.home).home
            try:
                verdict = run_seed(seed, args.home, server.get() if home == "s3" else None, work=work)
            except Exception as exc:  # the harness itself failed: say so, and go on with the next seed
                where = [t.strip() for t in traceback.format_tb(exc.__traceback__)][-3:]
                result["harness_errors"].append({"seed": seed, "home": home, "replay": replay_command(seed, home),
                                                 "error": "".join(traceback.format_exception_only(exc)).strip()[-500:],
                                                 "where": where})
                print(f"seed {seed} ({home}): harness error: {exc}", file=sys.stderr, flush=True)
            else:
                faults.update(verdict.faults)
                kinds = sorted({b.invariant for b in verdict.breaks})
                breaks.update(kinds)
                if verdict.ok:
                    result["passed"] += 1
                else:
                    # The events too: on a busy machine a replay may interleave otherwise, and not fail.
                    result["failing_seeds"].append({"seed": seed, "home": home, "invariants": kinds,
                                                    "breaks": [str(b) for b in verdict.breaks[:8]],
                                                    "replay": verdict.replay, "events": verdict.events[-40:]})
                print(f"seed {seed} ({home}): {'pass' if verdict.ok else 'FAIL ' + ','.join(kinds)} in "
                      f"{verdict.wall_s:.0f} s", file=sys.stderr, flush=True)
            homes[home] += 1
            result.update(episodes=result["episodes"] + 1, homes=dict(homes), faults=dict(sorted(faults.items())),
                          invariant_breaks=dict(sorted(breaks.items())), wall_s=round(time.monotonic() - began, 1))
            _write(result, args.out)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return result


def run_parallel(args: argparse.Namespace) -> dict[str, Any]:
    """``--workers`` processes of this script, each a block of consecutive seeds and a part
    file of its own; their parts merged into the one result file, every few seconds and at the end."""
    parts = Path(tempfile.mkdtemp(prefix="fault-harness-parts-"))
    per = -(-args.episodes // args.workers)
    procs, files = [], []
    for w in range(args.workers):
        first = args.start_seed + w * per
        count = min(per, args.start_seed + args.episodes - first)
        if count <= 0:
            break
        files.append(parts / f"part-{w}.json")
        cmd = [sys.executable, "-m", "benchmarks.fault_harness", "--episodes", str(count), "--start-seed", str(first),
               "--out", str(files[-1])]
        cmd += ["--home", args.home] if args.home else []
        cmd += ["--time-limit-s", str(args.time_limit_s)] if args.time_limit_s else []
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env=_child_env()))
    began = time.monotonic()
    while True:
        done = all(p.poll() is not None for p in procs)
        merged = _merge([json.loads(f.read_text()) for f in files if f.exists()], args, time.monotonic() - began)
        if merged is not None:
            _write(merged, args.out)
        if done:
            shutil.rmtree(parts, ignore_errors=True)
            return merged or {}
        time.sleep(5)


def _merge(results: list[dict[str, Any]], args: argparse.Namespace, wall_s: float) -> dict[str, Any] | None:
    """One result from the workers' parts: counts added, failing seeds and errors joined."""
    if not results:
        return None
    out = {**results[0], "command": "python -m benchmarks.fault_harness " + " ".join(sys.argv[1:]),
           "start_seed": args.start_seed, "episodes_planned": args.episodes, "workers": len(results),
           "wall_s": round(wall_s, 1)}
    for key in ("episodes", "passed"):
        out[key] = sum(r[key] for r in results)
    for key in ("homes", "faults", "invariant_breaks"):
        total: Counter[str] = Counter()
        for r in results:
            total.update(r[key])
        out[key] = dict(sorted(total.items()))
    for key in ("failing_seeds", "harness_errors"):
        out[key] = [x for r in results for x in r[key]]
    out["seeds_run"] = [[r["start_seed"], r["start_seed"] + r["episodes"] - 1] for r in results if r["episodes"]]
    return out


def _write(result: dict[str, Any], out: str) -> None:
    """The result so far, whole or not at all (a reader never sees half a file)."""
    path = Path(out)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(result) + "\n")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--episodes", type=int, default=100, help="seeds to run (default 100)")
    parser.add_argument("--start-seed", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument("--home", choices=["s3", "folder"], help="force every episode's home (default: each "
                        "seed's own draw)")
    parser.add_argument("--out", help="result file (default benchmarks/results/fault-harness-cpu-<first>-<last>.json)")
    parser.add_argument("--workers", type=int, default=1, help="episodes at once, each worker a block of seeds "
                        "(default 1; a machine with many cores: about a third of them)")
    parser.add_argument("--time-limit-s", type=float, default=0.0, help="start no episode after this many seconds")
    args = parser.parse_args(argv)
    args.out = args.out or str(ROOT / "benchmarks" / "results" /
                               f"fault-harness-cpu-{args.start_seed}-{args.start_seed + args.episodes - 1}.json")
    result = run_parallel(args) if args.workers > 1 else run(args)
    emit(result, None)  # the file holds the same object, written after each episode


if __name__ == "__main__":
    main()
