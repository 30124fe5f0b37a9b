"""The tests of tests/unit/test_layout.py that start processes: the CLI, Dagster runs (their
log capture), servers, kills. That file says what they cover."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_old_paths_of_every_moved_module_import_in_a_fresh_process():
    from sparkbatch_dagster._moved import MOVED

    code = "; ".join(f"import sparkbatch_dagster.{old}" for old in MOVED) + \
        "; from sparkbatch_dagster import estimate, spec, cli; estimate.predict; spec.JobSpec; cli.main" \
        "; from sparkbatch_dagster.resources import THROUGHPUT_ONLY, VLLMResource, on_cpu" \
        "; import sparkbatch_dagster as s; assert s.digest is s.home.digests"
    subprocess.run([sys.executable, "-W", "error::ImportWarning", "-c", code], check=True, cwd=ROOT)
