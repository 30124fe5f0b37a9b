"""How every benchmark here reports: one JSON object on stdout, and the same line in a result
file under ``benchmarks/results/`` when ``--out`` names one (the tables of docs/ are rendered
from those files by ``doc_tables.py``; ``tests/unit/test_results_files.py`` checks them)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


def emit(result: dict[str, Any], out: str | None) -> None:
    """Print ``result`` as one line (with the UTC ``date`` of the run unless it has one) and
    write the same line to ``out`` when given."""
    if "date" not in result:
        result = {**result, "date": datetime.now(timezone.utc).date().isoformat()}
    line = json.dumps(result)
    print(line)
    if out:
        Path(out).write_text(line + "\n")


def fresh_process(child: str, args: list[str], env: dict[str, str], cwd: Path, timeout: int, what: str) -> Any:
    """Run ``child`` (Python source) in a fresh interpreter, as `sparkbatch run` starts, and return
    the JSON of its last stdout line; its stderr's tail in the error when it fails."""
    proc = subprocess.run([sys.executable, "-c", child, *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)
    if proc.returncode != 0:
        raise RuntimeError(f"{what}: {proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def commit_of(checkout: Path) -> str:
    """The checkout's commit (``+dirty`` when its tracked files have changes; ``unknown`` without git)."""
    try:
        head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")
