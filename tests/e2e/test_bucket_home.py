"""A job whose home is a bucket, for real: `sparkbatch run` in its own process against moto's S3
server on loopback (s3fs the client), killed at chosen moments, resumed by a "new box" (an
empty local folder and a new DAGSTER_HOME), run through a store that fails, and run twice at once.
Every input row must end up in the bucket exactly once, committed once, and no row the bucket
holds (committed or checkpointed) may be generated again."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from testkit import unique_rows, write_parquet

ROOT = Path(__file__).resolve().parents[2]
N, SHARDS = 240, 4

DEFS = f"""
import os
from dagster import Definitions
from sparkbatch_dagster import JobSpec, OutputSpec, build_batch_assets
from sparkbatch_dagster.testing import FakeVLLMResource

spec = JobSpec(name="things", input=os.environ["T_INPUT"], id_column="id", text_columns=["text"],
               user_template="What is this? {{{{ text }}}}",
               output=OutputSpec(kind="label", labels=["fruit", "vehicle", "animal"]),
               shard_count={SHARDS}, gold_column="gold", home=os.environ["T_HOME"],
               cache_dir=os.environ["T_CACHE"], lease_seconds=float(os.environ.get("T_LEASE", "60")),
               checkpoint_rows=10, checkpoint_seconds=0.3)
job = build_batch_assets(spec=spec)
fake = {{"delay_s": float(os.environ.get("T_DELAY", "0")), "trace_path": os.environ.get("T_TRACE"),
        "gate_path": os.environ.get("T_GATE"), "gate_after": int(os.environ.get("T_GATE_AFTER", "0"))}}
