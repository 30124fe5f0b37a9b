"""The tests of tests/unit/test_multinode.py that start processes: the CLI, Dagster runs (their
log capture), servers, kills. That file says what they cover."""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from sparkbatch_dagster.engines.multinode import serve_worker
from sparkbatch_dagster.engines.server_process import free_port


def test_the_worker_node_starts_a_fresh_vllm_for_each_engine_of_the_first_node(tmp_path):
    """The first node's store (here a plain listening socket) comes up and goes away twice: the
    worker node stops its headless process (and that process's children) each time and starts a
    new one. The stand-in headless process records its pid and forks a child, as vLLM's does."""
    port, starts = free_port(), tmp_path / "starts"
    child = ("import os,sys,time; open(sys.argv[1],'a').write(f'{os.getpid()}\\n'); "
             "os.fork(); time.sleep(600)")
    lines: list[str] = []
    done: dict[str, int] = {}
    worker = threading.Thread(target=lambda: done.update(code=serve_worker(
        [sys.executable, "-c", child, str(starts)], ("127.0.0.1", port), log=lines.append, poll_s=0.05)))
    worker.start()
    for engine in (1, 2):  # two engines of the first node, one after the other
        _wait(lambda: starts.exists() and len(starts.read_text().split()) == engine)
        with socket.create_server(("127.0.0.1", port)):
            _wait(lambda: lines.count("worker node: the first node's engine is up") == engine)
        _wait(lambda: lines.count("worker node: the first node's engine stopped") == engine)
    _wait(lambda: len(starts.read_text().split()) == 3)  # the next one waits for the next engine
    first, second, third = (int(x) for x in starts.read_text().split())
    assert not _alive(first) and not _alive(second) and _alive(third)
    os.killpg(third, signal.SIGKILL)  # ended by itself before any engine came: the worker node stops
    worker.join(30)
    assert not worker.is_alive() and done["code"] == -signal.SIGKILL


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _wait(cond, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
