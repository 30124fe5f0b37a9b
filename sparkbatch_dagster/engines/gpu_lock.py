"""One engine per GPU on this box, whatever the Dagster instance says.

Dagster's ``gpu`` pool keeps a second run from starting an engine only where the instance limits
that pool (``dagster instance concurrency set gpu 1``). A user's own ``dagster dev`` has no limit:
a scattered backfill (partitions 1, 4 and 6) is then three runs at once, each starting an engine
that asks for 90% of the same GPU's memory. So an engine start takes an exclusive ``flock`` on
one file per device it will use (``<dir>/gpu-<name>.lock``, named as ``CUDA_VISIBLE_DEVICES``
names the GPU; ``cpu0.lock`` on the CPU backend, where two engines fight for the same cores),
in sorted order so that two runs wanting overlapping GPUs never wait on each other, and holds
them while the engine lives: released when it is closed, and by the OS when the process dies
(SIGKILL included). The holder writes its Dagster run id and pid into the file; a run that finds
a device taken logs a WARNING naming them, then waits.

Locks count per process: an engine started while this process already holds the device (a
``keep_warm`` engine of other settings, a test session's shared engine) does not wait on itself.
The directory is ``$SPARKBATCH_GPU_LOCK_DIR``, default ``~/.cache/sparkbatch/gpu-locks``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import multiprocessing.process
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .base import Engine
from .platform import spans

DEFAULT_DIR = "~/.cache/sparkbatch/gpu-locks"
#: Lock files this process holds: path -> [file descriptor, engines of this process holding it].
_HELD: dict[str, list[int]] = {}
_GUARD = threading.Lock()
#: Engines of this process stopping in the background (:meth:`HeldEngine.close`).
_STOPPING: list[tuple[threading.Thread, HeldEngine]] = []


def lock_dir() -> Path:
    """Where the lock files live; read at call time, so a test (or a second user) can move it."""
    return Path(os.environ.get("SPARKBATCH_GPU_LOCK_DIR") or DEFAULT_DIR).expanduser()


def lock_path(device: str) -> Path:
    """The lock file of one device: ``cpu0.lock``, or ``gpu-<name>.lock`` for a GPU."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", device)
    return lock_dir() / (f"{safe}.lock" if device.startswith("cpu") else f"gpu-{safe}.lock")


def describe(device: str) -> str:
    return "the CPU (cpu0)" if device.startswith("cpu") else f"GPU {device}"


class DeviceLock:
    """The devices one engine holds. Example::

        lock = DeviceLock.acquire(["0", "1"], {"run_id": context.run_id}, log=context.log.warning)
        try:
            ...  # start the engine, use it, close it
        finally:
            lock.release()

    ``waited_s``: seconds spent waiting for another process's engine (0 when free at once).
    """

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.waited_s = 0.0

    @classmethod
    def acquire(cls, devices: Iterable[str], holder: Mapping[str, Any], log: Callable[[str], None]) -> DeviceLock:
        """Hold every one of ``devices``, waiting (and saying so through ``log``) for any that another
        process holds; ``holder`` (the run id) is written into each file for whoever waits next."""
        lock = cls()
        try:
            for device in sorted(set(devices)):
                lock._take(device, holder, log)
        except BaseException:  # Ctrl-C or a run's termination while waiting: give back what we had
            lock.release()
            raise
        return lock

    def _take(self, device: str, holder: Mapping[str, Any], log: Callable[[str], None]) -> None:
        path = lock_path(device)
        with _GUARD:
            if str(path) in _HELD:
                _HELD[str(path)][1] += 1
                self.paths.append(str(path))
                return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError as exc:
            raise ConfigError(f"cannot open the GPU lock {path} ({exc}): set SPARKBATCH_GPU_LOCK_DIR to a folder "
                              "every run on this box can write") from exc
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log(_waiting(device, path, _read(fd)))
                began = time.perf_counter()
                fcntl.flock(fd, fcntl.LOCK_EX)
                self.waited_s += time.perf_counter() - began
            since = datetime.now(timezone.utc).isoformat(timespec="seconds")
            data = json.dumps({**holder, "pid": os.getpid(), "device": device, "since": since}).encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
        except BaseException:
            os.close(fd)  # closing the only descriptor drops a lock taken just now too
            raise
        with _GUARD:
            _HELD[str(path)] = [fd, 1]
        self.paths.append(str(path))

    def release(self) -> None:
        """Give the devices back (once; later calls do nothing)."""
        paths, self.paths = self.paths, []
        for path in reversed(paths):
            with _GUARD:
                held = _HELD[path]
                held[1] -= 1
                if held[1] > 0:
                    continue
                del _HELD[path]
            fd = held[0]
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)  # no stale holder for the next reader
            fcntl.flock(fd, fcntl.LOCK_UN)  # before close: a forked child may share the descriptor
            os.close(fd)


