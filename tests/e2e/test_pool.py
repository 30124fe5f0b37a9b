"""The `gpu` pool: with its limit set to 1, a second run waits for the GPU instead of starting a
second engine next to the first (two processes, one Dagster instance, as two backfills would)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

from dagster import DagsterInstance

from testkit import SUPPORT

SCRIPT = textwrap.dedent("""
    import sys, warnings
    warnings.filterwarnings("ignore")
    sys.path.insert(0, {tests!r})
    from pathlib import Path
    from testkit import make_spec
    from dagster import DagsterInstance, materialize
    from sparkbatch_dagster import build_batch_assets
    from sparkbatch_dagster.testing import FakeVLLMResource

    name = sys.argv[1]
    job = build_batch_assets(spec=make_spec(Path({root!r}) / name, n=40, shards=1, name=name))
    inst = DagsterInstance.get()
    # The first answers once, then holds the GPU slot (its engine at the gate) until the test has
    # seen the second blocked by the pool.
    gate = dict(gate_path=str(Path({root!r}) / "go"), gate_after=1) if name == "first" else {{}}
    res = {{"vllm": FakeVLLMResource(trace_path=str(Path({root!r}) / (name + ".trace")), **gate)}}
    materialize([job.assets[0]], instance=inst, resources=res)
    key = inst.get_dynamic_partitions(job.partitions_def.name)[0]
    print("sharded", flush=True)
    sys.stdin.readline()  # both processes start labeling together
    materialize([job.assets[1]], instance=inst, resources=res, partition_key=key)
""")


def test_a_second_run_waits_for_the_gpu_pool(tmp_path):
    home = Path(os.environ["DAGSTER_HOME"])
    subprocess.run([sys.executable, "-m", "dagster", "instance", "concurrency", "set", "gpu", "1"], check=True,
                   capture_output=True, env={**os.environ})
    script = tmp_path / "one.py"
    script.write_text(SCRIPT.format(tests=str(SUPPORT), root=str(tmp_path)))
    procs = [subprocess.Popen([sys.executable, str(script), name], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, env={**os.environ, "DAGSTER_HOME": str(home)})
             for name in ("first", "second")]
    for p in procs:
        assert p.stdout and p.stdout.readline().strip() == "sharded"
    first_trace = tmp_path / "first.trace"
    inst = DagsterInstance.get()
    try:
        _go(procs[0])
        # The second starts only once the first's engine is answering: it must find the slot taken.
        _wait(lambda: first_trace.exists() and first_trace.stat().st_size > 0, procs[0])
        _go(procs[1])
        _wait(lambda: _blocked(inst) >= 1, procs[1])
        (tmp_path / "go").touch()
        assert [p.wait(timeout=300) for p in procs] == [0, 0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    windows, blocked = [], 0
    for run in inst.get_runs():
        logs = inst.all_logs(run.run_id)
        msgs = [(e.timestamp, e.user_message or "") for e in logs]
        blocked += sum("blocked by limit for pool gpu" in m for _, m in msgs)
        start = [t for t, m in msgs if m.startswith("engine loading")]
        if start:
            end = max(t for t, m in msgs if "committed:" in m)
            windows.append((start[0], end))
    assert len(windows) == 2 and blocked >= 1
    (a0, a1), (b0, b1) = sorted(windows)
    assert a1 <= b0, f"two engines ran at once: {windows}"


def _go(proc: subprocess.Popen) -> None:
    assert proc.stdin
    proc.stdin.write("go\n")
    proc.stdin.flush()


def _blocked(inst: DagsterInstance) -> int:
    """Times a step of any run was held back by the gpu pool's limit, as the event log says."""
    return sum("blocked by limit for pool gpu" in (e.user_message or "")
               for run in inst.get_runs() for e in inst.all_logs(run.run_id))


def _wait(cond: Callable[[], bool], proc: subprocess.Popen, timeout: float = 240.0) -> None:
    """Poll ``cond`` while ``proc`` lives; ``timeout`` only bounds a hang."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert proc.poll() is None, f"exited with {proc.returncode}"
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)