defs = Definitions(assets=job.assets, resources={{"vllm": FakeVLLMResource(**fake)}})
"""


class BucketJob:
    """One job definition, run from any number of "boxes" (a local folder + a DAGSTER_HOME each)."""

    def __init__(self, tmp_path: Path, server: Any, endpoint: str | None = None) -> None:
        self.tmp, self.server = tmp_path, server
        self.bucket = server.new_bucket()
        self.url = f"s3://{self.bucket}/jobs/things"
        self.endpoint = endpoint or server.endpoint_url
        self.input = write_parquet(tmp_path / "in" / "rows.parquet", unique_rows(N))
        self.defs = tmp_path / "defs.py"
        self.defs.write_text(DEFS)
        self.fs = server.fs()

    def env(self, box: str, trace: str, **extra: str) -> dict[str, str]:
        (self.tmp / box / "dagster").mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.server.env(), "AWS_ENDPOINT_URL": self.endpoint, "T_INPUT": str(self.input),
               "T_HOME": self.url, "T_CACHE": str(self.tmp / box / "cache"), "T_TRACE": str(self.tmp / trace),
               "DAGSTER_HOME": str(self.tmp / box / "dagster"), "PYTHONPATH": str(ROOT), **extra}
        if "SPARKBATCH_FAILPOINT" not in extra:
            env.pop("SPARKBATCH_FAILPOINT", None)
        return env

    def start(self, box: str, trace: str, *args: str, stderr_to: Path | None = None,
              **extra: str) -> subprocess.Popen:
        """``stderr_to``: a file for its stderr (read while it runs) instead of a pipe."""
        err = stderr_to.open("w") if stderr_to else subprocess.PIPE
        try:
            return subprocess.Popen([sys.executable, "-m", "sparkbatch_dagster.cli", *(args or ("run",)), "-f",
                                     str(self.defs)], env=self.env(box, trace, **extra), cwd=self.tmp / box,
                                    stdout=subprocess.PIPE, stderr=err, text=True)
        finally:
            if stderr_to:
                err.close()  # the child has its own copy

    def finish(self, box: str, trace: str, *args: str, **extra: str) -> tuple[dict[str, Any], str]:
        proc = self.start(box, trace, *args, **extra)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        return json.loads(out.splitlines()[-1]), err

    def traced(self, trace: str) -> int:
        path = self.tmp / trace
        return len(path.read_text().splitlines()) if path.exists() else 0

    def objects(self, under: str) -> list[str]:
        self.fs.invalidate_cache()
        try:
            return sorted(self.fs.find(f"{self.bucket}/jobs/things/{under}"))
        except FileNotFoundError:
            return []

    def version(self) -> str:
        versions = {p.split("/out/", 1)[1].split("/", 1)[0] for p in self.objects("out")}
        assert len(versions) == 1, versions
        return versions.pop()

    def rows_in(self, paths: list[str]) -> list[str]:
        ids = []
        for p in paths:
            try:
                data = self.fs.cat_file(p)
            except FileNotFoundError:  # a live run dropped the part between our listing and this read
                continue
            ids += pq.read_table(io.BytesIO(data)).column("row_id").to_pylist()
        return ids

    def committed(self) -> list[str]:
        """Row ids of every labeled object a commit names (what readers trust), in commit order."""
        commits = [json.loads(self.fs.cat_file(p)) for p in self.objects("out") if "/commits/" in p]
        return self.rows_in([f"{self.bucket}/jobs/things/{c['labeled']}" for c in commits])

    def in_bucket(self) -> int:
        """Rows the bucket holds: committed, or in checkpoint parts of uncommitted shards."""
        if not self.objects("out"):
            return 0
        committed = {p.rsplit("/", 1)[1].removesuffix(".json") for p in self.objects("out") if "/commits/" in p}
        parts = [p for p in self.objects("out")
                 if "/parts/" in p and p.split("/parts/")[1].split("/")[0] not in committed]
        return len(set(self.committed())) + len(set(self.rows_in(parts)))

    def assert_every_row_once(self) -> None:
        ids = self.committed()
        assert len(ids) == N and set(ids) == {f"id-{i:05d}" for i in range(N)}
        commits = [p for p in self.objects("out") if "/commits/" in p]
        assert len(commits) == SHARDS
        assert not [p for p in self.objects("out") if "/parts/" in p]  # committed shards keep no parts
        assert not self.objects("leases")  # every lease released


def _wait_for(predicate: Any, proc: subprocess.Popen, timeout: float = 240.0) -> None:
    """Poll ``predicate`` while ``proc`` lives; ``timeout`` only bounds a hang."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, proc.stderr.read()[-3000:] if proc.stderr else "process ended"
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def _kill(*procs: subprocess.Popen) -> None:
    """A failed test leaves no box running (one held at its gate would wait for nothing)."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.communicate()


def _claims(job: BucketJob) -> list[str]:
    """The shards' lease objects (``.../shard-NNNNN.json``), whatever else ``leases/`` holds."""
    return [p for p in job.objects("leases") if p.rsplit("/", 1)[1].startswith("shard-")]


def test_the_whole_job_lives_in_the_bucket_and_a_new_box_sees_it(tmp_path, s3_server):
    job = BucketJob(tmp_path, s3_server)
    summary, _ = job.finish("box-a", "t1")
    assert summary["partitions_done"] == SHARDS and job.traced("t1") == N
    job.assert_every_row_once()
    assert [p.rsplit("/", 1)[1] for p in job.objects("shards")][-1] == "manifest.json"
    assert len([p for p in job.objects("out") if "/attempts/" in p]) == 1
    # A new box: nothing local, a new Dagster instance. It reads everything from the bucket.
    status, _ = job.finish("box-b", "t2", "status")
    assert status["partitions_done"] == SHARDS and status["missing"] == []
    proc = subprocess.run([sys.executable, "-m", "sparkbatch_dagster.cli", "sql", "-f", str(job.defs),
                           "SELECT sum(rows), count(*) FROM run_metrics"], env=job.env("box-b", "t2"),
                          cwd=tmp_path / "box-b", capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.splitlines()[-1])["rows"] == [[N, SHARDS]]
    # The UI's partitions on box-b: the instance `sparkbatch status` opened knows all of them as done.
    from dagster import AssetKey, DagsterInstance

    with DagsterInstance.from_config(str(tmp_path / "box-b" / "dagster")) as inst:
        done = inst.get_materialized_partitions(AssetKey(["things", "labeled_outputs"]))
    assert sorted(done) == [f"shard-{i:05d}" for i in range(SHARDS)]
    rerun, _ = job.finish("box-b", "t3")
    assert job.traced("t2") == 0 and job.traced("t3") == 0 and rerun["partitions_done"] == SHARDS


