"""Every request of a batch accounted for, whatever ends it (issue 59): random files (repeated ids,
ids the job would generate, a raw NUL, lines that are no JSON or have no id, Unicode-blank lines)
ended at random points by a completed run, an engine that dies after k answers, a cancel or an
expiry (the rows finished by then kept), or before anything ran; then every request is in one
result line once and ``request_counts`` add up (tests/support/accounting.py). The worker is the
real ``serve-batch`` worker; its ``run-batch`` child is replaced by the same run in this process.

A failing seed prints the one command that replays it::

    SPARKBATCH_ACCOUNTING_SEEDS=17 .venv/bin/pytest tests/e2e/test_batch_accounting.py -p no:randomly
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from accounting import check_ended, random_file, request_line

from sparkbatch_dagster.cli.commands import run_batch
from sparkbatch_dagster.definitions.batch_files import batch_file_job
from sparkbatch_dagster.serve.openai_batches import openai_batch
from sparkbatch_dagster.serve.record import BatchRecord
from sparkbatch_dagster.serve.worker import Store, Worker, _job_name
from sparkbatch_dagster.spec import SamplingSpec
from sparkbatch_dagster.testing import FakeVLLMResource

SEEDS = [int(s) for s in os.environ.get("SPARKBATCH_ACCOUNTING_SEEDS", "").split(",") if s.strip()] or range(10)
#: How a batch ends: its status, and whether its run starts at all.
ENDINGS = [("completed", True), ("failed", True), ("cancelled", True), ("expired", True), ("cancelled", False),
           ("expired", False), ("failed", False)]


def _batch(store: Store, fmt: str, src: Path) -> str:
    """A batch of ``src`` in the store, as the create routes leave it (the worker not started)."""
    fid = store.add_file(src.read_bytes(), "in.jsonl", "batch").id
    bid = f"{'msgbatch' if fmt == 'anthropic_batch' else 'batch'}_{os.urandom(6).hex()}"
    store.save(BatchRecord(id=bid, format=fmt, input_file_id=fid, status="in_progress", created_at=1, expires_at=2))
    return bid


def _end_at_random(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    fmt = rng.choice(["openai_batch", "anthropic_batch"])
    status, runs = rng.choice(ENDINGS)
    src = tmp_path / "in.jsonl"
    random_file(rng, fmt, src)
    store = Store(tmp_path / "root")
    bid = _batch(store, fmt, src)
    stop_after = rng.randint(0, 30) if status != "completed" else None
    resource = FakeVLLMResource(fail_after=stop_after)
    worker = Worker(store, [], resource, SamplingSpec(max_tokens=4), rng.choice([3, 10_000]), 0.79)
    error = None
    if runs:
        job, defs = batch_file_job(store.file_path(store.batch(bid).input_file_id), fmt,
                                   home=store.folder(bid) / "home", name=_job_name(bid), resource=resource,
                                   sampling=SamplingSpec(max_tokens=4), shard_size=worker.shard_size,
                                   result_store=str(worker.answers))
        worker._jobs[bid] = job
        try:  # an engine that dies after k answers leaves the rows a cancel or an expiry would
            run_batch(job, defs, store.folder(bid) / "output.jsonl", None)
        except Exception as exc:  # noqa: BLE001 - the ending below is what is tested
            error = f"{type(exc).__name__}: {exc}"
    worker._finish(bid, status, error if status == "failed" else None)
    assert store.batch(bid).status == status
    check_ended(store, bid)


@pytest.mark.parametrize("seed", SEEDS)
def test_every_request_is_in_one_result_line_whatever_ends_the_batch(tmp_path: Path, seed: int):
    try:
        _end_at_random(tmp_path, seed)
    except Exception as exc:
        raise AssertionError(f"seed {seed}: {exc}\nreplay: SPARKBATCH_ACCOUNTING_SEEDS={seed} .venv/bin/pytest "
                             "tests/e2e/test_batch_accounting.py -p no:randomly") from exc


def test_an_openai_batch_whose_engine_dies_lists_every_unanswered_request(tmp_path: Path):
    """Issue 59's case: the engine dies after 12 of 30; the 18 others are ``batch_failed`` lines."""
    from openai.types import Batch

    src = tmp_path / "in.jsonl"
    src.write_text("".join(request_line(f"r{i:02}", "openai_batch", f"text {i}") + "\n" for i in range(30)))
    store = Store(tmp_path / "root")
    bid = _batch(store, "openai_batch", src)
    resource = FakeVLLMResource(fail_after=12)
    worker = Worker(store, [], resource, SamplingSpec(max_tokens=4), 10_000, 0.79)
    job, defs = batch_file_job(src, home=store.folder(bid) / "home", name=_job_name(bid), resource=resource,
                               sampling=SamplingSpec(max_tokens=4), result_store=str(worker.answers))
    worker._jobs[bid] = job
    with pytest.raises(Exception):  # noqa: B017 - the fake engine's crash, whatever its type
        run_batch(job, defs, tmp_path / "out.jsonl", None)
    worker._finish(bid, "failed", "EngineError: the engine died")
    batch = Batch.model_validate(openai_batch(store.batch(bid)).model_dump())
    assert batch.status == "failed" and batch.error_file_id is not None
    assert batch.request_counts is not None and batch.request_counts.total == 30
    assert batch.request_counts.completed + batch.request_counts.failed == 30 and batch.request_counts.failed >= 18
    errors = [json.loads(x) for x in store.file_path(batch.error_file_id).read_text().splitlines()]
    unrun = [e for e in errors if e["error"] is not None]
    assert unrun and {e["error"]["code"] for e in unrun} == {"batch_failed"}
    assert all("the engine died" in e["error"]["message"] and e["response"] is None for e in unrun)
    check_ended(store, bid)


def test_a_cancelled_line_the_job_could_not_read_is_listed_once(tmp_path: Path):
    """Issue 59: a raw NUL makes line 3 ``unparsable-line-3``; a cancel does not also list it as ``r002``."""
    src = tmp_path / "in.jsonl"
    lines = [request_line(f"r{i:03}", "openai_batch", f"text {i}") for i in range(60)]
    lines[2] = lines[2].replace("text 2", "a\x00b")
    src.write_text("\n".join(lines) + "\n")
    store = Store(tmp_path / "root")
    bid = _batch(store, "openai_batch", src)
    resource = FakeVLLMResource(fail_after=5)
    worker = Worker(store, [], resource, SamplingSpec(max_tokens=4), 10_000, 0.79)
    job, defs = batch_file_job(src, home=store.folder(bid) / "home", name=_job_name(bid), resource=resource,
                               sampling=SamplingSpec(max_tokens=4), result_store=str(worker.answers))
    worker._jobs[bid] = job
    with pytest.raises(Exception):  # noqa: B017
        run_batch(job, defs, tmp_path / "out.jsonl", None)
    worker._finish(bid, "cancelled")
    batch = store.batch(bid)
    ids = [json.loads(x)["custom_id"] for fid in (batch.output_file_id, batch.error_file_id) if fid
           for x in store.file_path(fid).read_text().splitlines()]
    assert "unparsable-line-3" in ids and "r002" not in ids and len(ids) == 60
    assert batch.request_counts.total == 60
    check_ended(store, bid)
