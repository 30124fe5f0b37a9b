"""The tests of tests/unit/test_data_parallel.py that start processes: the CLI, Dagster runs (their
log capture), servers, kills. That file says what they cover."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance, materialize

from sparkbatch_dagster import EngineError, build_batch_assets
from sparkbatch_dagster.engines.base import EngineRequest
from sparkbatch_dagster.engines.offline.data_parallel import DataParallelEngine
from sparkbatch_dagster.spec import OutputSpec, SamplingSpec
from sparkbatch_dagster.testing import FakeVLLMResource, fake_worker
from testkit import make_spec
from unit.test_data_parallel import _workers

RANGE = ("dagster/asset_partition_range_start", "dagster/asset_partition_range_end")
OUTPUT = OutputSpec(kind="label", labels=["fruit", "vehicle", "animal"])


def _label(root: Path, res: Any, n: int = 120, shards: int = 4, **kw: Any) -> tuple[Any, Any, list[str], Any]:
    job = build_batch_assets(spec=make_spec(root, n=n, shards=shards, name=root.name))
    inst = DagsterInstance.get()
    if not inst.get_dynamic_partitions(job.partitions_def.name):
        materialize([job.assets[0]], instance=inst, resources={"vllm": res})
    keys = sorted(inst.get_dynamic_partitions(job.partitions_def.name))
    result = materialize([job.assets[1]], instance=inst, resources={"vllm": res},
                         tags={RANGE[0]: keys[0], RANGE[1]: keys[-1]}, **kw)
    return job, inst, keys, result


def _outputs(job: Any, column: str = "output") -> dict[str, Any]:
    table = job.read_outputs()
    ids = table.column("row_id").to_pylist()
    assert len(ids) == len(set(ids)), "a row was written twice"
    return dict(zip(ids, table.column(column).to_pylist(), strict=True))


def _seen(trace: Path) -> dict[int, dict[str, Any]]:
    """Each worker's own record: its pid and the CUDA_VISIBLE_DEVICES it saw."""
    found = [json.loads(p.read_text()) for p in trace.parent.glob(f"{trace.name}.*.json")]
    return {s["pid"]: s for s in found}


def test_two_workers_label_every_row_once_like_one_engine(tmp_path):
    trace = tmp_path / "trace"
    res = FakeVLLMResource(data_parallel_size=2, delay_s=0.002, trace_path=str(trace))
    job, inst, keys, result = _label(tmp_path / "two", res)
    assert result.success
    recs = sorted(inst.fetch_materializations(job.keys["labeled_outputs"], limit=100).records,
                  key=lambda r: r.storage_id)
    assert sorted(r.partition_key for r in recs) == keys and len(keys) == 4  # one event per partition
    md = [r.asset_materialization.metadata for r in recs]
    assert sum(m["rows"].value for m in md) == 120 and all(m["errors"].value == 0 for m in md)

    one, *_ = _label(tmp_path / "one", FakeVLLMResource())
    assert _outputs(job) == _outputs(one) and len(_outputs(job)) == 120  # same answers as one engine
    assert _outputs(job, "confidence") == _outputs(one, "confidence")  # every field crosses from the workers

    seen = _seen(trace)
    assert len(seen) == 2  # two processes, both answered requests, none twice
    answered = [line for pid in seen for line in (trace.parent / f"trace.{pid}").read_text().split()]
    assert all((trace.parent / f"trace.{pid}").read_text() for pid in seen)
    assert len(answered) == sum(m["generated_requests"].value for m in md)
    assert not _workers()  # the run's end stopped them


@pytest.mark.parametrize("kill", ["one", "both"])
def test_killed_workers_lose_no_row_and_label_none_twice(tmp_path, kill):
    trace, gate = tmp_path / "trace", tmp_path / "go"
    # Each worker answers 5 requests, then holds at the gate: the kill lands while both are
    # mid-job, however slow the machine; the gate opens after it, for the survivor.
    res = FakeVLLMResource(data_parallel_size=2, delay_s=0.01, trace_path=str(trace), gate_path=str(gate),
                           gate_after=5)
    killed: list[int] = []

    def answered(pid: int) -> int:
        path = trace.parent / f"trace.{pid}"
        return len(path.read_text().split()) if path.exists() else 0

    def kill_workers() -> None:
        deadline = time.monotonic() + 240  # only bounds a hang
        try:
            while time.monotonic() < deadline and not killed:
                seen = sorted(_seen(trace))
                if len(seen) == 2 and all(answered(pid) >= 5 for pid in seen):
                    for pid in seen if kill == "both" else seen[:1]:
                        os.kill(pid, signal.SIGKILL)
                        killed.append(pid)
                time.sleep(0.01)
        finally:
            gate.touch()  # the survivor goes on (and a worker never killed does not wait for nothing)

    killer = threading.Thread(target=kill_workers)
    killer.start()
    job, inst, keys, result = _label(tmp_path / "job", res, raise_on_error=False)
    killer.join()
    assert killed
    version = job.output_version(res)  # the run committed nothing: current.json never moved to it
    if kill == "one":  # its rows went to the other engine: the run completes
        assert result.success and all(job.home.is_done(version, k) for k in keys)
        assert len(_outputs(job)) == 120
    else:  # nobody left: what they had stays pending, nothing of it written
        assert not result.success
        failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
        assert "worker_died" in str(failure.event_specific_data.error) or "every engine" in str(
            failure.event_specific_data.error)
        written = [r for k in keys for p in job.home.parts_dir(version, k).glob("part-*")
                   for r in pq.read_table(p).column("row_id").to_pylist()]
        written += [r for k in keys if job.home.is_done(version, k)
                    for r in pq.read_table(job.home.labeled_path(version, k)).column("row_id").to_pylist()]
        assert len(written) == len(set(written)) < 120
    assert not _workers()

    again = materialize([job.assets[1]], instance=inst, resources={"vllm": FakeVLLMResource(data_parallel_size=2)},
                        tags={RANGE[0]: keys[0], RANGE[1]: keys[-1]})
    assert again.success
    assert len(_outputs(job)) == 120 and all(job.home.is_done(version, k) for k in keys)
    assert not _workers()


