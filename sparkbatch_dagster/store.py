"""Where a job's files live, and the small atomic-write helpers everything uses.

    <home>/shards/manifest.json            what was sharded, and how
    <home>/shards/shard-00003.parquet      input rows of one shard
    <home>/out/<version>/parts/shard-00003/part-000001.parquet   checkpoints
    <home>/out/<version>/labeled/shard-00003.parquet             the finalized shard
    <home>/out/<version>/stats/shard-00003.json                  its run statistics
    <home>/out/<version>/prediction.json   the estimate's prediction for this version
    <home>/estimate/estimate.json|png      the latest estimate (all models compared)
    <home>/metrics.duckdb                  run metrics and analytics tables
    <home>/results/<context>/seg-*.parquet the result store (``results.py``): every answer once

``version`` is the output fingerprint (prompt, sampling, model, input shards): rows made under
other settings live in another folder and are never mixed with these.

Commit points (a labeled shard, its stats, a result segment, the manifest) are written under a
temporary name, fsynced, renamed, and their folder fsynced: after a power loss a file is either
whole or absent. What is found broken anyway (a truncated part, an empty stats file) is logged
and recomputed, never a crash.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import signal
from pathlib import Path
from typing import Any

from .errors import ConfigError

_KEY_RE = re.compile(r"shard-[0-9]{5}")
log = logging.getLogger("sparkbatch")


def shard_key(index: int) -> str:
    return f"shard-{index:05d}"


def check_key(key: str) -> str:
    """Partition keys become file names: refuse anything but ``shard-NNNNN``."""
    if not _KEY_RE.fullmatch(key):  # fullmatch: "$" would let a trailing newline through
        raise ConfigError(f"partition key {key!r} is not a shard key like 'shard-00000'")
    return key


class JobHome:
    """Paths of one job's files. Every path built from a key goes through :func:`check_key`."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def shards_dir(self) -> Path:
        return self.root / "shards"

    @property
    def manifest_path(self) -> Path:
        return self.shards_dir / "manifest.json"

    @property
    def metrics_db(self) -> Path:
        return self.root / "metrics.duckdb"

    def shard_path(self, key: str) -> Path:
        return self.shards_dir / f"{check_key(key)}.parquet"

    def version_dir(self, version: str) -> Path:
        if not re.fullmatch(r"[0-9a-f]{16}", version):
            raise ConfigError(f"output version {version!r} is not a fingerprint")
        return self.root / "out" / version

    def parts_dir(self, version: str, key: str) -> Path:
        return self.version_dir(version) / "parts" / check_key(key)

    def labeled_path(self, version: str, key: str) -> Path:
        return self.version_dir(version) / "labeled" / f"{check_key(key)}.parquet"

    def stats_path(self, version: str, key: str) -> Path:
        return self.version_dir(version) / "stats" / f"{check_key(key)}.json"

    @property
    def estimate_dir(self) -> Path:
        """The latest estimate report (JSON + chart), all models compared."""
        return self.root / "estimate"

    @property
    def current_path(self) -> Path:
        """Which output version is current: written by each ``labeled_outputs`` run."""
        return self.root / "current.json"

    def write_current(self, version: str, model: str) -> None:
        atomic_write_text(self.current_path, json.dumps({"version": version, "model": model}))

    def read_current(self) -> dict[str, Any] | None:
        return json.loads(self.current_path.read_text()) if self.current_path.exists() else None

    def prediction_path(self, version: str) -> Path:
        """What the estimate predicted for the run that produces ``version``."""
        return self.version_dir(version) / "prediction.json"

    def remove_stale_parts(self, version: str) -> None:
        """Drop part files of shards already committed (a crash right after a commit leaves them)."""
        parts = self.version_dir(version) / "parts"
        for folder in parts.glob("shard-*") if parts.exists() else []:
            if self.is_done(version, folder.name):
                shutil.rmtree(folder, ignore_errors=True)

    def partition_lock(self, version: str, key: str) -> FileLock:
        return FileLock(self.version_dir(version) / "locks" / f"{check_key(key)}.lock")

    def shards_lock(self) -> FileLock:
        return FileLock(self.root / ".shards.lock")

    def read_manifest(self) -> dict[str, Any] | None:
        """The shard manifest, or None when there is none (or it is unreadable: re-shard)."""
        try:
            return dict(json.loads(self.manifest_path.read_text()))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("%s is unreadable (%s): the input will be sharded again", self.manifest_path, exc)
            return None

    def is_done(self, version: str, key: str) -> bool:
        """True when the shard's labeled file and stats are both whole.

        A committed shard whose files are found broken (truncated by a crash of the disk, not of
        this process: commits are fsynced) is un-committed here, with a log line, so the next
        run recomputes it; its answers come back from the result store, not the engine.
        """
        labeled, stats = self.labeled_path(version, key), self.stats_path(version, key)
        if not labeled.exists():
            return False
        try:
            import pyarrow.parquet as pq

            pq.read_metadata(labeled)
            json.loads(stats.read_text())["rows"]
            return True
        except Exception as exc:  # any unreadable file means the same thing: recompute the shard
            log.warning("%s of version %s is broken (%s): recomputing it", key, version, exc)
            labeled.unlink(missing_ok=True)
            stats.unlink(missing_ok=True)
            return False


def failpoint(name: str) -> None:
    """Crash tests: SIGKILL this process at the named point when SPARKBATCH_FAILPOINT says so.

    The kill tests use it to stop a run at exact moments (mid-sharding, mid-finalize); the
    check is one environment lookup, at a handful of places that run once per shard.
    """
    if os.environ.get("SPARKBATCH_FAILPOINT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


class FileLock:
    """An exclusive ``flock`` on a file; the OS drops it when the holder dies (SIGKILL too)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh: Any = None

    def acquire(self, wait: bool, shared: bool = False) -> bool:
        """Take the lock; ``shared`` lets several readers hold it while no writer does."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+")  # noqa: SIM115 - held until release()
        try:
            fcntl.flock(fh, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            fh.close()
            return False
        if not shared:  # the holder's pid, for "being written by another run (pid N)"
            fh.seek(0)
            fh.truncate()
            fh.write(str(os.getpid()))
            fh.flush()
        self._fh = fh
        return True

    @contextlib.contextmanager
    def held(self, shared: bool = False) -> Any:
        """``with lock.held(): ...``: wait for the lock, release it on the way out."""
        self.acquire(wait=True, shared=shared)
        try:
            yield self
        finally:
            self.release()

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
