"""The bucket protocol's promises, each tried in one process against moto's S3 server: a box
that lost its lease stops and never counts the shard; a commit made as a run fails is still
materialized; a refresh never swaps shard files under a run; a preview changes nothing.
(docs/protocol.md; the seeded harness, tests/e2e/test_harness.py, hunts the same breaks across
processes.)"""

from __future__ import annotations

import hashlib
import io
import json
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance, materialize

from sparkbatch_dagster import build_batch_assets
from sparkbatch_dagster.engines import FakeEngine
from sparkbatch_dagster.engines.base import EngineRequest, EngineResult
from sparkbatch_dagster.errors import EngineError
from sparkbatch_dagster.home import Bucket
from sparkbatch_dagster.home.lease import BoxLease
from sparkbatch_dagster.inputs.shards import build_shards
from sparkbatch_dagster.run.attempts import load
from sparkbatch_dagster.run.rows import read_shard
from sparkbatch_dagster.run.runner import ShardRun
from sparkbatch_dagster.testing import FakeVLLMResource
from testkit import make_spec, unique_rows, write_parquet

VERSION = "0123456789abcdef"


class Hooked(FakeEngine):
    """A fake engine whose first stream calls ``hook`` once, as its ``after``-th answer is
    ready (the box "pauses" there), and counts the answers that stream gives after that one."""

    def __init__(self, after: int, hook: Callable[[], None]) -> None:
        super().__init__()
        self.after, self.hook, self.after_hook, self.calls = after, hook, 0, 0

    def generate(self, requests: Iterable[EngineRequest], sampling: Any, output: Any) -> Iterator[EngineResult]:
        self.calls += 1
        first = self.calls == 1
        for n, res in enumerate(super().generate(requests, sampling, output), 1):
            if first and n == self.after:
                self.hook()
            elif first and n > self.after:
                self.after_hook += 1
            yield res


def bucket_job(tmp_path: Path, bucket: str, box: str, n: int = 48, shards: int = 2, **kw: Any) -> Any:
    src = tmp_path / "in" / "rows.parquet"
    if not src.exists():
        write_parquet(src, unique_rows(n))
    kw.setdefault("input", str(src))
    spec = make_spec(tmp_path, shards=shards, home=f"s3://{bucket}/jobs/things",
                     cache_dir=str(tmp_path / box), lease_seconds=30.0, checkpoint_rows=4, **kw)
    return build_batch_assets(spec=spec)


def committed(b: Bucket) -> dict[str, dict[str, Any]]:
    return {n.removesuffix(".json"): json.loads(b.get_bytes(f"out/{VERSION}/commits/{n}") or b"{}")
            for n in b.list(f"out/{VERSION}/commits")}


def rows_of(b: Bucket, commit: dict[str, Any]) -> list[str]:
    return pq.read_table(io.BytesIO(b.get_bytes(commit["labeled"]) or b"")).column("row_id").to_pylist()


def test_a_box_fenced_mid_shard_stops_at_once_and_never_counts_it(s3_bucket, tmp_path):
    a, b = bucket_job(tmp_path, s3_bucket, "a"), bucket_job(tmp_path, s3_bucket, "b")
    build_shards(a.spec, a.home)
    bucket = a.home.remote.bucket
    ran_b: list[dict[str, Any]] = []

    def box_b_takes_over() -> None:
        # Box a "was paused": box b's clock is past a's lease, so b fences a and labels shard-00000.
        b.home._box = BoxLease(b.home.remote.bucket, 30.0)
        b.home._box.clock = lambda: time.time() + 1000  # type: ignore[method-assign]
        b.home.refresh(write=True)
        ran_b.extend(ShardRun(b.spec, b.home, VERSION, FakeEngine()).run(["shard-00000"]))
        a.home._box._ok_at = 0.0  # a's last renewal is long ago: its next answer checks the lease

    engine = Hooked(after=3, hook=box_b_takes_over)
    run_a = ShardRun(a.spec, a.home, VERSION, engine)
    got = [s.partition for s in run_a.stream(["shard-00000", "shard-00001"])]

    assert [s.partition for s in ran_b] == ["shard-00000"]
    assert engine.after_hook == 0  # the answer in hand when the pause ended is the last one used
    # shard-00000 is b's (committed once, by b), recorded by a as done elsewhere; a took
    # shard-00001 back under a new box identity and committed it.
    assert got == ["shard-00001"] and run_a.committed_elsewhere == ["shard-00000"]
    commits = committed(bucket)
    assert commits["shard-00000"]["attempt"] != run_a.attempt.id
    assert commits["shard-00001"]["attempt"] == run_a.attempt.id
    ids = rows_of(bucket, commits["shard-00000"]) + rows_of(bucket, commits["shard-00001"])
    assert sorted(ids) == sorted(f"id-{i:05d}" for i in range(48))
    # a's attempt counts only what it committed: the lost shard's work is waste.
    record = next(r for r in load(a.home, VERSION) if r.attempt == run_a.attempt.id)
    assert record.partitions_committed == 1
    assert record.committed_cost_usd == pytest.approx(commits["shard-00001"]["stats"]["cost_usd"])
    # Nothing left behind: no claim, no box lease, no part.
    assert not bucket.list("leases") and not bucket.list(f"out/{VERSION}/parts")


