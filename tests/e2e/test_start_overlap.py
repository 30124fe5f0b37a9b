"""`sparkbatch run` starts its engine before it shards, and opens (reads, renders, looks up) the
first shards while that start is in flight (issue 61): a fake start that holds until a shard has
been opened, and sharding that waits for the start to have begun. Events, not sleeps: the waits'
limits are only how long a broken order takes to fail."""

from __future__ import annotations

import threading
from typing import Any

from dagster import Definitions

from sparkbatch_dagster import build_batch_assets
from sparkbatch_dagster.cli import commands
from sparkbatch_dagster.run.runner import ShardRun
from sparkbatch_dagster.testing import FakeVLLMResource
from testkit import make_spec


def test_sharding_and_the_first_shards_prompts_run_while_the_engine_starts(tmp_path, monkeypatch):
    job = build_batch_assets(spec=make_spec(tmp_path, n=120, shards=4))
    began, opened = threading.Event(), threading.Event()
    real_start, real_shard, real_open = FakeVLLMResource._start, commands.shard, ShardRun.open

    def start(self: Any) -> Any:
        began.set()
        if not opened.wait(120):
            raise AssertionError("no shard was opened while the engine started")
        return real_start(self)

    def shard(*args: Any) -> Any:
        if not began.wait(120):
            raise AssertionError("sharding ran before the engine start began")
        return real_shard(*args)

    def open_shard(self: ShardRun, key: str) -> int:
        index = real_open(self, key)
        opened.set()
        return index

    monkeypatch.setattr(FakeVLLMResource, "_start", start)
    monkeypatch.setattr(commands, "shard", shard)
    monkeypatch.setattr(ShardRun, "open", open_shard)
    summary = commands.run(job, Definitions(assets=job.assets, resources={"vllm": FakeVLLMResource()}))
    assert summary.success and summary.partitions_done == 4 and summary.engine_starts == 1
    assert (summary.timings_s or {}).get("engine_start_ahead", 0) > 0  # the whole start, begun before sharding


def test_a_rerun_with_nothing_to_label_starts_no_engine(tmp_path, monkeypatch):
    job = build_batch_assets(spec=make_spec(tmp_path, n=40, shards=2))
    defs = Definitions(assets=job.assets, resources={"vllm": FakeVLLMResource()})
    commands.run(job, defs)
    starts: list[int] = []
    real_start = FakeVLLMResource._start
    monkeypatch.setattr(FakeVLLMResource, "_start", lambda self: starts.append(1) or real_start(self))
    again = commands.run(job, defs)
    assert starts == [] and again.engine_starts == 0 and "engine_start_ahead" not in (again.timings_s or {})