def _read(fd: int) -> dict[str, Any]:
    try:
        data = json.loads(os.pread(fd, 65536, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except (TypeError, ValueError, ProcessLookupError):
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def _waiting(device: str, path: Path, holder: dict[str, Any]) -> str:
    """The WARNING a run logs when another engine holds a device it needs."""
    if not holder:  # the holder took the lock a moment ago and has not written its name yet
        who = "another process"
    else:
        run = holder.get("run_id")
        who = (f"Dagster run {run}" if run else "a process outside a Dagster run (a notebook, a script)") + \
            f" (pid {holder.get('pid')}, since {holder.get('since')})"
        if not _alive(holder.get("pid")):
            who += f"; that pid has exited, so a process it started still holds the lock: `fuser {path}` names it"
    return (f"{describe(device)} is held by another engine on this box: {who}. This run waits for it to stop "
            f"before starting its engine (one engine per GPU, whatever the Dagster instance; lock {path}). "
            "To run both at once, give each its own GPUs with CUDA_VISIBLE_DEVICES.")


def _refuse_in_spawned_import() -> None:
    """Stop an engine start made while a ``spawn`` child re-runs the parent's main script.

    vLLM starts its engine core with ``spawn``, whose child first re-runs the script that started
    it. A script that starts its engine at its top level (no ``if __name__ == "__main__":``) starts
    it again there, and that child then waits on the lock its parent holds while the parent waits
    on the child: a hang until ``engine_start_timeout_s`` that names neither. multiprocessing
    itself refuses a process started at that point; this refuses an engine in the same way."""
    if getattr(multiprocessing.process.current_process(), "_inheriting", False):
        raise ConfigError("an engine was started while a child process re-ran your script's top level "
                          "(vLLM starts its engine core with multiprocessing's 'spawn'). Fix: put the code "
                          "that starts the run under `if __name__ == \"__main__\":`")


class HeldEngine:
    """A started engine and the devices it holds: :meth:`close` stops the engine, then frees them.

    Example::

        held = HeldEngine.start(["0"], {"run_id": run_id}, log.warning, lambda: start(settings))
        held.engine.generate(...)
        held.close()
    """

    def __init__(self, engine: Engine, lock: DeviceLock | None) -> None:
        self.engine, self.lock = engine, lock
        self.stop_s = 0.0  # how long its stop took, once stopped

    @classmethod
    def start(cls, devices: list[str], holder: Mapping[str, Any], log: Callable[[str], None],
              start: Callable[[], Engine]) -> HeldEngine:
        """Take ``devices`` (none: no lock, as for servers someone else runs), then ``start()``.
        The engine's ``gpu_wait_s`` says how long the devices took to come free."""
        _refuse_in_spawned_import()
        wait_for_stops()  # an engine of this process still stopping: its memory is this start's
        lock = DeviceLock.acquire(devices, holder, log) if devices else None
        try:
            engine = start()
        except BaseException:  # a start that fails frees the GPUs for the next run at once
            if lock is not None:
                lock.release()
            raise
        engine.gpu_wait_s = lock.waited_s if lock is not None else 0.0
        return cls(engine, lock)

    def close(self, background: bool = False) -> None:
        """Stop the engine, then free its devices. ``background``: on a thread of its own, so that
        the run's last steps (its metrics, its analytics) overlap the seconds vLLM takes to stop;
        the devices stay locked until it is gone, the next engine start of this process waits for
        it, and so does the process's exit (the thread is no daemon); :func:`wait_for_stops`
        waits for it too."""
        # A run torn down as the interpreter exits (a generator closed by its last collection, after
        # a SIGTERM's exit) cannot start a thread: there, Thread.start() waits forever.
        if not background or sys.is_finalizing():
            try:
                self._stop()
            finally:
                spans.note("engine_stop", self.stop_s)  # `sparkbatch run`'s timings_s
            return
        thread = threading.Thread(target=self._stop, name="sparkbatch-engine-stop")
        with _GUARD:
            _STOPPING.append((thread, self))
        thread.start()

    def _stop(self) -> None:
        began = time.perf_counter()
        try:
            self.engine.close()
        finally:  # the memory is free only once the engine is gone: then the next run may start
            if self.lock is not None:
                self.lock.release()
            self.stop_s = time.perf_counter() - began


def wait_for_stops() -> float:
    """Wait for the engines of this process that stop in the background; return how long their
    stops took (seconds, added up), for a run's timings.

    Example::

        held.close(background=True)
        ...  # the run's last steps
        stopped_s = wait_for_stops()
    """
    with _GUARD:
        stopping = list(_STOPPING)
        _STOPPING.clear()
    for thread, _ in stopping:
        thread.join()
    return sum(held.stop_s for _, held in stopping)
