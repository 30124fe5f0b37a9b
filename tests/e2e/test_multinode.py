"""The tests of tests/unit/test_multinode.py that start processes: the CLI, Dagster runs (their
log capture), servers, kills. That file says what they cover."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from sparkbatch_dagster.engines.server.multinode import serve_worker
from sparkbatch_dagster.engines.server.server_process import free_port


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


def test_a_sigterm_while_the_worker_node_stops_its_vllm_waits_for_the_stop(tmp_path):
    """The worker node is stopping its headless process group (the first node's engine ended)
    when SIGTERM comes: it exits only once the group is gone. The stand-in's forked worker,
    as a busy vLLM worker may, outlives SIGTERM and needs the SIGKILL that ends the stop."""
    port, pids, termed = free_port(), tmp_path / "pids", tmp_path / "termed"
    child = ("import os,signal,sys,time\n"
             "if os.fork() == 0:\n"
             "    signal.signal(signal.SIGTERM, lambda *_: open(sys.argv[2], 'w').close())\n"
             "    open(sys.argv[1], 'a').write(f'{os.getpid()}\\n')\n"
             "while True: time.sleep(1)\n")
    node = ("import sys\n"
            "from sparkbatch_dagster.engines.server.multinode import exit_on_signals, serve_worker\n"
            "exit_on_signals()\n"
            "serve_worker([sys.executable, '-c', *sys.argv[1:4]], ('127.0.0.1', int(sys.argv[4])), poll_s=0.05)\n")
    log = tmp_path / "worker-node.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-u", "-c", node, child, str(pids), str(termed), str(port)],
                                stdout=out, start_new_session=True)
    try:
        _wait(lambda: pids.exists() and pids.read_text().endswith("\n"))
        with socket.create_server(("127.0.0.1", port)):
            _wait(lambda: "the first node's engine is up" in log.read_text())
        _wait(termed.exists)  # inside the stop: the group had its SIGTERM, the worker ignores it
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0
        assert not _alive(int(pids.read_text().split()[0]))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


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
