"""Children this process owns (``vllm serve``, a multinode worker) die with the process, not with
the thread that started them: a run's engine starts on a thread of its own (``LazyEngine``)."""

import os
import subprocess
import sys
import threading
import time

from sparkbatch_dagster.engines.platform.processes import die_with_parent, spawn_owned, stop_group

ECHO = [sys.executable, "-c", "import sys\nfor line in sys.stdin: print(line.strip(), flush=True)"]


def _start_on_a_thread_that_ends(start) -> subprocess.Popen:
    got: dict = {}

    def run() -> None:
        got["proc"], got["tid"] = start(), threading.get_native_id()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    # join() returns before the kernel has ended the thread; its death signal is sent then.
    while os.path.exists(f"/proc/self/task/{got['tid']}"):
        time.sleep(0.01)
    return got["proc"]


def _answers(proc: subprocess.Popen) -> str:
    try:
        proc.stdin.write("alive\n")
        proc.stdin.flush()
    except BrokenPipeError:
        return ""
    return proc.stdout.readline().strip()


def test_an_owned_child_outlives_the_thread_that_started_it():
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True}
    owned = _start_on_a_thread_that_ends(lambda: spawn_owned(ECHO, **pipes))
    # What the kernel does with PR_SET_PDEATHSIG set from a thread that ends: the child gets SIGTERM.
    plain = _start_on_a_thread_that_ends(
        lambda: subprocess.Popen(ECHO, preexec_fn=die_with_parent, start_new_session=True, **pipes))  # noqa: PLW1509
    try:
        assert _answers(owned) == "alive"
        assert plain.wait(timeout=60) == -15  # the timeout only bounds a hang
    finally:
        for proc in (owned, plain):
            proc.kill()
            proc.wait()


def test_an_owned_child_dies_with_this_process():
    assert not _left_behind_by(setup="")


def test_an_owned_child_dies_with_its_process_even_where_sigterm_is_ignored():
    """A parent that ignores SIGTERM (a Dagster worker, a test runner) does not hand that on."""
    assert not _left_behind_by(setup="signal.signal(signal.SIGTERM, signal.SIG_IGN); ")


def _left_behind_by(setup: str) -> bool:
    """Whether a process that ran ``setup`` and started an owned child leaves it running once it exits."""
    code = ("import signal, subprocess; "
            "from sparkbatch_dagster.engines.platform.processes import spawn_owned; " + setup
            + "p = spawn_owned(['sleep', '600'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
            "print(p.pid, flush=True)")
    parent = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    pid = int(parent.stdout)
    deadline = time.monotonic() + 60  # bounds a failure: the kernel signals it as the parent exits
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _running(pid)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


#: A group's leader that dies at SIGTERM, and its child that takes a while to clean up at SIGTERM
#: (as vLLM's engine core and workers do) and writes argv[1] when done.
SLOW_CHILD = ("import signal, sys, time\n"
              "def bye(*_):\n    time.sleep(0.5)\n    open(sys.argv[1], 'w').close()\n    sys.exit(0)\n"
              "signal.signal(signal.SIGTERM, bye)\nprint('ready', flush=True)\ntime.sleep(600)\n")


def test_a_stopped_group_is_gone_when_the_stop_returns(tmp_path):
    """``stop_group`` (a started `vllm serve`, a worker node's headless vLLM) returns once no
    process of the group runs, not when its leader has exited: a caller that exits right after
    (the worker node) leaves none behind, and the child finished its own cleanup."""
    done = tmp_path / "cleaned-up"
    code = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]], "
            "stdout=sys.stdout); print(p.pid, flush=True); sys.stdin.read()")
    leader = spawn_owned([sys.executable, "-c", code, SLOW_CHILD, str(done)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    child = int(leader.stdout.readline())
    assert leader.stdout.readline().strip() == "ready"  # its SIGTERM handler is set
    try:
        stop_group(leader, grace_s=60)
        assert done.exists() and not _running(child) and not _running(leader.pid)
    finally:
        leader.kill()
        leader.wait()


def test_a_group_that_ignores_sigterm_is_killed():
    """A leader and its child that both ignore SIGTERM: the SIGKILL after the grace ends them."""
    code = ("import signal, subprocess, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "p = subprocess.Popen(['sleep', '600']); print(p.pid, flush=True); sys.stdin.read()")
    leader = spawn_owned([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    child = int(leader.stdout.readline())  # SIG_IGN carries over exec: sleep ignores SIGTERM too
    try:
        stop_group(leader, grace_s=0.2)
        assert not _running(leader.pid) and not _running(child)
        assert leader.returncode == -9
    finally:
        leader.kill()
        leader.wait()
