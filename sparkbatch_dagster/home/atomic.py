"""Commit points: files written under a temporary name, fsynced, renamed, their folder fsynced,
so that after a power loss a file is either whole or absent; and the crash tests' failpoints.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

_hits: dict[str, int] = {}
_hits_lock = threading.Lock()


def failpoint(name: str) -> None:
    """Crash tests: stop this process at the named point when SPARKBATCH_FAILPOINT says so.

    The kill tests use it to stop a run at exact moments (mid-sharding, mid-finalize); the
    check is one environment lookup, at a handful of places that run once per shard. The
    variable is a point's name (SIGKILL at its first hit), or comma-separated ``name[@n][=action]``:
    the n-th hit (default 1), action ``kill`` (SIGKILL, the default) or ``stop`` (SIGSTOP: the
    fault harness holds the process there, past its lease, then sends SIGCONT)::

        SPARKBATCH_FAILPOINT="bucket:commit@2=stop,finalize:stats=kill"
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
        if hit == int(nth or 1):
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


def atomic_write_text(path: Path, text: str) -> None:
    """Write text under a temporary name, then make it durable under ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    _durable_replace(tmp, path)


def atomic_write_parquet(path: Path, table: Any) -> None:
    """Write a pyarrow table under a temporary name, then make it durable under ``path``."""
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    pq.write_table(table, tmp)
    _durable_replace(tmp, path)
