"""Locks between processes on one machine: an exclusive (or shared) ``flock`` on a file.

The OS drops a lock when its holder dies, SIGKILL included, so a crashed run never leaves a
shard locked. A lock file holds its holder's pid, for "being written by another run (pid N)".
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Any


class FileLock:
    """An exclusive ``flock`` on a file; the OS drops it when the holder dies (SIGKILL too)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh: Any = None

    def acquire(self, wait: bool, shared: bool = False) -> bool:
        """Take the lock; ``shared`` lets several readers hold it while no writer does."""
        fh = self._take(wait, shared)
        if fh is None:
            return False
        self._fh = fh
        return True

    def _take(self, wait: bool, shared: bool) -> Any:
        """A file handle holding the lock; None when ``wait`` is off and another holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+")  # noqa: SIM115 - held until its release
        try:
            fcntl.flock(fh, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            fh.close()
            return None
        if not shared:  # the holder's pid, for "being written by another run (pid N)"
            fh.seek(0)
            fh.truncate()
            fh.write(str(os.getpid()))
            fh.flush()
        return fh

    @contextlib.contextmanager
    def held(self, shared: bool = False) -> Any:
        """``with lock.held(): ...``: wait for the lock, release it on the way out. Each ``with``
        holds its own file handle, so threads of one process may use one lock object at once (a
        result store's lookups on the run's thread, its merges on the upload thread): sharing
        ``acquire``'s one handle, a release could close another thread's handle or leave its own
        locked ("'NoneType' object has no attribute 'close'", the fault harness's seed 30926)."""
        fh = self._take(wait=True, shared=shared)
        try:
            yield self
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
            fh.close()

    def holder(self) -> str:
        try:
            return self.path.read_text().strip() or "?"
        except OSError:
            return "?"

    def release(self) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None
