"""Kill tests, for real: `sparkbatch run` in its own process, SIGKILLed at chosen moments,
then run again. Every input row must end up exactly once, and the restart may regenerate no
more than one checkpoint interval of rows. Also: two runs at once."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from testkit import unique_rows, write_parquet

ROOT = Path(__file__).resolve().parents[2]
N, SHARDS, EVERY = 240, 4, 10

DEFS = f"""
import os
from dagster import Definitions
from sparkbatch_dagster import JobSpec, OutputSpec, build_batch_assets
from sparkbatch_dagster.testing import FakeVLLMResource

spec = JobSpec(name="things", input=os.environ["T_INPUT"], id_column="id", text_columns=["text"],
               user_template="What is this? {{{{ text }}}}",
               output=OutputSpec(kind="label", labels=["fruit", "vehicle", "animal"]),
               shard_count={SHARDS}, gold_column="gold", home=os.environ["T_HOME"],
               checkpoint_rows={EVERY}, checkpoint_seconds=600)
job = build_batch_assets(spec=spec)
fake = {{"delay_s": float(os.environ.get("T_DELAY", "0")), "trace_path": os.environ.get("T_TRACE"),
        "gate_path": os.environ.get("T_GATE"), "gate_after": int(os.environ.get("T_GATE_AFTER", "0"))}}
