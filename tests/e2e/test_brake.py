"""The tests of tests/unit/test_brake.py that start processes: the CLI, Dagster runs (their
log capture), servers, kills. That file says what they cover."""

import json
import os
import re
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance, materialize

from sparkbatch_dagster import build_batch_assets
from sparkbatch_dagster.engines.gpu_lock import wait_for_stops
from sparkbatch_dagster.errors import BudgetStop
from sparkbatch_dagster.testing import FakeVLLMResource
from testkit import live_children, make_rows, make_spec, write_parquet

ROOT = Path(__file__).resolve().parents[2]

DEFS = """
from dagster import Definitions
from sparkbatch_dagster import JobSpec, OutputSpec, VLLMResource, build_batch_assets
from sparkbatch_dagster.testing import FakeVLLMResource
spec = JobSpec(name="things", input={src!r}, id_column="id", text_columns=["text"],
               system_prompt="Answer with one word.", user_template="What is this? {{{{ text }}}}",
               output=OutputSpec(kind="label", labels=["fruit", "vehicle", "animal"]), shard_count=3,
               gold_column="gold", home={home!r}, hourly_rate_usd={rate!r})
job = build_batch_assets(spec=spec)
defs = Definitions(assets=job.assets, resources={{"vllm": {resource}}})
"""


def _defs(tmp_path: Path, rows: int = 90, rate: float = 0.79,
          resource: str = "FakeVLLMResource(delay_s=0.002)") -> Path:
    src = write_parquet(tmp_path / "in" / "rows.parquet", make_rows(rows))
    defs = tmp_path / "defs.py"
    defs.write_text(DEFS.format(src=str(src), home=str(tmp_path / "home"), rate=rate, resource=resource))
    return defs


