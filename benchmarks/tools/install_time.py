"""A fresh install, timed: `make install` (then `make label-studio` or `make check`) in a fresh clone, as a
newcomer runs it.

    python -m benchmarks.tools.install_time --rev HEAD --out benchmarks/results/install-cpu-uv-lock.json
    python -m benchmarks.tools.install_time --rev 5c2a0b7 --out ...      # the Makefile before the locks (pip)
    python -m benchmarks.tools.install_time --cold ...                   # pip's and uv's caches empty too
    python -m benchmarks.tools.install_time --target check ...           # then make check, no font or mypy cache

The clone lives in a temporary folder (the working checkout's venvs are never touched) and is
removed after. ``--cold`` gives pip and uv empty cache folders, a machine that never installed
anything; without it they use this user's caches, as a second checkout on the same machine does.
The load average before and after is in the file: other work on the machine slows an install.
``--target check`` runs ``make check`` after the install with an empty ``MPLCONFIGDIR`` (matplotlib
has no font cache, as on a new machine) and no mypy or pytest cache (a fresh clone has none).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.lib.machine import machine
from benchmarks.lib.results_io import emit

ROOT = Path(__file__).resolve().parents[2]


def installer(clone: Path) -> str:
    """uv (from a lock) when the clone's Makefile installs with uv, else pip (resolving)."""
    return "uv-lock" if "uv pip sync" in (clone / "Makefile").read_text() else "pip-resolve"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rev", default="HEAD", help="the commit whose Makefile installs (default HEAD)")
    ap.add_argument("--target", default="install", choices=["install", "label-studio", "check"])
    ap.add_argument("--cold", action="store_true", help="empty pip and uv caches")
    ap.add_argument("--ignore-errors", action="store_true",
                    help="make -i: every step of make check runs (and is timed) past a failing one")
    ap.add_argument("--out")
    args = ap.parse_args()
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.rev], capture_output=True, text=True,
                         check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="sparkbatch-install-") as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone)], check=True)
        subprocess.run(["git", "-C", str(clone), "checkout", "-q", rev], check=True)
        env = {**os.environ, "SPARKBATCH_EXTRA": "cpu"}
        env.pop("VIRTUAL_ENV", None)
        if args.cold:
            env.update(PIP_CACHE_DIR=f"{tmp}/pip-cache", UV_CACHE_DIR=f"{tmp}/uv-cache")
        targets = ["install"] if args.target == "install" else ["install", args.target]
        (Path(tmp) / "mpl").mkdir()
        env["MPLCONFIGDIR"] = f"{tmp}/mpl"  # a machine matplotlib never ran on: no font cache
        seconds = {}
        load_before = os.getloadavg()
        for target in targets:
            started = time.perf_counter()
            make = ["make", "-i"] if args.ignore_errors and target == "check" else ["make"]
            run = subprocess.run([*make, target], cwd=clone, env=env, capture_output=True, text=True)
            seconds[target] = round(time.perf_counter() - started, 1)
            if run.returncode != 0 and target != "check":
                sys.exit(f"make {target} failed ({run.returncode}):\n{run.stderr[-3000:]}")
        # make check's outcome is a finding (a failing test names itself), not a failed measurement.
        outcome = {"returncode": run.returncode, "ignore_errors": args.ignore_errors,
                   "summary": run.stdout.strip().splitlines()[-12:]} if args.target == "check" else {}
        result = {
            "benchmark": "install_time", "machine": machine(cpu_only=True),
            "target": args.target, "installer": installer(clone), "cold_caches": args.cold,
            "seconds": seconds[args.target], "steps_s": seconds, "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in os.getloadavg()], "code": rev, **outcome,
            "command": "python -m benchmarks.tools.install_time " + " ".join(sys.argv[1:]),
        }
        shutil.rmtree(clone, ignore_errors=True)
    emit(result, args.out)


if __name__ == "__main__":
    main()