def test_a_commit_made_as_the_run_fails_is_still_materialized(s3_bucket, tmp_path):
    job = bucket_job(tmp_path, s3_bucket, "a", n=40)
    inst = DagsterInstance.ephemeral()
    first_shard = None

    def resources(**fake: Any) -> dict[str, Any]:
        return {"vllm": FakeVLLMResource(**fake)}

    materialize(job.assets, selection=[job.keys["input_shards"]], resources=resources(), instance=inst)
    first_shard = pq.read_metadata(job.home.shard_path("shard-00000")).num_rows
    # The engine dies right after shard-00000's last answer: its commit is made on the upload
    # thread as the run fails, and must still be materialized by this run.
    result = materialize(job.assets, selection=[job.keys["labeled_outputs"]], instance=inst,
                         resources=resources(fail_after=first_shard), raise_on_error=False,
                         tags={"dagster/asset_partition_range_start": "shard-00000",
                               "dagster/asset_partition_range_end": "shard-00001"})
    assert not result.success
    mats = [e.event_specific_data.materialization for e in result.all_events
            if e.event_type_value == "ASSET_MATERIALIZATION"]
    assert [(m.partition, m.metadata["computed_in_this_run"].value) for m in mats] == [("shard-00000", True)]
    version = job.current_version()
    stats = json.loads(job.home.remote.bucket.get_bytes(f"out/{version}/commits/shard-00000.json") or b"{}")
    assert mats[0].metadata["cost_usd"].value == pytest.approx(stats["stats"]["cost_usd"])


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(folder)).encode() + p.read_bytes())
    return h.hexdigest()


def test_a_refresh_never_swaps_shard_files_under_a_run(s3_bucket, tmp_path):
    a = bucket_job(tmp_path, s3_bucket, "a", n=30)
    build_shards(a.spec, a.home)
    old = (a.home.read_manifest() or {})["signature"]
    before = read_shard(a.home, "shard-00000", old)
    # Box b shards a changed input and publishes it to the bucket.
    changed = write_parquet(tmp_path / "in2" / "rows.parquet", unique_rows(31))
    b = bucket_job(tmp_path, s3_bucket, "b", input=str(changed))
    build_shards(b.spec, b.home)
    # A run on a's cache holds the shards lock shared: a refresh (status, sql...) leaves them be.
    held = a.home.shards_lock()
    held.acquire(wait=True, shared=True)
    try:
        shards = _digest(a.home.shards_dir)
        a.home.refresh()
        assert _digest(a.home.shards_dir) == shards
        assert read_shard(a.home, "shard-00000", old) == before
    finally:
        held.release()
    a.home.refresh()  # no run now: the cache follows the bucket
    assert (a.home.read_manifest() or {})["signature"] != old


def test_preview_of_a_changed_input_changes_nothing(tmp_path):
    from sparkbatch_dagster.cli.preview import planning_home, preview

    spec = make_spec(tmp_path, n=20, shards=2)
    job = build_batch_assets(spec=spec)
    build_shards(spec, job.home)
    write_parquet(Path(spec.input), unique_rows(25))  # the input changes; nothing is re-sharded yet
    before = _digest(job.home.root)
    with planning_home(job) as home:
        report = preview(job, FakeVLLMResource(), 2, home)
    assert report.rows == 25  # the preview is of the input as it is now
    assert _digest(job.home.root) == before


