"""The tests of tests/unit/test_gpu_lock.py that start processes: the CLI, Dagster runs (their
log capture), servers, kills. That file says what they cover."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading

import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance, materialize

from sparkbatch_dagster import build_batch_assets
from sparkbatch_dagster.cli.commands import RANGE_END, RANGE_START
from sparkbatch_dagster.engines.gpu_lock import DeviceLock, lock_path
from sparkbatch_dagster.testing import FakeVLLMResource
from testkit import SUPPORT, make_spec, unique_rows, write_parquet
from unit.test_gpu_lock import WAIT_S, held_elsewhere, wait_until

TESTS = SUPPORT



# --- the lock itself ------------------------------------------------------------------------------


HOLDER = textwrap.dedent("""
    import sys
    from sparkbatch_dagster.engines.gpu_lock import DeviceLock
    DeviceLock.acquire(sys.argv[1:], {"run_id": "the-other-run"}, log=print)
    print("held", flush=True)
    sys.stdin.readline()
""")


def hold_in_another_process(*devices: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, *devices], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env={**os.environ})
    assert proc.stdout and proc.stdout.readline().strip() == "held"
    return proc


def test_a_start_waits_for_the_gpu_another_process_holds_and_says_whose_it_is(_gpu_lock_dir):
    other = hold_in_another_process("0")
    warned, got = threading.Event(), threading.Event()
    lines: list[str] = []
    locks: list[DeviceLock] = []

    def take() -> None:
        locks.append(DeviceLock.acquire(["1", "0"], {"run_id": "this-run"},
                                        log=lambda line: (lines.append(line), warned.set())))
        got.set()

    worker = threading.Thread(target=take, daemon=True)
    try:
        worker.start()
        assert warned.wait(WAIT_S)
        assert not got.is_set()  # still waiting: the other process holds GPU 0
        assert len(lines) == 1 and lines[0].startswith("GPU 0 is held by another engine on this box: Dagster run "
                                                       f"the-other-run (pid {other.pid}, since ")
        assert "waits for it to stop" in lines[0] and "CUDA_VISIBLE_DEVICES" in lines[0]
    finally:
        assert other.stdin
        other.stdin.write("go\n")
        other.stdin.close()
        other.wait(timeout=WAIT_S)
    worker.join(WAIT_S)
    assert got.is_set() and locks[0].waited_s > 0
    holder = json.loads(lock_path("0").read_text())
    assert holder["run_id"] == "this-run" and holder["pid"] == os.getpid() and holder["device"] == "0"
    locks[0].release()
    assert not held_elsewhere(lock_path("0")) and not held_elsewhere(lock_path("1"))
    assert lock_path("0").read_text() == ""  # no stale holder for the next reader


def test_a_killed_holder_frees_its_gpus_at_once(_gpu_lock_dir):
    other = hold_in_another_process("cpu0")
    assert held_elsewhere(lock_path("cpu0"))
    other.kill()  # SIGKILL: no close, no release; the OS drops the flock with the process
    other.wait(timeout=WAIT_S)
    lock = DeviceLock.acquire(["cpu0"], {"run_id": "next"}, log=pytest.fail)  # no wait, no warning
    assert lock.waited_s == 0.0
    lock.release()


UNGUARDED = textwrap.dedent("""
    import multiprocessing
    from sparkbatch_dagster.testing import FakeVLLMResource

    engine = FakeVLLMResource(gpu_lock=True).get_engine()  # at the top level, as a quick script has it


    def child():
        pass


    if multiprocessing.parent_process() is None:  # vLLM's engine core, started as vLLM starts it
        proc = multiprocessing.get_context("spawn").Process(target=child)
        proc.start()
        proc.join()
        print("child exit code", proc.exitcode, flush=True)
""")


def test_an_engine_started_again_as_a_spawned_child_reruns_the_script_names_the_fix(tmp_path):
    """vLLM's engine core is spawned, and first re-runs the script: one that starts its engine at its
    top level would start it again there and wait on its parent's lock for ever."""
    script = tmp_path / "label.py"
    script.write_text(UNGUARDED)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=WAIT_S,
                          cwd=tmp_path, env={**os.environ})
    assert "child exit code 1" in done.stdout, done.stderr
    assert "ConfigError" in done.stderr and 'if __name__ == "__main__":' in done.stderr


