"""Child processes this process owns: each in its own process group, sent a signal by the kernel
when this process dies (:func:`spawn_owned`), and stopped group and all (:func:`stop_group`, or
:func:`kill_group_late` after the child was asked to stop by itself). The
engines' servers and ``serve-batch``'s batch children start this way."""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import os
import signal
import subprocess
import time
from typing import Any


def die_with_parent(death_signal: int = signal.SIGTERM) -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6")
        # An ignored signal stays ignored across exec: a parent that ignores SIGTERM (a Dagster
        # worker, a test runner) would hand that on, and the death signal would do nothing.
        libc.signal(signal.SIGTERM, 0)  # SIG_DFL
        libc.prctl(1, death_signal)  # PR_SET_PDEATHSIG


#: The one thread that forks owned children. The kernel's "parent" in PR_SET_PDEATHSIG is the
#: forking *thread*: a child forked on a short-lived thread (a run's engine starts on its own,
#: ``LazyEngine``) would get SIGTERM the moment that thread ends. This one lives as long as the process.
_SPAWNER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="sparkbatch-spawner")


def spawn_owned(cmd: list[str], death_signal: int = signal.SIGTERM, **popen: Any) -> subprocess.Popen[Any]:
    """``cmd`` in its own process group, sent ``death_signal`` by the kernel when this process
    dies (not when the calling thread ends), whichever thread asks. SIGKILL for a child that
    must not take its parent's death for a stop it cleans up after (a batch's ``run-batch``:
    its engine's watchdog then ends the rest). ``popen``: more ``subprocess.Popen`` arguments."""

    def spawn() -> subprocess.Popen[Any]:
        return subprocess.Popen(cmd, start_new_session=True,  # noqa: PLW1509
                                preexec_fn=lambda: die_with_parent(death_signal), **popen)

    return _SPAWNER.submit(spawn).result()


def stop_group(proc: subprocess.Popen[Any], grace_s: float = 30.0) -> None:
    """SIGTERM the process group that ``proc`` leads (``spawn_owned``), then SIGKILL what is left
    after ``grace_s``; returns once no process of the group is left (or 60 s after the SIGKILL:
    a killed engine on a loaded machine can take seconds to give its memory back), so a caller
    that exits next leaves none behind."""
    group = proc.pid  # start_new_session: the leader's pid is the group's id
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 60.0)):
        _signal_group(group, sig)
        deadline = time.monotonic() + wait_s
        while _group_alive(group) and time.monotonic() < deadline:
            proc.poll()  # reaps the leader: a zombie would keep the group alive
            time.sleep(0.1)
        if not _group_alive(group):
            break
    proc.poll()


def kill_group_late(proc: subprocess.Popen[Any], grace_s: float) -> None:
    """SIGKILL the process group that ``proc`` leads (``spawn_owned``) unless ``proc`` exits within
    ``grace_s``: for a child asked to stop by itself (SIGINT) that may never hear it (started with
    SIGINT inherited ignored, by a server run with ``&`` from a script)."""
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        _signal_group(proc.pid, signal.SIGKILL)


def _signal_group(group: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, sig)


def _group_alive(group: int) -> bool:
    """Whether any process of the group is left (a dead leader not yet reaped counts, as a zombie)."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
