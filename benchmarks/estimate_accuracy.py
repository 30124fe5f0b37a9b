"""Estimate vs reality on the demo job: `sparkbatch estimate`, then `sparkbatch run`, as a user
types them (each its own process and engine start), in a fresh job home.

    python benchmarks/estimate_accuracy.py                   # the demo: 2000 rows, 8 shards
    python benchmarks/estimate_accuracy.py --rows 4000 --sample-rows 100

Prints the estimate's advice, then one JSON line: predicted vs measured generation time (engine
start excluded on both sides, and reported apart), the error in percent, and the run's numbers.
Target (issue 5): |error_pct| <= 10.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def sparkbatch(env: dict[str, str], *args: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "sparkbatch_dagster.cli", *args, "-f", "definitions.py"],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"sparkbatch {args[0]} failed:\n{proc.stderr[-4000:]}")
    for line in proc.stderr.splitlines():
        if line.startswith("sparkbatch: "):
            print(line, file=sys.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--sample-rows", type=int, default=None, help="default: the spec's (80)")
    p.add_argument("--models", default=None, help="also compare these models, e.g. gemma-3-270m")
    p.add_argument("--home", default=None)
    args = p.parse_args()

    home = Path(args.home or tempfile.mkdtemp(prefix="sparkbatch-estimate-"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPARKBATCH_HOME": str(home / "job"),
           "DAGSTER_HOME": str(home / "dagster_home"), "SPARKBATCH_DEMO_ROWS": str(args.rows),
           "SPARKBATCH_DEMO_SHARDS": str(args.shards)}
    Path(env["DAGSTER_HOME"]).mkdir(parents=True, exist_ok=True)
    extra = [*(["--sample-rows", str(args.sample_rows)] if args.sample_rows else []),
             *(["--models", args.models] if args.models else [])]
    t = time.perf_counter()
    est = sparkbatch(env, "estimate", *extra)
    estimate_s = time.perf_counter() - t
    t = time.perf_counter()
    run = sparkbatch(env, "run")
    run_s = time.perf_counter() - t
    actual = run["wall_s"]
    print(json.dumps({
        "rows": run["rows"], "sample_rows": est["sample_rows"], "model": est["model"],
        "predicted_wall_s": est["predicted_wall_s"], "actual_wall_s": actual,
        "error_pct": round((est["predicted_wall_s"] - actual) / actual * 100, 1),
        "run_reported_error_pct": run.get("prediction_error_pct"),
        "predicted_tokens_per_hour": est["predicted_tokens_per_hour"], "actual_tokens_per_hour": run["tokens_per_hour"],
        "estimate_engine_start_s": est["engine_start_s"], "estimate_command_s": round(estimate_s, 1),
        "run_command_s": round(run_s, 1), "options": est["options"], "chosen_model": est["chosen_model"],
        "models": est["models"], "chart": est["chart"],
    }))


if __name__ == "__main__":
    main()