AT_EXIT = textwrap.dedent("""
    from sparkbatch_dagster.engines import FakeEngine
    from sparkbatch_dagster.engines.gpu_lock import HeldEngine

    class Engine(FakeEngine):
        def close(self):
            print("stopped", flush=True)

    class Run:
        \"\"\"Torn down only by the interpreter's last collection, as a run's resources are after a
        SIGTERM's exit (a generator Dagster never closed).\"\"\"

        def __init__(self):
            self.held, self.cycle = HeldEngine.start(["7"], {"run_id": "r"}, print, Engine), self

        def __del__(self):
            self.held.close(background=True)

    Run()
""")


def test_an_engine_stopped_as_the_interpreter_exits_stops_there_and_then():
    """No thread can start then (Thread.start() waited forever: a killed `serve-batch`'s run-batch
    child never exited): the stop runs on the spot."""
    proc = subprocess.run([sys.executable, "-c", AT_EXIT], capture_output=True, text=True, timeout=60,
                          env={**os.environ})
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1] == "stopped", proc.stderr[-2000:]


def test_a_run_whose_answers_are_all_stored_takes_no_lock(tmp_path, monkeypatch, _gpu_lock_dir):
    job = build_batch_assets(spec=make_spec(tmp_path, n=30, shards=2))
    res = {"vllm": FakeVLLMResource(gpu_lock=True)}
    inst = DagsterInstance.get()
    assert materialize(job.assets, selection=[job.keys["input_shards"]], resources=res, instance=inst).success
    keys = sorted(inst.get_dynamic_partitions(job.partitions_def.name))
    tags = {RANGE_START: keys[0], RANGE_END: keys[-1]}
    assert materialize([job.assets[1]], resources=res, instance=inst, tags=tags).success
    assert lock_path("cpu0").exists()
    for key in keys:  # lost outputs; their answers are still in the result store
        job.home.labeled_path(job.current_version(), key).unlink()
    monkeypatch.setenv("SPARKBATCH_GPU_LOCK_DIR", str(tmp_path / "second-locks"))
    assert materialize([job.assets[1]], resources=res, instance=inst, tags=tags).success
    assert not (tmp_path / "second-locks").exists()  # no engine started, so no lock taken


# --- a scattered backfill without a pool limit -----------------------------------------------------


RUN = textwrap.dedent("""
    import sys, time, warnings
    warnings.filterwarnings("ignore")
    sys.path.insert(0, {tests!r})
    from pathlib import Path
    from testkit import make_spec
    from dagster import DagsterInstance, materialize
    from sparkbatch_dagster import build_batch_assets
    from sparkbatch_dagster.engines import FakeEngine
    from sparkbatch_dagster.testing import FakeVLLMResource

    root = Path({root!r})
    name, first, last = sys.argv[1:4]

    def mark(event):  # one line per engine start and close, appended: their order is the file's
        with open(root / "engines.trace", "a") as f:
            f.write(event + " " + name + "\\n")

    class Traced(FakeEngine):
        def __init__(self, **kw):
            super().__init__(**kw)
            mark("start")

        def generate(self, requests, sampling, output):
            while not (root / ("go-" + name)).exists():  # the test says when this engine may answer
                time.sleep(0.02)
            yield from super().generate(requests, sampling, output)

        def close(self):
            mark("close")
            super().close()

    class TracedResource(FakeVLLMResource):
        def _start(self):
            return Traced(model_id=self.model_identity())

    job = build_batch_assets(spec=make_spec(root, n=80, shards=8))
    tags = {{"dagster/asset_partition_range_start": first, "dagster/asset_partition_range_end": last,
             "test/name": name}}
    res = {{"vllm": TracedResource(gpu_lock=True)}}
    result = materialize([job.assets[1]], instance=DagsterInstance.get(), resources=res, tags=tags)
    sys.exit(0 if result.success else 1)
""")


def _shard_of(row_id: str, shards: int = 8) -> int:
    """Which shard sharding puts a row in (md5 of its id: inputs/shards.py); checked below."""
    return int(hashlib.md5(row_id.encode()).hexdigest()[:15], 16) % shards


def _waits(inst: DagsterInstance) -> dict[str, list[str]]:
    """Each run's WARNINGs about a GPU held by another engine, by the run's test name."""
    found: dict[str, list[str]] = {}
    for run in inst.get_runs():
        lines = [e.user_message for e in inst.all_logs(run.run_id)
                 if e.level == logging.WARNING and "is held by another engine" in (e.user_message or "")]
        if lines:
            found[run.tags["test/name"]] = lines
    return found