def test_sigkill_mid_generation_then_a_new_box_continues(tmp_path, s3_server):
    job = BucketJob(tmp_path, s3_server)
    # 70 answers (the first shard, ~60 rows, and the start of the next), then the engine holds at
    # a gate never opened: the kill lands mid-job, once those rows are in the bucket, however
    # slow the machine.
    proc = job.start("box-a", "t1", T_LEASE="2", T_GATE=str(tmp_path / "never"), T_GATE_AFTER="70")
    try:
        _wait_for(lambda: job.in_bucket() >= 70, proc)
    finally:
        _kill(proc)
    killed_at = time.monotonic()
    kept = job.in_bucket()
    assert kept == 70 == job.traced("t1")  # killed mid-job, every answer in the bucket
    summary, err = job.finish("box-b", "t2", T_LEASE="2")
    assert job.traced("t2") == N - kept  # what the bucket held was not generated again
    job.assert_every_row_once()
    assert "took over the lease" in err or "waiting" in err  # box-a's leases outlived it
    assert summary["attempts"] == 2 and summary["wasted_usd"] > 0  # the killed attempt is billed
    # Once its heartbeat is two leases old, any reader counts box-a's attempt killed, in the bucket too.
    time.sleep(max(0.0, killed_at + 2 * 2 + 1 - time.monotonic()))
    proc = subprocess.run([sys.executable, "-m", "sparkbatch_dagster.cli", "sql", "-f", str(job.defs),
                           "SELECT outcome FROM attempts ORDER BY started"], env=job.env("box-c", "t3", T_LEASE="2"),
                          cwd=job.tmp / "box-c", capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.splitlines()[-1])["rows"] == [["killed"], ["succeeded"]]
    outcomes = sorted(json.loads(job.fs.cat_file(p))["outcome"] for p in job.objects("out") if "/attempts/" in p)
    assert outcomes == ["killed", "succeeded"]


# finalize:committed on a folder home is in make test (test_crash_resume); on a bucket home, in make soak.
@pytest.mark.parametrize("when", ["bucket:commit", pytest.param("finalize:committed", marks=pytest.mark.long)])
def test_sigkill_during_the_commit_upload_then_a_new_box(tmp_path, s3_server, when):
    job = BucketJob(tmp_path, s3_server)
    proc = job.start("box-a", "t1", T_LEASE="2", SPARKBATCH_FAILPOINT=when)
    proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL
    assert not [p for p in job.objects("out") if "/commits/" in p]  # nothing committed in the bucket
    kept = job.in_bucket()
    job.finish("box-b", "t2", T_LEASE="2")
    assert job.traced("t2") == N - kept
    job.assert_every_row_once()
    # The first box's labeled object (uploaded, never committed) is not read by anyone; the
    # shard is committed once, by the second box.
    commits = [json.loads(job.fs.cat_file(p)) for p in job.objects("out") if "/commits/" in p]
    assert len({c["attempt"] for c in commits}) == 1


