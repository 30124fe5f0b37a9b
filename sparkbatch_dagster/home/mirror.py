"""A job home in an object store, with a local folder as its cache.

The bucket is the truth; the local folder holds the same layout (:mod:`.layout`) and can be
deleted whenever no run uses it. Every run works on local files as before and this module keeps
the two in step:

    <url>/shards/manifest.json                    which shards, written after them (names their folder)
    <url>/shards/<signature>/shard-00003.parquet  input rows of one shard
    <url>/out/<version>/parts/shard-00003/part-000007-<attempt>.parquet   checkpoints, uploaded as written
    <url>/out/<version>/labeled/shard-00003.<attempt>.parquet             a finished shard's rows
    <url>/out/<version>/commits/shard-00003.json  THE commit: names that object, holds its statistics;
                                                  created once
    <url>/out/<version>/attempts/<id>.json        every attempt's bill (its own object)
    <url>/leases/<version>/shard-00003.json       who works the shard now (:mod:`.lease`)
    <url>/current.json, out/<version>/prediction.json, estimate/*   small pointers, overwritten
    <url>/results/<context>/seg-*.parquet         the answer store (``run/result_store.py``)
    <url>/compile-cache/<key>.tar.gz              the engine's compile cache (:mod:`.compile_store`)

Readers trust only what a commit names: a labeled object without its commit is an attempt that
died before committing, and is never read. A commit is created with create-if-absent, so of two
machines finishing the same shard, one wins and the other's output is dropped (and said so).
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from .atomic import atomic_write_text, failpoint
from .bucket import Bucket
from .commit_record import as_recorded, commit_of
from .locks import FileLock
from .uploader import Uploader

log = logging.getLogger("sparkbatch")


class JobHome(Protocol):
    """What the mirror needs of a home's layout (``layout.JobHome``, which holds the mirror)."""

    @property
    def manifest_path(self) -> Path: ...
    @property
    def current_path(self) -> Path: ...
    def read_manifest(self) -> dict[str, Any] | None: ...
    def shard_path(self, key: str) -> Path: ...
    def version_dir(self, version: str) -> Path: ...
    def parts_dir(self, version: str, key: str) -> Path: ...
    def labeled_path(self, version: str, key: str) -> Path: ...
    def stats_path(self, version: str, key: str) -> Path: ...
    def commit_path(self, version: str, key: str) -> Path: ...
    def prediction_path(self, version: str) -> Path: ...


def _signature_of(raw: bytes) -> str | None:
    try:
        return json.loads(raw).get("signature")
    except (ValueError, AttributeError):  # a damaged manifest: any sharding replaces it
        return None