def _requests(n: int, tag: str = "") -> list[EngineRequest]:
    return [EngineRequest(f"{tag}{i}", [{"role": "user", "content": f"thing {tag}{i}"}]) for i in range(n)]


def test_a_dead_workers_requests_go_to_the_other_once(tmp_path):
    engine = DataParallelEngine(fake_worker, {"delay_s": 0.01}, [{}, {}], window=16, batch=4)
    try:
        got: list[Any] = []
        for res in engine.generate(_requests(200), SamplingSpec(), OUTPUT):
            got.append(res)
            if len(got) == 20:
                os.kill(engine.pids[0], signal.SIGKILL)
        assert sorted(r.id for r in got) == sorted(str(i) for i in range(200))  # each exactly once
        assert all(r.error is None for r in got)  # re-sent, none pending
        # The live worker carries on in the next generate.
        assert sorted(r.id for r in engine.generate(_requests(30, "b"), SamplingSpec(), OUTPUT)) == \
            sorted(f"b{i}" for i in range(30))
    finally:
        engine.close()
    assert not _workers()


def test_with_every_worker_dead_the_rest_is_pending_and_the_stream_fails(tmp_path):
    engine = DataParallelEngine(fake_worker, {"delay_s": 0.01}, [{}, {}], window=16, batch=4)
    got: list[Any] = []
    try:
        with pytest.raises(EngineError, match="every engine of this run has died"):
            for res in engine.generate(_requests(200), SamplingSpec(), OUTPUT):
                got.append(res)
                if len(got) == 20:
                    for pid in engine.pids:
                        os.kill(pid, signal.SIGKILL)
    finally:
        engine.close()
    ids = [r.id for r in got]
    assert len(ids) == len(set(ids))  # none twice
    lost = [r for r in got if r.retryable]
    assert lost and all(r.error.startswith("worker_died: engine ") for r in lost)
    assert not _workers()


def test_a_caller_that_stops_early_leaves_the_engine_clean(tmp_path):
    engine = DataParallelEngine(fake_worker, {"delay_s": 0.005}, [{}, {}], window=16, batch=4)
    try:
        stream = engine.generate(_requests(100, "a"), SamplingSpec(), OUTPUT)
        first = [next(stream) for _ in range(10)]
        stream.close()  # as the runner's generator is closed on an error or Ctrl-C
        assert len(first) == 10
        # Nothing of the abandoned stream leaks into the next one.
        assert sorted(r.id for r in engine.generate(_requests(40, "b"), SamplingSpec(), OUTPUT)) == \
            sorted(f"b{i}" for i in range(40))
    finally:
        engine.close()
        engine.close()  # idempotent
    assert not _workers()


def test_a_worker_that_cannot_start_fails_the_start_and_leaves_nothing():
    with pytest.raises(EngineError, match=r"engine \d of 2 .*could not start: TypeError"):
        DataParallelEngine(fake_worker, {"no_such_setting": 1}, [{}, {}])
    assert not _workers()


@pytest.mark.parametrize(("visible", "tp", "expected"), [
    ("0,1,2,3", 1, ["0", "1"]),
    ("0,1,2,3", 2, ["0,1", "2,3"]),
])
def test_each_worker_sees_its_own_gpu_group(tmp_path, monkeypatch, visible, tp, expected):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    trace = tmp_path / "trace"
    res = FakeVLLMResource(data_parallel_size=2, tensor_parallel_size=tp, trace_path=str(trace))
    engine = res.get_engine()
    try:
        assert isinstance(engine, DataParallelEngine)
        seen = _seen(trace)
        assert [seen[pid]["CUDA_VISIBLE_DEVICES"] for pid in engine.pids] == expected
        assert os.environ["CUDA_VISIBLE_DEVICES"] == visible  # this process's own is left as it was
    finally:
        res.close()
    assert not _workers()
