"""The tests of tests/unit/test_brake.py on the real vLLM engine; that file says what they cover."""

import json
import os
from pathlib import Path

import psutil
import pytest

from e2e.test_brake import _cli, _defs, _on_disk

# --- the real engine: one CLI run in its own process -------------------------------------------

REAL_RESOURCE = ("VLLMResource(kv_cache_memory_gb=1.0, max_num_seqs=64, max_model_len=1024, "
                 "engine_kwargs={'enforce_eager': True})")  # as testkit.REAL_SETTINGS


def _engine_cores(dagster_home: Path) -> set[int]:
    """vLLM engine cores started by this test's CLI (its DAGSTER_HOME in their environment):
    another engine on the machine meanwhile (a second test session, a notebook) is not counted."""
    found = set()
    for p in psutil.process_iter(["pid", "cmdline", "name"]):
        try:
            if ("EngineCore" in (p.info["name"] or "") or "EngineCore" in " ".join(p.info["cmdline"] or [])) \
                    and p.environ().get("DAGSTER_HOME") == str(dagster_home):
                found.add(p.pid)
        except psutil.Error:
            pass
    return found


@pytest.mark.long
def test_real_engine_run_estimate_under_a_cap_refuses_with_one_line_and_leaves_no_engine(tmp_path):
    if os.environ.get("SPARKBATCH_SKIP_REAL") == "1":
        pytest.skip("SPARKBATCH_SKIP_REAL=1")
    defs = str(_defs(tmp_path, rows=60, resource=REAL_RESOURCE))
    proc = _cli(tmp_path, "run", "-f", defs, "--estimate", "--max-cost", "0.0001", timeout=900)
    assert proc.returncode == 3 and proc.stdout == "", proc.stderr[-3000:]
    lines = [x for x in proc.stderr.strip().splitlines() if x.startswith("sparkbatch:")]
    assert lines[-1].startswith("sparkbatch: refused before generating by max_cost_usd=0.0001: 0 of 60 rows done")
    assert any(x.startswith("sparkbatch: estimate:") for x in lines) and "Traceback" not in proc.stderr
    assert _on_disk(tmp_path / "home") == []  # nothing generated, nothing lost
    report = json.loads((tmp_path / "home" / "estimate" / "estimate.json").read_text())
    assert report["engine_start_s"] > 0 and report["predicted_wall_s"] > 0
    assert not _engine_cores(tmp_path / "dagster_home")  # the CLI's engine process went with it