def _cli(tmp_path: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DAGSTER_HOME": str(tmp_path / "dagster_home")}
    env.pop("PYTHONWARNINGS", None)
    return subprocess.run([sys.executable, "-m", "sparkbatch_dagster.cli", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _on_disk(home: Path) -> list[dict]:
    """Every output row on disk: committed partitions and checkpoint part files."""
    out = home / "out"
    files = [*out.glob("*/labeled/*.parquet"), *out.glob("*/parts/*/part-*.parquet")]
    return [r for f in files for r in pq.read_table(f).to_pylist()]


def _rows_done(message: str, total: int) -> int:
    match = re.search(rf"(\d+) of {total} rows done", message)
    assert match, message
    return int(match.group(1))


# --- the CLI, end to end (fake engine, a fresh process each) -------------------------------------


def test_run_estimate_times_the_sample_on_the_runs_engine_one_start(tmp_path):
    defs = str(_defs(tmp_path))
    proc = _cli(tmp_path, "run", "-f", defs, "--estimate")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["engine_starts"] == 1 and out["rows"] == 90 and out["labeled"] + out["errors"] == 90
    assert out["partitions_run"] == 3 and out["generated"] > 0
    # The estimate's report and prediction were written: run_metrics compared predicted with actual.
    assert "predicted_wall_s" in out and out["prediction_error_pct"] is not None
    report = json.loads((tmp_path / "home" / "estimate" / "estimate.json").read_text())
    assert report["models"] and len(report["models"]) == 1 and report["prompts_to_generate"] > 0
    assert any(x.startswith("sparkbatch: estimate:") and "prompts to generate" in x for x in proc.stderr.splitlines())
    # Everything done: a second run starts nothing.
    again = json.loads(_cli(tmp_path, "run", "-f", defs).stdout)
    assert again["engine_starts"] == 0 and again["partitions_run"] == 0


def test_max_cost_refuses_before_any_row_with_one_line_then_a_run_without_it_completes(tmp_path):
    defs = str(_defs(tmp_path, rate=3600.0))  # $1 a second: the sample alone costs more than the cap
    proc = _cli(tmp_path, "run", "-f", defs, "--estimate", "--max-cost", "0.0001")
    assert proc.returncode == 3 and proc.stdout == "", proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("sparkbatch: refused before generating by max_cost_usd=0.0001: 0 of 90 rows done")
    assert f"to continue: `sparkbatch run -f {defs} --max-cost " in last and "spent" in last
    assert sum("max_cost_usd" in x for x in proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr
    assert _on_disk(tmp_path / "home") == []  # not one row of the job generated
    done = _cli(tmp_path, "run", "-f", defs)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["rows"] == 90 and out["partitions_done"] == 3 and out["engine_starts"] == 1


def test_bad_brake_settings_stop_before_anything_runs(tmp_path):
    defs = str(_defs(tmp_path))
    for flags, says in ((["--deadline", "2020-01-01T00:00:00+00:00"], "has passed"),
                        (["--deadline", "2026-12-01T18:00"], "has no time zone"),
                        (["--deadline", "soon"], "neither a time nor a duration"),
                        (["--max-cost", "-1"], "is negative")):
        proc = _cli(tmp_path, "run", "-f", defs, *flags)
        lines = [x for x in proc.stderr.strip().splitlines() if x.startswith("sparkbatch:")]
        assert proc.returncode == 2 and len(lines) == 1 and says in lines[0], proc.stderr[-2000:]
    assert not (tmp_path / "home" / "shards").exists()  # checked before sharding, let alone a model


# --- the brake inside a labeled_outputs run (Dagster, in process) --------------------------------


def _label(job, res, config: dict | None = None) -> None:
    """Shard, then (``config`` not None) labeled_outputs over every partition with that config."""
    inst = DagsterInstance.get()
    materialize(job.assets, selection=[job.keys["input_shards"]], resources={"vllm": res}, instance=inst)
    if config is None:
        return
    keys = inst.get_dynamic_partitions(job.partitions_def.name)
    op = "__".join(job.keys["labeled_outputs"].path)
    materialize(job.assets, selection=[job.keys["labeled_outputs"]], resources={"vllm": res}, instance=inst,
                run_config={"ops": {op: {"config": config}}},
                tags={"dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]})


def _stop(job, res, config: dict) -> BudgetStop:
    with pytest.raises(Exception) as caught:  # noqa: PT011 - Dagster may wrap the step's error
        _label(job, res, config)
    stop = caught.value if isinstance(caught.value, BudgetStop) else getattr(caught.value, "user_exception", None)
    assert isinstance(stop, BudgetStop), caught.value
    return stop


def _exactly_once(job, home: Path) -> list[dict]:
    rows = [r for f in (home / "out").glob("*/labeled/*.parquet") for r in pq.read_table(f).to_pylist()]
    assert sorted(r["row_id"] for r in rows) == sorted(r["id"] for r in make_rows(120))
    return rows


def test_max_cost_stops_mid_run_every_finished_row_saved_and_a_rerun_completes_each_row_once(tmp_path):
    spec = make_spec(tmp_path, hourly_rate_usd=3600.0)  # $1 a second; 120 rows at 30 ms: > $3.6 in all
    job = build_batch_assets(spec=spec)
    trace = tmp_path / "trace.txt"
    stop = _stop(job, FakeVLLMResource(delay_s=0.03, trace_path=str(trace)), {"max_cost_usd": 1.5})
    message = str(stop)
    assert "by max_cost_usd=1.5" in message and "--max-cost" in message and stop.raise_to_usd is not None
    assert stop.raise_to_usd > 1.5 and "at the measured" in message
    home = tmp_path / "home"
    disk = _on_disk(home)
    answered = trace.read_text().splitlines()
    # Every answer the engine gave is on disk (one row per duplicate), nothing else generated is.
    generated = [r for r in disk if r["error"] is None and not r["reused"] and not r["deduplicated"]]
    assert len(generated) == len(answered) > 0
    assert len(disk) == _rows_done(message, 120) < 120
    # Without the brake the run finishes, and no prompt goes to the engine twice.
    trace.unlink()
    _label(job, FakeVLLMResource(delay_s=0.0, trace_path=str(trace)), {})
    rows = _exactly_once(job, home)
    firsts = [r for r in rows if r["error"] is None and not r["deduplicated"] and not r["reused"]]
    assert len(answered) + len(trace.read_text().splitlines()) == len(firsts)


def test_deadline_stops_in_time_with_no_engine_process_left(tmp_path):
    spec = make_spec(tmp_path)
    job = build_batch_assets(spec=spec)
    res = FakeVLLMResource(delay_s=0.15, data_parallel_size=2)  # two worker processes, 9 s for the job
    _label(job, res)  # sharded first: the deadline counts from the labeling run's start
    # The brake stops the run once the deadline is closer than the margin: 4.5 s from now, as a
    # deadline 5 s away with a 0.5 s margin would, but a deadline far enough away that however
    # long the run takes to start, it has not passed (a passed one is refused as bad config).
    deadline = (datetime.now(timezone.utc) + timedelta(seconds=600)).isoformat()
    stop = _stop(job, res, {"deadline": deadline, "deadline_margin_s": 595.5})
    assert "before the deadline" in str(stop) and "later --deadline" in str(stop)
    wait_for_stops()  # the engine stops in the background, behind the run's end
    assert not live_children("spawn_main")  # the engine's workers went with the run
    done = _rows_done(str(stop), 120)
    assert len(_on_disk(tmp_path / "home")) == done < 120  # every finished row saved, none twice
    _label(job, FakeVLLMResource(), {})
    _exactly_once(job, tmp_path / "home")


def test_a_past_deadline_in_the_launchpad_config_starts_no_engine(tmp_path):
    job = build_batch_assets(spec=make_spec(tmp_path))
    trace = tmp_path / "trace.txt"  # the fake engine opens it when it starts
    with pytest.raises(Exception, match="has passed"):  # noqa: PT011
        _label(job, FakeVLLMResource(trace_path=str(trace)), {"deadline": "2020-01-01T00:00:00+00:00"})
    assert not trace.exists() and _on_disk(tmp_path / "home") == []