defs = Definitions(assets=job.assets, resources={{"vllm": FakeVLLMResource(**fake)}})
"""


class Job:
    def __init__(self, tmp_path: Path):
        self.tmp = tmp_path
        self.input = write_parquet(tmp_path / "in" / "rows.parquet", unique_rows(N))
        self.defs = tmp_path / "defs.py"
        self.defs.write_text(DEFS)
        self.home = tmp_path / "home"
        #: The gate of a run started with ``gate_after``: its engine holds there until this file exists.
        self.gate = tmp_path / "go"

    def env(self, trace: str, delay: float = 0.0, failpoint: str | None = None,
            gate_after: int | None = None) -> dict[str, str]:
        env = {**os.environ, "T_INPUT": str(self.input), "T_HOME": str(self.home), "T_DELAY": str(delay),
               "T_TRACE": str(self.tmp / trace), "PYTHONPATH": str(ROOT)}
        env.pop("SPARKBATCH_FAILPOINT", None)
        if failpoint:
            env["SPARKBATCH_FAILPOINT"] = failpoint
        if gate_after is not None:
            env.update(T_GATE=str(self.gate), T_GATE_AFTER=str(gate_after))
        return env

    def start(self, trace: str, delay: float = 0.0, failpoint: str | None = None, *extra: str,
              gate_after: int | None = None) -> subprocess.Popen:
        """``gate_after``: the engine gives that many answers, then holds until ``self.gate`` exists."""
        return subprocess.Popen([sys.executable, "-m", "sparkbatch_dagster.cli", "run", "-f", str(self.defs), *extra],
                                env=self.env(trace, delay, failpoint, gate_after), cwd=self.tmp,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def finish(self, trace: str, *extra: str) -> subprocess.CompletedProcess:
        proc = self.start(trace, 0.0, None, *extra)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        return subprocess.CompletedProcess(proc.args, 0, out, err)

    def traced(self, trace: str) -> int:
        path = self.tmp / trace
        return len(path.read_text().splitlines()) if path.exists() else 0

    def version_dir(self) -> Path:
        [v] = list((self.home / "out").iterdir())
        return v

    def persisted(self) -> int:
        # out/ is made a moment before the version folder inside it: neither there yet, nothing persisted.
        if not (self.home / "out").exists() or not any((self.home / "out").iterdir()):
            return 0
        total = 0
        for i in range(SHARDS):  # a finalized shard counts once, even if its parts are not yet removed
            final = self.version_dir() / "labeled" / f"shard-{i:05d}.parquet"
            files = [final] if final.exists() else self.version_dir().glob(f"parts/shard-{i:05d}/part-*.parquet")
            total += sum(pq.read_metadata(f).num_rows for f in files)
        return total

    def assert_every_row_once(self) -> None:
        ids = [i for f in sorted(self.version_dir().glob("labeled/*.parquet"))
               for i in pq.read_table(f).column("row_id").to_pylist()]
        assert len(ids) == N and set(ids) == {f"id-{i:05d}" for i in range(N)}
        assert not list(self.version_dir().glob("parts/*/part-*"))


def _wait_for(predicate, proc: subprocess.Popen, timeout: float = 240.0) -> None:
    """Poll ``predicate`` while ``proc`` lives; ``timeout`` only bounds a hang."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, proc.stderr.read()[-3000:] if proc.stderr else "process ended"
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def _kill(*procs: subprocess.Popen) -> None:
    """SIGKILL whichever still runs (a failed test leaves no run held at its gate) and reap it."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.communicate()


def test_kill_during_generation_loses_at_most_one_checkpoint(tmp_path):
    job = Job(tmp_path)
    # 35 answers, then the engine holds (the gate is never opened): the kill lands mid-shard,
    # after three checkpoints, whatever the machine's speed.
    proc = job.start("t1", gate_after=3 * EVERY + 5)
    try:  # killed once the engine is at its gate (every answer traced) and three checkpoints are down
        _wait_for(lambda: job.traced("t1") == 3 * EVERY + 5 and job.persisted() >= 3 * EVERY, proc)
    finally:
        _kill(proc)
    generated, persisted = job.traced("t1"), job.persisted()
    assert generated == 3 * EVERY + 5 and generated - persisted <= EVERY  # what the crash cost
    done = job.finish("t2")
    assert job.traced("t2") == N - persisted  # only the missing rows were sent again
    job.assert_every_row_once()
    # The killed attempt is billed too: found by the rerun (its lock free, no end written).
    summary = json.loads(done.stdout.splitlines()[-1])
    records = [json.loads(f.read_text()) for f in (job.version_dir() / "attempts").glob("*.json")]
    killed, clean = sorted(records, key=lambda r: r["started"])
    assert killed["outcome"] == "killed" and clean["outcome"] == "succeeded"
    assert killed["rows_committed"] == 0 and clean["rows_committed"] == N
    assert summary["attempts"] == 2 and summary["wasted_usd"] >= killed["wasted_usd"]


def test_kill_between_partitions_keeps_finished_shards(tmp_path):
    job = Job(tmp_path)
    # 100 answers, then the engine holds: past the first shard (rows go to shards by a hash of
    # their id: about 60 each) and short of the second's end, so the kill lands between them.
    proc = job.start("t1", gate_after=100)
    try:  # killed once the engine is at its gate (every answer traced) and a shard is committed
        _wait_for(lambda: job.traced("t1") == 100 and (job.home / "out").exists()
                  and any(job.version_dir().glob("labeled/*.parquet")), proc)
    finally:
        _kill(proc)
    done = {f.name: f.stat().st_mtime_ns for f in job.version_dir().glob("labeled/*.parquet")}
    generated, persisted = job.traced("t1"), job.persisted()
    assert generated - persisted <= EVERY
    job.finish("t2")
    assert job.traced("t2") == N - persisted
    assert all(job.version_dir().joinpath("labeled", n).stat().st_mtime_ns == m for n, m in done.items())
    job.assert_every_row_once()


@pytest.mark.parametrize("failpoint", ["shards:moving", "finalize:stats", "finalize:committed"])
def test_kill_at_exact_points(tmp_path, failpoint):
    job = Job(tmp_path)
    proc = job.start("t1", 0.0, failpoint)
    proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL
    persisted = job.persisted()
    out = job.finish("t2")
    assert job.traced("t2") == N - persisted
    job.assert_every_row_once()
    assert '"partitions_done": 4' in out.stdout
    with duckdb.connect(str(job.home / "metrics.duckdb"), read_only=True) as con:
        assert con.execute("SELECT count(*), sum(rows) FROM run_metrics").fetchone() == (4, N)


def test_two_processes_on_different_partitions_both_succeed(tmp_path):
    job = Job(tmp_path)
    a = job.start("ta", 0.005, None, "--range", "shard-00000:shard-00001")
    b = job.start("tb", 0.005, None, "--range", "shard-00002:shard-00003")
    for p in (a, b):
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    job.assert_every_row_once()
    assert job.traced("ta") + job.traced("tb") == N
    with duckdb.connect(str(job.home / "metrics.duckdb"), read_only=True) as con:
        assert con.execute("SELECT count(*), sum(rows) FROM run_metrics").fetchone() == (4, N)


def test_second_run_on_the_same_partition_stops_with_a_clear_message(tmp_path):
    job = Job(tmp_path)
    job.finish("t0", "--range", "shard-00003:shard-00003")  # shards exist; one partition done
    # The first run answers once, then holds the partition (its engine at the gate) until the
    # second has been refused, however long the second takes to start.
    first = job.start("t1", 0.0, None, "--range", "shard-00000:shard-00000", gate_after=1)
    second = None
    try:
        _wait_for(lambda: job.traced("t1") > 0, first)
        second = job.start("t2", 0.0, None, "--range", "shard-00000:shard-00000")
        _, err = second.communicate(timeout=300)
        assert second.returncode != 0
        assert "shard-00000 is being written by another run" in err
        job.gate.touch()
        _, err = first.communicate(timeout=300)
        assert first.returncode == 0, err[-3000:]
    finally:
        _kill(first, *([second] if second else []))
    assert job.traced("t2") == 0
    assert job.traced("t1") == pq.read_metadata(job.version_dir() / "labeled" / "shard-00000.parquet").num_rows
