"""The tests of tests/unit/test_label_step.py that start processes: the CLI, Dagster runs (their
log capture), servers, kills. That file says what they cover."""

from __future__ import annotations

import json

from dagster import Definitions

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
