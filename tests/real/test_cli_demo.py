"""The demo as a user runs it: `sparkbatch run -f definitions.py` in a fresh process, twice,
on the real engine. The second run must compute nothing."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

def _run(tmp_path: Path, *args: str) -> dict:
    env = {**os.environ, "SPARKBATCH_HOME": str(tmp_path / "demo"), "DAGSTER_HOME": str(tmp_path / "dagster_home"),
           "SPARKBATCH_DEMO_ROWS": "120", "SPARKBATCH_DEMO_SHARDS": "3", "PYTHONPATH": str(ROOT),
           # The deployment's CPU default is 0.3 of RAM (7 GiB here): a second suite on the box
           # starting the same demo would run the machine out of memory.
           "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.run([sys.executable, "-m", "sparkbatch_dagster.cli", *args, "-f", "definitions.py"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.long
def test_demo_runs_then_fills_only_gaps(tmp_path):
    if os.environ.get("SPARKBATCH_SKIP_REAL") == "1":
        pytest.skip("SPARKBATCH_SKIP_REAL=1")
    first = _run(tmp_path, "run")
    assert first["partitions_total"] == first["partitions_done"] == first["partitions_run"] == 3
    assert first["rows"] == 120 and first["labeled"] + first["errors"] == 120
    assert first["input_tokens"] > 0 and first["output_tokens"] > 0 and first["tokens_per_hour"] > 0
    assert first["cost_usd"] > 0 and first["generated"] + first["reused"] <= 120 and first["generated"] > 0
    assert Path(first["home"]) == tmp_path / "demo"
    # The reported accuracy is the labeled files' own, against the input's gold section.
    import pyarrow.parquet as pq

    home = Path(first["home"])
    out = {r["row_id"]: r["output"] for f in (home / "out" / first["version"] / "labeled").glob("*.parquet")
           for r in pq.read_table(f).to_pylist()}
    gold = {r["package"]: r["section"] for r in pq.read_table(home / "input" / "packages-120.parquet").to_pylist()}
    assert first["accuracy"] == round(sum(out[p] == s for p, s in gold.items()) / 120, 4)
    # Lose one finished partition: the next run recomputes it and only it.
    labeled = Path(first["home"]) / "out" / first["version"] / "labeled"
    (labeled / "shard-00001.parquet").unlink()
    assert _run(tmp_path, "status")["missing"] == ["shard-00001"]
    second = _run(tmp_path, "run")
    assert second["partitions_run"] == 1 and second["partitions_done"] == 3
    # The lost partition's answers are still in the result store: nothing goes back to the engine.
    assert second["generated"] == 0 and second["reused"] > 0 and second["accuracy"] == first["accuracy"]
    third = _run(tmp_path, "run")
    assert third["partitions_run"] == 0 and third["rows"] == 120