class Mirror:
    """The bucket behind a :class:`~.layout.JobHome`'s local folder (its cache)."""

    def __init__(self, bucket: Bucket, cache: Path, lease_seconds: float = 60.0) -> None:
        self.bucket, self.cache, self.lease_seconds = bucket, cache, lease_seconds
        self.uploader = Uploader(bucket)
        self._checked: bool | None = None  # None: not yet; False: read checked; True: write checked
        self._own_attempts: set[Path] = set()  # records this process writes: its local copy is the newer

    def rel(self, path: Path) -> str:
        return path.relative_to(self.cache).as_posix()

    def check(self, write: bool) -> None:
        """The store answers and (``write``) these credentials may write it; once per process."""
        if self._checked is True or (self._checked is False and not write):
            return
        self.bucket.check(write=write)
        self._checked = write

    def publish(self, path: Path) -> None:
        """Upload a small pointer file now (current.json, a prediction, the estimate report)."""
        self.bucket.put_file(path, self.rel(path))

    def fetch(self, path: Path) -> bool:
        """Download a pointer file if the bucket has it; True if it did."""
        raw = self.bucket.get_bytes(self.rel(path))
        if raw is None:
            return False
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_bytes() != raw:
            atomic_write_text(path, raw.decode())
        return True

    # -- input shards ------------------------------------------------------------------------

    def publish_shards(self, home: JobHome, manifest: dict[str, Any], input_now: Callable[[], str | None]) -> bool:
        """Upload the shards under their signature's folder, then the manifest naming it (both
        skipped where the bucket has them already). The manifest moves only forward, as
        ``current.json`` does (:mod:`.pointer`): written on the condition that it is still the one
        read before ``input_now()`` (the input's signature as it is now) was found to be this
        manifest's. False when the input changed since it was read here: the bucket keeps the
        newer manifest (another box's, or the next run's)."""
        folder, rel = f"shards/{manifest['signature'][:16]}", "shards/manifest.json"
        body = json.dumps({**{k: v for k, v in manifest.items() if k != "reused"}, "objects": folder},
                          indent=2).encode()
        uploaded: list[bool] = []

        def may_write() -> bool:
            if input_now() != manifest["signature"]:
                log.warning("the input changed since it was sharded here: the bucket's shards are left as they are")
                return False
            if not uploaded:  # the objects first, once: the manifest names them
                self._upload_shards(home, manifest, folder)
                uploaded.append(True)
            return True

        return self.bucket.put_forward(rel, body, lambda raw: _signature_of(raw) == manifest["signature"],
                                       may_write)[0]

    def _upload_shards(self, home: JobHome, manifest: dict[str, Any], folder: str) -> None:
        have = self.bucket.list(folder)
        for key in manifest["keys"]:
            path = home.shard_path(key)
            if have.get(path.name) != path.stat().st_size:
                self.bucket.put_file(path, f"{folder}/{path.name}")

    def pull_shards(self, home: JobHome) -> None:
        """Bring the bucket's shards into the cache unless the same ones are there."""
        raw = self.bucket.get_bytes("shards/manifest.json")
        if raw is None:
            return
        remote = json.loads(raw)
        local = home.read_manifest()
        same = local is not None and local.get("signature") == remote["signature"]
        for key in remote["keys"]:
            if not (same and home.shard_path(key).exists()):
                self.bucket.get_file(f"{remote['objects']}/{key}.parquet", home.shard_path(key))
        if not same:
            atomic_write_text(home.manifest_path, raw.decode())

    # -- outputs -----------------------------------------------------------------------------

    def pull(self, home: JobHome, version: str) -> set[str]:
        """Every commit, attempt record and the prediction of ``version``, into the cache; returns
        the committed keys (for :meth:`sweep`, so the commits are listed once)."""
        base = self.rel(home.version_dir(version))
        commits = {n.removesuffix(".json") for n in self.bucket.list(f"{base}/commits") if n.endswith(".json")}
        for key in sorted(commits):
            self.pull_commit(home, version, key)
        mine = {p.name for p in self._own_attempts}
        for name in self.bucket.list(f"{base}/attempts"):
            if name.endswith(".json") and name not in mine:  # another run's record: as the bucket has it
                self._pull_attempt(f"{base}/attempts/{name}", home.version_dir(version) / "attempts" / name)
        self.fetch(home.prediction_path(version))
        return commits

    def _pull_attempt(self, rel: str, local: Path) -> None:
        """An attempt record into the cache, unless the cache's copy is the newer: a run of this
        box (another process on this cache) writes its record here at every beat and pushes it
        to the bucket only every third of a lease, so the bucket's copy may be behind."""
        lock = FileLock(local.with_name(f".{local.stem}.lock"))
        if local.exists() and not lock.acquire(wait=False):
            return  # its process runs here now: the local record is the live one
        try:
            raw = self.bucket.get_bytes(rel)
            if raw is None:
                return
            if local.exists():
                try:
                    ours = json.loads(local.read_text())
                    theirs = json.loads(raw)
                    if (ours.get("last_beat") or "") > (theirs.get("last_beat") or "") or (
                            ours.get("ended") and not theirs.get("ended")):
                        return
                except ValueError:
                    pass
            atomic_write_text(local, raw.decode())
        finally:
            lock.release()

    def sweep(self, home: JobHome, version: str, commits: set[str], take: Callable[[str, str], bool]) -> list[str]:
        """What dead boxes left behind: the parts of committed shards of ``version`` (deleted),
        and claims of its committed shards and of every other version (``take(version, key)``
        takes one over if its box is dead, and releases it: a box killed right after a commit, or
        on an input sharded again since). ``commits``: the committed keys :meth:`pull` listed. A
        writer's refresh calls it: two listings. Returns what it cleaned, as ``<version>/<key>``."""
        base = self.rel(home.version_dir(version))
        parts = [n for n in self.bucket.list(f"{base}/parts") if n.split("/", 1)[0] in commits]
        self.bucket.delete_many([f"{base}/parts/{n}" for n in parts])
        claims = [tuple(n.removesuffix(".json").split("/", 1)) for n in self.bucket.list("leases")
                  if not n.startswith("boxes/") and n.count("/") == 1]
        swept = [f"{v}/{k}" for v, k in claims if (v != version or k in commits) and take(v, k)]
        return sorted(set(swept) | {f"{version}/{n.split('/', 1)[0]}" for n in parts})

    def pull_commit(self, home: JobHome, version: str, key: str) -> bool:
        """The shard's committed output into the cache, if the bucket has a commit; True if so. A
        cached copy that is not what the commit recorded (damaged, replaced) is fetched again."""
        marker = home.commit_path(version, key)
        stats, labeled = home.stats_path(version, key), home.labeled_path(version, key)
        raw = marker.read_bytes() if marker.exists() else None
        commit = commit_of(raw)
        if commit is not None and stats.exists() and labeled.exists() and as_recorded(labeled, stats):
            return True
        if raw is None or commit is None:  # not in the cache, or a damaged copy there: the bucket's
            raw = self.bucket.get_bytes(self.rel(marker))
            if raw is None:
                return False
            commit = json.loads(raw)
        atomic_write_text(stats, json.dumps(commit["stats"], indent=2))
        self.bucket.get_file(commit["labeled"], labeled)
        atomic_write_text(marker, raw.decode())
        return True

    def pull_for_run(self, home: JobHome, version: str, keys: list[str]) -> None:
        """For shards whose leases a run just took: the commit another box made since (then their
        output), else the parts earlier attempts uploaded; one listing of the version's commits and
        one of its parts for all of them, not two requests a shard."""
        base = self.rel(home.version_dir(version))
        commits = self.bucket.list(f"{base}/commits")
        parts = self.bucket.list(f"{base}/parts")
        for key in keys:
            if f"{key}.json" in commits:
                self.pull_commit(home, version, key)
                continue
            folder = home.parts_dir(version, key)
            for name in (n.split("/", 1)[1] for n in parts if n.startswith(f"{key}/")):
                if not (folder / name).exists():
                    try:
                        self.bucket.get_file(f"{base}/parts/{key}/{name}", folder / name)
                    except FileNotFoundError:  # dropped since the listing (its box lost the shard): not needed
                        continue

    def _read_commit(self, rel: str) -> dict[str, Any]:
        """The commit that refused ours: it exists, but a store may show it a moment late."""
        for _ in range(20):
            raw = self.bucket.get_bytes(rel)
            if raw is not None:
                return dict(json.loads(raw))
            self.bucket.sleep(0.25)
        raise OSError(f"{self.bucket.url}/{rel}: the store refused to create it (it exists) but cannot read it: "
                      "run again to commit this shard")

    def push_part(self, path: Path) -> None:
        self.uploader.put(path, self.rel(path))

    def push_attempt(self, path: Path) -> None:
        self._own_attempts.add(path)
        self.uploader.put(path, self.rel(path))

    def commit_later(self, home: JobHome, version: str, key: str, attempt: str, done: Callable[[], None],
                     still_mine: Callable[[], bool] | None = None,
                     not_committed: Callable[[str], None] = lambda _: None) -> None:
        """:meth:`commit` from the upload thread, after everything queued before it (the shard's
        parts, its answer segment); then ``done`` if this attempt's commit is the one the bucket
        keeps. ``still_mine`` is asked first: a shard another box took over is not committed
        (``not_committed("lost")``); a commit another attempt made first wins
        (``not_committed("elsewhere")``). The run goes on generating meanwhile."""
        def task() -> None:
            if still_mine is not None and not still_mine():
                log.warning("%s of version %s: another box took it over before its commit: not committed here",
                            key, version)
                not_committed("lost")
                return
            if self.commit(home, version, key, attempt) == attempt:
                done()
            else:
                not_committed("elsewhere")
        self.uploader.do(task)

    def drop_parts_of(self, home: JobHome, version: str, key: str, tag: str) -> None:
        """Delete, after the uploads queued before it, the parts one attempt (``tag``) uploaded for
        a shard another box took over: that box has what it needs, and no part is left behind."""
        folder = self.rel(home.parts_dir(version, key))

        def task() -> None:
            mine = [n for n in self.bucket.list(folder) if n.endswith(f"-{tag}.parquet")]
            self.bucket.delete_many([f"{folder}/{n}" for n in mine])
        self.uploader.do(task)

    def commit(self, home: JobHome, version: str, key: str, attempt: str) -> str:
        """Publish a shard committed in the cache: its two objects, then the commit object, then
        its parts go (here and in the cache). Returns the attempt whose output the bucket keeps
        (ours, or one that committed first)."""
        stats, labeled = home.stats_path(version, key), home.labeled_path(version, key)
        base = self.rel(home.version_dir(version))
        names = {"labeled": f"{base}/labeled/{key}.{attempt}.parquet"}
        self.bucket.put_file(labeled, names["labeled"])
        # The stats ride in the commit object: one request less a shard, and they cannot part.
        body = {**names, "key": key, "version": version, "attempt": attempt,
                "committed_at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
                "stats": json.loads(stats.read_text())}
        marker = home.commit_path(version, key)
        raw = json.dumps(body, indent=2).encode()
        failpoint("bucket:commit")  # crash tests: the shard's objects are up, its commit is not
        if not self.bucket.put_bytes(self.rel(marker), raw, create=True):
            theirs = self._read_commit(self.rel(marker))
            if theirs.get("attempt") != attempt:  # not our own write retried: another run was first
                log.warning("%s of version %s was committed first by attempt %s: its output is kept, this "
                            "attempt's copy dropped", key, version, theirs.get("attempt"))
                self.bucket.delete(list(names.values()))
                home.labeled_path(version, key).unlink(missing_ok=True)
                marker.unlink(missing_ok=True)
                self.pull_commit(home, version, key)
                self._drop_parts(home, version, key)
                return str(theirs.get("attempt"))
            raw = json.dumps(theirs, indent=2).encode()
        atomic_write_text(marker, raw.decode())
        failpoint("bucket:committed")  # crash tests: committed in the bucket, its parts and claim not yet gone
        self._drop_parts(home, version, key)
        return attempt

    def _drop_parts(self, home: JobHome, version: str, key: str) -> None:
        """The shard's parts, in the bucket (the ones the cache holds: uploaded or fetched here)
        and in the cache: the shard is committed, they are not needed any more."""
        folder = home.parts_dir(version, key)
        names = [p.name for p in folder.glob("part-*.parquet")] if folder.exists() else []
        self.bucket.delete_many([f"{self.rel(folder)}/{n}" for n in names])
        shutil.rmtree(folder, ignore_errors=True)
