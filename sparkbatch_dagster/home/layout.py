"""Where a job's files live: the layout of one job's home folder, and the paths built from keys.

    <home>/shards/manifest.json            what was sharded, and how
    <home>/shards/shard-00003.parquet      input rows of one shard
    <home>/out/<version>/parts/shard-00003/part-000001.parquet   checkpoints
    <home>/out/<version>/labeled/shard-00003.parquet             the finalized shard
    <home>/out/<version>/stats/shard-00003.json                  its run statistics and commit record
    <home>/out/<version>/prediction.json   the estimate's prediction for this version
    <home>/estimate/estimate.json|png      the latest estimate (all models compared)
    <home>/metrics.duckdb                  run metrics and analytics tables
    <home>/results/<context>/seg-*.parquet the result store (``run/result_store.py``): every answer once
    <home>/compile-cache/<key>.tar.gz      the engine's compile cache, one per key (:mod:`.compile_store`)
    <home>/calibration/*.json, review/     what the review learnt and was told (:mod:`.review_files`)
    <home>/out/<version>/commits/shard-00003.json   with a bucket home: the commit, as the bucket has it

A home may be an object-store URL (:mod:`.mirror`): then this folder is its local cache, the
bucket is the truth, and a shard is done only when the bucket holds its commit.

``version`` is the output fingerprint (prompt, sampling, model, input shards): rows made under
other settings live in another folder and are never mixed with these.

Commit points are written through :mod:`.atomic` (after a power loss a file is either whole or
absent); the locks that keep two runs off one shard are :mod:`.locks`. What is found broken anyway
(a truncated part, an empty stats file, a labeled file that is not what its commit recorded,
:mod:`.commit_record`) is logged and recomputed, never a crash; derived files are made again: a
damaged shard file from the input (``inputs/shard_files.py``), a damaged ``metrics.duckdb`` from
the stats files (``run/metrics.py``).
"""


from __future__ import annotations

import json
import logging
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, SparkbatchError
from . import commit_record, pointer, review_files
from .lease import BoxLease, Claim
from .locks import FileLock
from .partition_lock import PartitionLock