def test_sigkill_while_a_part_upload_is_in_flight(tmp_path, s3_server, fault_proxy):
    job = BucketJob(tmp_path, s3_server, endpoint=fault_proxy.url)
    gate = tmp_path / "go-a"
    # 45 answers, then the engine holds: its parts are in the bucket before the proxy starts to
    # hold part PUTs, and the next part (once the gate opens) is sure to be held.
    proc = job.start("box-a", "t1", T_DELAY="0.03", T_LEASE="2", T_GATE=str(gate), T_GATE_AFTER="45")
    try:
        _wait_for(lambda: job.in_bucket() >= 40, proc)
        fault_proxy.set(delay_rate=1.0, delay_s=3.0, methods=("PUT",), path_contains="/parts/")
        gate.touch()
        # Every part PUT from here is held 3 s: the run cannot end (it waits for its uploads) first.
        _wait_for(lambda: fault_proxy.counts["delays"] >= 1, proc)
    finally:
        _kill(proc)  # a part's PUT is held in the proxy, its client now gone
    # The held PUT lands (or not) before the new box looks, either is fine; the proxy says when
    # it has ended. The new box goes straight to the store.
    fault_proxy.stop()
    fault_proxy.wait_closed()
    kept = job.in_bucket()
    job.finish("box-b", "t2", T_LEASE="2", AWS_ENDPOINT_URL=s3_server.endpoint_url)
    assert job.traced("t2") == N - kept
    job.assert_every_row_once()


def test_a_failing_store_is_retried_and_nothing_is_committed_twice(tmp_path, s3_server, fault_proxy):
    job = BucketJob(tmp_path, s3_server, endpoint=fault_proxy.url)
    fault_proxy.set(error_rate=0.15, codes=(500, 503), delay_rate=0.1, delay_s=0.3, drop_rate=0.05,
                    drop_after_upstream_rate=0.05, seed=7)
    summary, _ = job.finish("box-a", "t1")
    counts = dict(fault_proxy.counts)
    fault_proxy.clear()
    assert counts["errors"] > 0 and counts["drops"] + counts["drops_after_upstream"] > 0 and counts["delays"] > 0
    assert summary["partitions_done"] == SHARDS and job.traced("t1") == N  # every row generated once
    job.assert_every_row_once()
    labeled = [p for p in job.objects("out") if "/labeled/" in p]
    assert len(labeled) == SHARDS  # one output object per shard: none written twice under two names


def test_a_second_box_started_at_once_waits_for_the_leases(tmp_path, s3_server):
    job = BucketJob(tmp_path, s3_server)
    gate, err_file = tmp_path / "go-a", tmp_path / "box-b.err"
    # Box A leases every shard, then its engine holds before its first answer until the gate
    # opens: box B is started, and seen waiting on A's leases, while A still holds them all,
    # however slow the machine. Then A goes on; B takes each lease as A releases it.
    first = job.start("box-a", "t1", T_GATE=str(gate), T_GATE_AFTER="0")
    second = None
    try:
        _wait_for(lambda: len(_claims(job)) == SHARDS, first)
        second = job.start("box-b", "t2", stderr_to=err_file)
        _wait_for(lambda: "leased by" in err_file.read_text(), second)
        gate.touch()
        out_a, err_a = first.communicate(timeout=300)
        second.communicate(timeout=300)
    finally:
        _kill(first, *([second] if second else []))
    err_b = err_file.read_text()
    assert first.returncode == 0, err_a[-3000:]
    assert second.returncode == 0, err_b[-3000:]
    assert job.traced("t1") == N and job.traced("t2") == 0  # B generated nothing A held
    job.assert_every_row_once()
    assert "leased by" in err_b and "waiting" in err_b  # box-b said whose lease it waited for


def test_bad_credentials_and_a_missing_bucket_stop_before_any_engine(tmp_path, s3_server):
    job = BucketJob(tmp_path, s3_server)
    proc = job.start("box-a", "t1", AWS_SECRET_ACCESS_KEY="wrong")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode != 0
    [line] = [x for x in err.splitlines() if x.strip()][-1:]
    assert f"home {job.url}: the store refused these credentials" in line and "AWS_SECRET_ACCESS_KEY" in line
    assert "wrong" not in err and job.traced("t1") == 0
    proc = job.start("box-a", "t2", T_HOME="s3://no-such-bucket-x/jobs/things")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode != 0
    assert "home s3://no-such-bucket-x/jobs/things: bucket 'no-such-bucket-x' does not exist" in err.splitlines()[-1]
    assert job.traced("t2") == 0