def test_a_scattered_backfill_without_a_pool_limit_runs_one_engine_at_a_time(tmp_path):
    """Partitions 1, 4-5 and 6 of 8 as three runs started together in an instance with no `gpu`
    pool limit (a user's own `dagster dev`): each run's engine starts only once the one before
    it has closed; the runs that waited say whose engine they waited for; the run that waited
    reuses the answers the first one stored."""
    rows = unique_rows(80)
    shared = [r for r in rows if _shard_of(r["id"]) in (1, 5)]
    one, five = next(r for r in shared if _shard_of(r["id"]) == 1), next(r for r in shared if _shard_of(r["id"]) == 5)
    one["text"] = five["text"] = "A shared thing, asked in partitions 1 and 5."
    # Two more, shared by partitions 1 and 4 (B's first shard, looked up before B waited for the
    # GPU): B looks its unsent prompts up again once it has the GPU. Two, because the one B sent
    # first (before it waited) is generated whatever the store holds.
    ones = [r for r in rows if _shard_of(r["id"]) == 1 and r is not one][:2]
    fours = [r for r in rows if _shard_of(r["id"]) == 4][:2]
    for n, (a, b) in enumerate(zip(ones, fours, strict=True)):
        a["text"] = b["text"] = f"Shared thing number {n}, asked in partitions 1 and 4."
    write_parquet(tmp_path / "in" / "rows.parquet", rows)
    job = build_batch_assets(spec=make_spec(tmp_path, n=80, shards=8))
    inst = DagsterInstance.get()  # a fresh instance: no concurrency limit on any pool
    assert materialize([job.assets[0]], instance=inst).success
    keys = sorted(inst.get_dynamic_partitions(job.partitions_def.name))
    assert one["id"] in pq.read_table(job.home.shard_path(keys[1])).column("row_id").to_pylist()
    assert five["id"] in pq.read_table(job.home.shard_path(keys[5])).column("row_id").to_pylist()

    script = tmp_path / "run.py"
    script.write_text(RUN.format(tests=str(TESTS), root=str(tmp_path)))
    trace = tmp_path / "engines.trace"
    procs: dict[str, subprocess.Popen] = {}

    def start(name: str, first: str, last: str) -> None:
        err = open(tmp_path / f"{name}.err", "w")  # noqa: SIM115 - the process writes it
        procs[name] = subprocess.Popen([sys.executable, str(script), name, first, last], stdout=subprocess.DEVNULL,
                                       stderr=err, env={**os.environ})

    def events() -> list[str]:
        return trace.read_text().splitlines() if trace.exists() else []

    def live() -> set[str]:
        started = {e.split()[1] for e in events() if e.startswith("start")}
        return started - {e.split()[1] for e in events() if e.startswith("close")}

    def check() -> None:
        assert len(live()) <= 1, f"two engines at once: {events()}"
        for name, p in procs.items():
            assert p.poll() in (None, 0), f"{name} failed: {(tmp_path / f'{name}.err').read_text()[-3000:]}"

    def explain() -> str:
        return f"trace {events()}, waits {_waits(inst)}"

    def a_started() -> bool:
        check()
        return "start A" in events()

    def b_and_c_wait() -> bool:
        check()
        return {"B", "C"} <= set(_waits(inst))

    try:
        start("A", keys[1], keys[1])
        wait_until("A's engine started", a_started, explain)
        start("B", keys[4], keys[5])
        start("C", keys[6], keys[6])
        # Both wait for A's engine, said in their own run's log, while A's engine lives (held at its gate).
        wait_until("B and C wait for A's GPU", b_and_c_wait, explain)
        released: set[str] = set()

        def step() -> bool:
            check()
            for name in live() - released:  # the one live engine may answer now
                (tmp_path / f"go-{name}").touch()
                released.add(name)
            return all(p.poll() is not None for p in procs.values())

        wait_until("every run ends", step, explain)
        check()
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()

    order = events()
    assert len(order) == 6 and order[:2] == ["start A", "close A"], order
    assert [e.split()[0] for e in order] == ["start", "close"] * 3  # never two engines at once
    assert all(order[i].split()[1] == order[i + 1].split()[1] for i in range(0, 6, 2))
    runs = {r.tags["test/name"]: r.run_id for r in inst.get_runs() if "test/name" in r.tags}
    for name in ("B", "C"):
        assert any(f"Dagster run {runs['A']} (pid {procs['A'].pid}" in w for w in _waits(inst)[name])
    version = job.current_version()
    assert all(job.home.is_done(version, keys[k]) for k in (1, 4, 5, 6))
    # B waited for A, then its partition 5 found A's answer in the result store instead of asking again.
    stats = json.loads(job.home.stats_path(version, keys[5]).read_text())
    assert stats["reused_rows"] >= 1, stats
    # And so did B's first partition, looked up again once B had the GPU.
    first = json.loads(job.home.stats_path(version, keys[4]).read_text())
    assert first["reused_rows"] >= 1, first
