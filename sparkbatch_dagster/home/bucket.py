"""An object store as a job's home: one fsspec filesystem and a root prefix, every call retried.

What an object store gives, and what it does not: a PUT is all or nothing (a reader sees the
whole object or none), a rename is a copy, there is no folder to fsync, and a request can fail
after it landed (the reply lost on the way back). So everything here writes an object once,
under a name nobody else uses, and the few objects that decide something (a shard's commit, a
lease) are written with a condition the store checks: create only if absent (``If-None-Match``)
or replace only the version read (``If-Match``), on S3 and S3-compatible stores. A retry after
a reply was lost finds its own object there; callers compare the content to tell "mine" from
"someone else's".

Credentials never pass through here as text in the spec: s3fs and gcsfs find them the way their
users expect (``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``, ``~/.aws``, instance roles,
``GOOGLE_APPLICATION_CREDENTIALS``), and ``storage_options`` values may name an environment
variable (a Dagster ``EnvVar``, or ``{"env": "NAME"}`` in YAML) that is read at connect time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ..errors import ConfigError

log = logging.getLogger("sparkbatch")
T = TypeVar("T")

#: Tries per call: botocore already retries a 500/503 a few times inside one; this covers a
#: dropped connection or a burst of errors longer than its own budget.
TRIES = 6


def is_url(location: str | os.PathLike[str] | None) -> bool:
    """True for an object-store URL (``s3://``, ``gs://``...); False for a path or ``file://``."""
    text = str(location or "")
    return "://" in text and not text.startswith("file://")


def resolve_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``storage_options`` with every environment reference read now: a Dagster ``EnvVar`` (its
    text is the variable's name) or ``{"env": "NAME"}``. A missing variable is refused by name."""
    out: dict[str, Any] = {}
    for key, value in options.items():
        name = None
        if type(value).__name__ == "EnvVar" and isinstance(value, str):  # dagster.EnvVar, not imported here
            name = str.__str__(value)
        elif isinstance(value, Mapping) and set(value) == {"env"}:
            name = str(value["env"])
        if name is None:
            out[key] = resolve_options(value) if isinstance(value, Mapping) else value
            continue
        if name not in os.environ:
            raise ConfigError(f"storage_options[{key!r}] reads the environment variable {name}, which is not set: "
                              f"export {name}=... before the run (the value never goes in the spec)")
        out[key] = os.environ[name]
    return out


def _transient(exc: BaseException) -> bool:
    """A failure worth another try: not an answer about the object or the caller's rights."""
    if isinstance(exc, (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError,
                        NotADirectoryError, ConfigError)):
        return False
    if precondition_failed(exc):
        return False
    return isinstance(exc, (OSError, TimeoutError, ConnectionError)) or type(exc).__module__.startswith(
        ("aiohttp", "botocore", "aiobotocore", "urllib3", "requests"))


def precondition_failed(exc: BaseException) -> bool:
    """True when a conditional write was refused because the object changed (If-Match lost)."""
    text = str(exc)
    return "pre-conditions" in text or "PreconditionFailed" in text or "ConditionalRequestConflict" in text


class Bucket:
    """A prefix in an object store: ``Bucket("s3://my-bucket/jobs/tickets")``.

    Example::

        b = Bucket("s3://my-bucket/jobs/tickets")
        b.check()                                   # one line naming the URL and the fix, or nothing
        b.put_bytes("commits/shard-00000.json", b"{}", create=True)   # False if it was there already
        b.get_bytes("commits/shard-00000.json")                       # None when absent
    """

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.url = url.rstrip("/")
        self.protocol, self.root = self.url.split("://", 1)
        self._options = dict(storage_options or {})
        self._fs: Any = None
        #: S3 (and MinIO, R2...) check If-None-Match / If-Match; other stores get write-then-read-back.
        self.conditional = self.protocol in ("s3", "s3a")
        self.sleep: Callable[[float], None] = time.sleep

    @property
    def fs(self) -> Any:
        """The fsspec filesystem, made at first use: definitions load without the store's package,
        its credentials or the network (the Dagster UI), and a secret is read only when needed."""
        if self._fs is None:
            import fsspec

            try:
                # No listings cache: another box adds objects at any time, and s3fs answers "absent"
                # for a key missing from a listing it cached, even to a read of that very key.
                options = {"use_listings_cache": False, **resolve_options(self._options)}
                if self.conditional and "config_kwargs" not in options:
                    # Claims and releases go 32 at a time (run/claims.py): as many connections.
                    options["config_kwargs"] = {"max_pool_connections": 32}
                self._fs, _ = fsspec.core.url_to_fs(self.url, skip_instance_cache=True, **options)
            except ImportError as exc:
                extra = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}.get(self.protocol)
                fix = (f"pip install 'sparkbatch-dagster[{extra}]'" if extra
                       else f"install the fsspec backend of {self.protocol}://")
                raise ConfigError(f"home {self.url}: {exc}: {fix}") from exc
        return self._fs

    def __repr__(self) -> str:
        return f"Bucket({self.url!r})"  # never the options: they may hold a key

    def path(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def _retry(self, what: str, call: Callable[[], T]) -> T:
        delay = 0.2
        for n in range(TRIES):
            try:
                return call()
            except Exception as exc:
                if not _transient(exc) or n == TRIES - 1:
                    raise
                log.info("%s %s failed (%s: %s): retrying in %.1f s", what, self.url, type(exc).__name__,
                         str(exc)[:200], delay)
                self.sleep(delay * (1 + random.random() / 2))
                delay = min(delay * 2, 5.0)
        raise AssertionError("unreachable")

    def check(self, write: bool = True) -> None:
        """Fail fast, before any engine starts: the bucket exists and these credentials may read
        it, and (``write``) write it: a probe object written and removed. One line naming the URL
        and the fix."""
        bucket = self.root.split("/", 1)[0]
        probe = f".sparkbatch-probe-{os.getpid()}-{random.getrandbits(32):08x}"
        try:
            self._retry("list", lambda: self.fs.ls(bucket, refresh=True))
            if write:
                self._retry("write", lambda: self.fs.pipe_file(self.path(probe), b"ok"))
                self._retry("delete", lambda: self.fs.rm_file(self.path(probe)))
        except PermissionError as exc:
            raise ConfigError(f"home {self.url}: the store refused these credentials ({_first_line(exc)}): set "
                              "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or storage_options with EnvVar) to keys "
                              "that may read and write it") from exc
        except FileNotFoundError as exc:
            raise ConfigError(f"home {self.url}: bucket {bucket!r} does not exist ({_first_line(exc)}): create it "
                              f"(e.g. `aws s3 mb {self.protocol}://{bucket}`) or fix the URL") from exc
        except OSError as exc:
            raise ConfigError(f"home {self.url}: the store cannot be reached ({_first_line(exc)}): check the URL, "
                              "AWS_ENDPOINT_URL and the network") from exc

    def _conditions(self, rel: str, create: bool, if_match: str | None) -> dict[str, Any] | None:
        """``pipe_file``'s keywords for a conditional write; None when ``create`` finds the object
        there already on a store that cannot check the condition itself."""
        kw: dict[str, Any] = {}
        if create and self.conditional:
            kw["mode"] = "create"
        if if_match is not None and self.conditional:
            kw["IfMatch"] = if_match
        if create and not self.conditional and self.exists(rel):
            return None
        return kw

    def put_bytes(self, rel: str, data: bytes, create: bool = False, if_match: str | None = None) -> bool:
        """Write one object. ``create``: only if absent (False when it exists). ``if_match``:
        only over that version (an ETag; raises when it changed, see :func:`precondition_failed`)."""
        kw = self._conditions(rel, create, if_match)
        if kw is None:
            return False
        try:
            self._retry("write", lambda: self.fs.pipe_file(self.path(rel), data, **kw))
        except FileExistsError:
            return False
        return True

    def put_tagged(self, rel: str, data: bytes, create: bool = False, if_match: str | None = None) -> str | None:
        """:meth:`put_bytes` that returns the new object's version tag (from the PUT's reply where
        the store gives it, else read back); raises FileExistsError when ``create`` finds it there."""
        kw = self._conditions(rel, create, if_match)
        if kw is None:
            raise FileExistsError(self.path(rel))
        reply = self._retry("write", lambda: self.fs.pipe_file(self.path(rel), data, **kw))
        tag = reply.get("ETag") if isinstance(reply, Mapping) else None
        return str(tag) if tag else self.etag(rel)

    def put_forward(self, rel: str, data: bytes, settled: Callable[[bytes], bool], may_write: Callable[[], bool],
                    tries: int = 20) -> tuple[bool, bytes | None]:
        """Write ``data`` only over the version read right before ``may_write()`` said yes (a small
        pointer that must only move forward, under any store latency): the tag is read first, so
        content newer than the tag only makes the write fail, and a lost write is read again.
        Returns (True, what the object holds) once it is ``data`` or ``settled`` by what is there;
        (False, the bytes last read) when ``may_write()`` says no or the object kept moving."""
        raw: bytes | None = None
        for _ in range(tries):
            tag = self.etag(rel)
            raw = self.get_bytes(rel)
            if raw is not None and settled(raw):  # ours already (a reply lost), or another's that will do
                return True, raw
            if not may_write():
                return False, raw
            if raw is not None and tag is None:
                continue  # created between the two reads: read both again
            try:
                if self.put_bytes(rel, data, create=raw is None, if_match=None if raw is None else tag):
                    return True, data
            except OSError as exc:  # FileNotFoundError too: deleted since read
                if not (precondition_failed(exc) or isinstance(exc, FileNotFoundError)):
                    raise
            log.info("%s moved while being written: read again", self.path(rel))
        log.warning("%s kept moving under %d conditional writes: left as it is", self.path(rel), tries)
        return False, raw

    def put_file(self, local: Path, rel: str) -> None:
        self._retry("upload", lambda: self.fs.put_file(str(local), self.path(rel)))

    def get_bytes(self, rel: str) -> bytes | None:
        """A small object's bytes (None when absent): one GET (s3fs would HEAD for the size first)."""
        kw = {"max_concurrency": 1} if self.conditional else {}
        try:
            return self._retry("read", lambda: bytes(self.fs.cat_file(self.path(rel), **kw)))
        except FileNotFoundError:
            return None

    def etag(self, rel: str) -> str | None:
        """The object's version tag (for ``if_match``), or None when absent."""
        try:
            info = self._retry("stat", lambda: self.fs.info(self.path(rel), refresh=True))
        except FileNotFoundError:
            return None
        return info.get("ETag") or info.get("etag")

    def get_file(self, rel: str, local: Path) -> None:
        """Download to ``local`` through a temporary name: a cache file is whole or absent."""
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(f".{local.name}.dl-{os.getpid()}")
        self._retry("download", lambda: self.fs.get_file(self.path(rel), str(tmp)))
        os.replace(tmp, local)

    def exists(self, rel: str) -> bool:
        self.fs.invalidate_cache(self.path(rel))
        return bool(self._retry("stat", lambda: self.fs.exists(self.path(rel))))

    def list(self, rel: str) -> dict[str, int]:
        """Every object under ``rel`` (recursively): its name relative to ``rel``, and its size."""
        base = self.path(rel).rstrip("/")
        self.fs.invalidate_cache(base)
        try:
            found = self._retry("list", lambda: self.fs.find(base, detail=True))
        except FileNotFoundError:
            return {}
        return {name[len(base) + 1:]: int(info.get("size") or 0) for name, info in found.items()
                if name.startswith(base + "/") and info.get("type", "file") == "file"}

    def delete_many(self, rels: Sequence[str]) -> None:
        """Remove several objects in one request where the store can (S3's DeleteObjects)."""
        if rels:
            with contextlib.suppress(FileNotFoundError):
                self._retry("delete", lambda: self.fs.rm([self.path(r) for r in rels]))

    def delete(self, rels: Iterable[str]) -> None:
        """Remove objects; already gone is fine (a retry, or another box's cleanup)."""
        for rel in rels:
            with contextlib.suppress(FileNotFoundError):
                self._retry("delete", lambda rel=rel: self.fs.rm_file(self.path(rel)))  # type: ignore[misc]


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]