if TYPE_CHECKING:
    from .bucket import Bucket
    from .mirror import Mirror

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

    def __init__(self, root: Path, remote: Mirror | None = None, results: Path | None = None,
                 results_remote: Bucket | None = None) -> None:
        self.root = root
        #: The bucket this folder caches (None: the folder is the home).
        self.remote = remote
        #: The answer store's folder and bucket, when the home was opened from a spec (``open_home``).
        self.results, self.results_remote = results, results_remote
        self._box: BoxLease | None = None  # this process's lease in the bucket, made at the first claim

    @property
    def location(self) -> str:
        """Where the job lives, for messages: the bucket URL, or the folder."""
        return self.remote.bucket.url if self.remote is not None else str(self.root)

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
    def calibration_dir(self) -> Path:
        """The confidence calibrations fitted on gold rows, a JSON file per model identity and label
        set (``estimate/calibration.py``): the estimate and analytics write them, runs read them."""
        return self.root / "calibration"

    @property
    def review_dir(self) -> Path:
        """What people said of the rows: the human labels imported from an annotation tool
        (``run/human_labels.py``), append-only files, and the review queue last exported."""
        return self.root / "review"

    @property
    def current_path(self) -> Path:
        """Which output version is current: written by each ``labeled_outputs`` run."""
        return self.root / "current.json"

    def advance_current(self, version: str, model: str, signature: str | None) -> bool:
        """Make ``version`` current if the home's input is still ``signature`` (checked and written
        as one step, :mod:`.pointer`); True when it is current now."""
        return pointer.advance(self, version, model, signature)

    def publish(self, path: Path) -> None:
        """With a bucket home, upload a small file just written (a pointer, a report); else nothing."""
        if self.remote is not None:
            self.remote.publish(path)

    def pull_review(self) -> None:
        """With a bucket home, the calibrations, the review threshold and the reviewers' labels any box
        published, into the cache (:mod:`.review_files`); a folder home has them already."""
        if self.remote is not None:
            review_files.pull(self.remote, self.calibration_dir, self.review_dir)

    def commit_path(self, version: str, key: str) -> Path:
        """With a bucket home: the local copy of the shard's commit object."""
        return self.version_dir(version) / "commits" / f"{check_key(key)}.json"

    def refresh(self, versions: tuple[str, ...] = (), write: bool = False) -> None:
        """With a bucket home, bring what the bucket has into the cache: the shards, the current
        version, and every commit and attempt of it and of ``versions``. The first call checks the
        store (``write``: that it may be written too), before any engine starts."""
        if self.remote is None:
            return
        self.remote.check(write)
        # Shard files are replaced one by one: never under a run of this cache that reads them (it
        # holds the shards lock shared for its whole length), nor under a re-shard here.
        lock = self.shards_lock()
        if lock.acquire(wait=False):
            try:
                self.remote.pull_shards(self)
            finally:
                lock.release()
        else:
            log.info("a run on this cache is reading its shards: they are not refreshed from %s now", self.location)
        self.remote.fetch(self.current_path)
        self.pull_review()  # every read on any box sees the same reviewers' labels and calibration
        current = self.read_current()
        for version in dict.fromkeys([*versions, *([current.version] if current else [])]):
            commits = self.remote.pull(self, version)
            if write:  # a writer cleans what a box killed right after a commit left behind
                swept = self.remote.sweep(self, version, commits, self._take_and_drop)
                if swept:
                    log.info("%s: parts and claims left by boxes that died (after a commit, or on an older input) "
                             "removed: %s", self.location, swept)

    def _take_and_drop(self, version: str, key: str) -> bool:
        """Take a committed shard's leftover claim (if its box is dead) and release it."""
        lock = self.partition_lock(version, key)
        if not lock.acquire(wait=False, lease_wait=False):
            return False
        lock.release()
        return True

    def publish_commit(self, version: str, key: str, attempt: str, done: Callable[[], None],
                       still_mine: Callable[[], bool] | None = None,
                       not_committed: Callable[[str], None] = lambda _: None) -> None:
        """``done`` once the shard just committed here is committed where it counts: at once for a
        folder home; with a bucket home, after its commit there (made from the upload thread), and
        only if that commit is this attempt's (else ``not_committed``: see ``Mirror.commit_later``)."""
        if self.remote is None:
            done()
        else:
            self.remote.commit_later(self, version, key, attempt, done, still_mine, not_committed)

    def pull_version(self, version: str) -> None:
        """With a bucket home, every commit and attempt of ``version`` into the cache."""
        if self.remote is not None:
            self.remote.pull(self, version)

    def pull_for_run(self, version: str, keys: list[str]) -> None:
        """For a run that now holds these shards' leases: the commits other boxes made of them
        since, and the checkpoints of earlier attempts of the others, wherever they ran."""
        if self.remote is not None and keys:
            self.remote.pull_for_run(self, version, keys)

    def input_signature_now(self) -> str | None:
        """The signature of the shards as the home has them now: the bucket's manifest for a
        bucket home (another box may have sharded a new input since this cache was refreshed)."""
        if self.remote is not None:
            raw = self.remote.bucket.get_bytes("shards/manifest.json")
            try:
                return json.loads(raw).get("signature") if raw is not None else None
            except (ValueError, AttributeError):  # damaged: no input is the home's until it is sharded again
                return None
        return (self.read_manifest() or {}).get("signature")

    def heal_current(self) -> bool:
        """For a writer: a pointer that does not parse is written again from the commits."""
        return pointer.heal(self)

    def read_current(self) -> pointer.Current | None:
        """The current version (None before any commit); a damaged pointer is derived from the commits."""
        return pointer.read(self)

    def has_commits(self, version: str) -> bool:
        """Whether ``version`` has a committed shard."""
        labeled = self.version_dir(version) / ("labeled" if self.remote is None else "commits")
        return labeled.exists() and any(labeled.glob("shard-*.*"))

    def prediction_path(self, version: str) -> Path:
        """What the estimate predicted for the run that produces ``version``."""
        return self.version_dir(version) / "prediction.json"

    def remove_stale_parts(self, version: str) -> None:
        """Drop part files of shards already committed (a crash right after a commit leaves them)."""
        parts = self.version_dir(version) / "parts"
        for folder in parts.glob("shard-*") if parts.exists() else []:
            if self.is_done(version, folder.name):
                shutil.rmtree(folder, ignore_errors=True)

    def partition_lock(self, version: str, key: str) -> PartitionLock:
        local = FileLock(self.version_dir(version) / "locks" / f"{check_key(key)}.lock")
        if self.remote is None:
            return PartitionLock(local)
        if self._box is None:
            self._box = BoxLease(self.remote.bucket, self.remote.lease_seconds)
        return PartitionLock(local, Claim(self.remote.bucket, f"leases/{version}/{check_key(key)}.json", self._box))

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
        """True when the shard's labeled file and stats are both whole, and the file is the one its
        commit recorded (rows, sha256). Only reads.

        A committed shard whose files are found broken (truncated by a crash of the disk, not of
        this process: commits are fsynced; or replaced since) is not done: the next run that holds the shard's lock
        sets its files aside (:meth:`set_aside_broken`) and recomputes it, its answers coming back
        from the result store, not the engine. A read that fails (shared storage away for a
        moment) is not a broken file: it raises, naming the file, and nothing is touched.
        """
        if self.remote is not None and not self.commit_path(version, key).exists():
            return False  # the bucket is the truth: a shard committed here but not there is not done
        return self.labeled_path(version, key).exists() and self.broken(version, key) is None

    def broken(self, version: str, key: str) -> str | None:
        """Why a committed shard's files do not parse, or its labeled file is not the one its commit
        recorded (:mod:`.commit_record`: rows, sha256); None when whole, or not committed."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        labeled, stats = self.labeled_path(version, key), self.stats_path(version, key)
        path = labeled
        try:
            if not labeled.exists():
                return None
            rows = pq.read_metadata(labeled).num_rows
            path = stats
            record = json.loads(stats.read_text())
            record["rows"]  # noqa: B018 - a record without its rows is a broken stats file
            path = labeled
            return commit_record.mismatch(labeled, record, rows)
        except FileNotFoundError:  # a labeled file without its stats (written first): not whole
            return f"{path.name} is missing"
        except (ValueError, KeyError, TypeError, pa.ArrowInvalid) as exc:  # the bytes are there, and wrong
            return f"{path.name}: {exc}"
        except OSError as exc:
            if exc.errno is None:  # pyarrow's own "cannot deserialize" (no errno): a file that parses wrong
                return f"{path.name}: {exc}"
            raise SparkbatchError(f"cannot read {path} ({exc}): nothing was changed; check the storage and "
                                  "run again") from exc

    def set_aside_broken(self, version: str, key: str) -> bool:
        """Move a committed shard's broken files aside (``<name>.broken-<time>``, kept for a
        look) so that it is recomputed; for a run that holds the shard's lock. True if it did."""
        why = self.broken(version, key)
        if why is None:
            return False
        log.warning("%s of version %s is broken (%s): set aside and recomputed", key, version, why)
        stamp = time.strftime("%Y%m%dT%H%M%S")
        for path in (self.labeled_path(version, key), self.stats_path(version, key)):
            if path.exists():
                path.rename(path.with_name(f"{path.name}.broken-{stamp}"))
        return True

