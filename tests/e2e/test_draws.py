"""Issue 59 item 2 through real runs (Dagster, the fake engine): sampled lines without a seed are
generated in every batch, and again when the same file comes back; seeded and greedy lines are
answered once and then reused from the shared result store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sparkbatch_dagster.cli.commands import run_batch
from sparkbatch_dagster.definitions.batch_files import batch_file_job
from testkit import fake_resource


def line(cid: str, **body: Any) -> str:
    return json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
                       "body": {"messages": [{"role": "user", "content": "Tell me a joke."}], "max_tokens": 8, **body}})


LINES = [line("warm-1", temperature=1.0), line("warm-2", temperature=1.0), line("warm-3", temperature=1.0),
         line("seeded-1", temperature=1.0, seed=4), line("seeded-2", temperature=1.0, seed=4),
         line("unset-1"), line("unset-2"), line("greedy-1", temperature=0), line("greedy-2", temperature=0)]


def test_sampled_lines_are_drawn_in_every_batch_and_the_rest_reused(tmp_path: Path) -> None:
    resource, engine = fake_resource()
    store = tmp_path / "store"
    seen = []
    for round_ in ("first", "second"):
        src = tmp_path / f"{round_}.jsonl"
        src.write_text("\n".join(LINES) + "\n")
        job, defs = batch_file_job(src, resource=resource, result_store=str(store))
        before = engine.requests_seen
        summary = run_batch(job, defs, tmp_path / f"{round_}-out.jsonl")
        assert summary["success"] and summary["export"]["complete"]
        seen.append(engine.requests_seen - before)
        out = [json.loads(x) for x in (tmp_path / f"{round_}-out.jsonl").read_text().splitlines()]
        assert sorted(x["custom_id"] for x in out) == sorted(json.loads(x)["custom_id"] for x in LINES)
        usage = {x["custom_id"]: x["response"]["body"]["usage"]["completion_tokens"] for x in out}
        # Every draw is paid for in every batch: none is a copy at usage 0.
        assert all(usage[c] > 0 for c in ("warm-1", "warm-2", "warm-3", "unset-1", "unset-2"))
    # First: 3 + 2 draws, one seeded and one greedy generation. Second: the 5 draws again, the rest reused.
    assert seen == [7, 5]
