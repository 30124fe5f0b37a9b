"""Commit points: files written under a temporary name, fsynced, renamed, their folder fsynced,
so that after a power loss a file is either whole or absent; a write that fails (a full disk, a
read-only one) removes its temporary file; and the crash tests' failpoints.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

_hits: dict[str, int] = {}
_hits_lock = threading.Lock()


def failpoint(name: str, path: Path | None = None) -> None:
    """Crash tests: stop this process at the named point when SPARKBATCH_FAILPOINT says so.

    The kill tests use it to stop a run at exact moments (mid-sharding, mid-finalize); the
    check is one environment lookup, at a handful of places that run once per shard (and at
    each atomic write). The variable is a point's name (SIGKILL at its first hit), or
    comma-separated ``name[@n][=action]``: the n-th hit (default 1), action ``kill`` (SIGKILL,
    the default), ``stop`` (SIGSTOP: the fault harness holds the process there, past its lease,
    then sends SIGCONT) or an errno name (``ENOSPC``, ``EROFS``, ...: that ``OSError`` is raised
    there, about ``path``, as a full or read-only disk raises it)::

        SPARKBATCH_FAILPOINT="bucket:commit@2=stop,finalize:stats=kill,write:part@3=ENOSPC"
    """
    wanted = os.environ.get("SPARKBATCH_FAILPOINT")
    if not wanted or name not in wanted:
        return
    for item in wanted.split(","):
        point, _, action = item.strip().partition("=")
        point, _, nth = point.partition("@")
        if point != name:
            continue
        with _hits_lock:  # points are hit from the run's thread and the upload thread
            _hits[name] = hit = _hits.get(name, 0) + 1
        if hit != int(nth or 1):
            continue
        code = getattr(errno, action, None) if action.startswith("E") else None
        if isinstance(code, int):
            raise OSError(code, os.strerror(code), None if path is None else str(path))
        os.kill(os.getpid(), signal.SIGSTOP if action == "stop" else signal.SIGKILL)


def _durable_replace(tmp: Path, path: Path) -> None:
    """fsync the new file, rename it into place, fsync the folder: the rename itself must
    survive a power loss, or a committed shard could come back as nothing (or as a stub)."""
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic(path: Path, write: Callable[[Path], object], point: str) -> None:
    """``write`` a temporary file beside ``path``, then make it durable there. Whatever fails on
    the way (a full disk: ENOSPC at the write, the fsync or the rename), the temporary file goes
    and ``path`` keeps what it held; the error is raised naming ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        failpoint(point, tmp)  # tests: a full or read-only disk once the bytes are written
        _durable_replace(tmp, path)
    except BaseException as exc:
        # After the rename only the folder's fsync can fail: the file is in place, there is no tmp.
        with contextlib.suppress(OSError):  # a read-only disk refuses even this: nothing was written
            tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is None:  # a failed write() names no file
            exc.filename = str(path)
        raise


def atomic_write_text(path: Path, text: str, point: str = "write") -> None:
    """Write text under a temporary name, then make it durable under ``path``. ``point``: the
    failpoint tests fail this write at (``write:stats``, ...)."""
    _atomic(path, lambda tmp: tmp.write_text(text), point)


def atomic_write_parquet(path: Path, table: Any, point: str = "write") -> None:
    """Write a pyarrow table under a temporary name, then make it durable under ``path``."""
    import pyarrow.parquet as pq

    _atomic(path, lambda tmp: pq.write_table(table, tmp), point)


def atomic_write_bytes(path: Path, data: bytes, point: str = "write") -> None:
    """Write bytes under a temporary name, then make them durable under ``path`` (a labeled file
    whose hash its commit record holds: written as hashed, not serialized again)."""
    _atomic(path, lambda tmp: tmp.write_bytes(data), point)