def test_an_engine_error_after_a_commit_raises_after_yielding_it(s3_bucket, tmp_path):
    job = bucket_job(tmp_path, s3_bucket, "a", n=40)
    build_shards(job.spec, job.home)
    n0 = pq.read_metadata(job.home.shard_path("shard-00000")).num_rows
    run = ShardRun(job.spec, job.home, VERSION, FakeEngine(fail_after=n0))
    got = []
    with pytest.raises(EngineError):
        for stats in run.stream(["shard-00000", "shard-00001"]):
            got.append(stats.partition)
    assert got == ["shard-00000"]
    assert list(committed(job.home.remote.bucket)) == ["shard-00000"]


def _instance_mats(dagster_home: Path) -> list[tuple[str, bool, float]]:
    """(partition, computed_in_this_run, cost) of every labeled_outputs materialization there."""
    from dagster import AssetKey

    with DagsterInstance.from_config(str(dagster_home)) as inst:
        records = inst.fetch_materializations(AssetKey(["things", "labeled_outputs"]), limit=1000).records
        mats = [r.asset_materialization for r in records]
        return [(m.partition or "", m.metadata["computed_in_this_run"].value, m.metadata["cost_usd"].value)
                for m in mats]


def _box_leases_expired(job: Any) -> bool:
    boxes = [p for p in job.objects("leases") if "/boxes/" in p]
    return bool(boxes) and all(json.loads(job.fs.cat_file(p)).get("expires", 0) < time.time() for p in boxes)


def test_a_box_paused_past_its_lease_stops_and_bills_the_shards_as_waste(tmp_path, s3_server):
    """Issue 29's second break, end to end: box A holds every shard and is SIGSTOPped past its
    lease; box B takes them all over and commits them; A, resumed, stops at the answer in hand,
    commits nothing, records them as done elsewhere and bills its time as waste."""
    import signal

    from e2e.test_bucket_home import SHARDS, BucketJob, _kill, _wait_for

    job = BucketJob(tmp_path, s3_server)
    gate = tmp_path / "go-a"
    a = job.start("box-a", "ta", T_LEASE="3", T_GATE=str(gate), T_GATE_AFTER="20")
    try:
        _wait_for(lambda: job.traced("ta") >= 20, a)  # every shard claimed; its engine at the gate
        a.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 120  # bounds a hang; the lease runs out in 3 s
        while not _box_leases_expired(job):
            assert time.monotonic() < deadline, "box A's lease never expired"
            time.sleep(0.2)
        summary_b, err_b = job.finish("box-b", "tb", T_LEASE="3")
        assert "took over the lease" in err_b
        gate.touch()
        a.send_signal(signal.SIGCONT)
        out, err = a.communicate(timeout=300)
        assert a.returncode == 0, err[-3000:]
    finally:
        if a.poll() is None:
            a.send_signal(signal.SIGCONT)
        _kill(a)
    assert "took over its shards" in err  # A says what happened to it
    assert job.traced("ta") <= 21  # the answer in hand when it woke up is the last it used
    job.assert_every_row_once()
    mats_a, mats_b = _instance_mats(tmp_path / "box-a" / "dagster"), _instance_mats(tmp_path / "box-b" / "dagster")
    assert len(mats_a) == SHARDS and not any(this_run for _, this_run, _ in mats_a)
    assert len(mats_b) == SHARDS and all(this_run for _, this_run, _ in mats_b)
    commits = [json.loads(job.fs.cat_file(p)) for p in job.objects("out") if "/commits/" in p]
    assert sum(c for _, _, c in mats_b) == pytest.approx(sum(c["stats"]["cost_usd"] for c in commits))
    attempts = [json.loads(job.fs.cat_file(p)) for p in job.objects("out") if "/attempts/" in p]
    a_attempt = next(r for r in attempts if "box-a" in r["box"])
    assert a_attempt["partitions_committed"] == 0 and a_attempt["wasted_usd"] == a_attempt["cost_usd"] > 0
