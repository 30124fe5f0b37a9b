"""The tests of tests/unit/test_label_step.py that start processes: the CLI, Dagster runs (their
log capture), servers, kills. That file says what they cover."""

from __future__ import annotations

import json

from dagster import DagsterEventType, DagsterInstance, Definitions

from sparkbatch_dagster import build_batch_assets
from sparkbatch_dagster.cli import commands
from sparkbatch_dagster.testing import FakeVLLMResource
from testkit import make_spec

LAPS = {"startup", "shard", "label", "metrics", "analytics", "engine_stop_wait", "engine_stop_background"}


# --- the parts ------------------------------------------------------------------------------


def test_the_summary_splits_label_into_named_parts_that_add_up_to_no_more_than_it(tmp_path):
    spec = make_spec(tmp_path, n=120, shards=4)
    job = build_batch_assets(spec=spec)
    summary = commands.run(job, Definitions(assets=job.assets, resources={"vllm": FakeVLLMResource()}))
    timings = summary.timings_s or {}
    assert timings.keys() >= LAPS
    outside = LAPS | {"engine_import", "engine_start_ahead", "review_queue"}  # laps and figures besides label's
    parts = {k: v for k, v in timings.items() if k not in outside}
    for name in ("run_start", "prepare", "identity", "engine_start", "generation", "read_shards", "render",
                 "prompt_keys", "store_lookup", "answers", "commit", "store_add", "events", "run_end"):
        assert name in parts, (name, timings)
    # The engine stopped in the background, behind metrics and analytics: no part of the label lap.
    assert "engine_stop" not in parts and "engine_stop_background" in timings, timings
    assert all(v >= 0 for v in parts.values()), parts
    assert sum(parts.values()) <= timings["label"] + 1e-9, timings
    # The same parts (the step's own) in the attempt's record: the run's metadata, `dagster dev` runs too.
    [record] = [json.loads(p.read_text()) for p in job.home.version_dir(summary.version).glob("attempts/*.json")]
    assert {"engine_start", "generation", "render", "commit", "events"} <= record["timings_s"].keys(), record


def test_a_cli_run_is_three_dagster_runs_and_its_laps_split_at_the_last_ones_steps(tmp_path, monkeypatch):
    """Shard, label, then metrics, analytics and the review queue in one run (each run costs Dagster's
    own half second): each still materialized once, by its own step, and timed as its own lap."""
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    spec = make_spec(tmp_path, n=60, shards=3)
    job = build_batch_assets(spec=spec)
    summary = commands.run(job, Definitions(assets=job.assets, resources={"vllm": FakeVLLMResource()}))
    inst = DagsterInstance.get()
    runs = inst.get_run_records()
    assert len(runs) == 3 and summary.success, [r.dagster_run.asset_selection for r in runs]
    last = max(runs, key=lambda r: r.create_timestamp).dagster_run
    made = inst.all_logs(last.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION)
    done = {e.dagster_event.asset_key for e in made if e.dagster_event}
    assert done == {job.keys["run_metrics"], job.keys["analytics"], job.keys["review_queue"]}, done
    timings = summary.timings_s or {}
    assert all(timings[lap] >= 0 for lap in ("metrics", "analytics", "review_queue")), timings
    # Nothing left to label: the analytics (and the queue) alone, in a run of their own.
    again = commands.run(job, Definitions(assets=job.assets, resources={"vllm": FakeVLLMResource()}))
    assert len(inst.get_runs()) == 5 and "metrics" not in (again.timings_s or {}), again.timings_s
