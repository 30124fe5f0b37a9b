"""``current.json``: which output version readers see. It moves only forward, whatever the store's latency.

A version becomes current when a run of it has a committed shard, and only while the home's
input is still the one that version was labeled from (``signature``, the shard manifest's). The
check and the write are one step: in a folder home under a lock file (every writer is on this
machine), in a bucket as a conditional write on the pointer's version tag read *before* the
manifest. A writer whose input was replaced since finds the new manifest, or loses the
conditional write to the box that replaced it and then finds the new manifest: either way it
leaves the pointer alone. So a slow PUT of an old input's pointer (docs/protocol.md) can land
only over the pointer it read, never over a newer input's.

A pointer that does not parse is derived again from what is committed: the version whose shard
stats name the manifest's signature, the most recently committed if several do. Reading never
writes the home: the next run's :func:`advance` writes the pointer whole.

Example::

    advance(home, "0123456789abcdef", "smollm2", signature=manifest["signature"])  # True: current now
    read(home)  # Current(version="0123456789abcdef", model="smollm2", signature="...")
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from .atomic import atomic_write_text
from .locks import FileLock
from .mirror import Mirror

log = logging.getLogger("sparkbatch")


class JobHome(Protocol):
    """What the pointer needs of a home (``layout.JobHome``, which holds the pointer)."""

    root: Path
    remote: Mirror | None

    @property
    def location(self) -> str: ...
    @property
    def current_path(self) -> Path: ...
    def input_signature_now(self) -> str | None: ...


@dataclass(frozen=True)
class Current:
    """What ``current.json`` says: the version readers see, its model, and the input signature it
    was labeled from (None in pointers written before the signature was recorded)."""

    version: str
    model: str
    signature: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def parse(raw: bytes | str) -> Current | None:
    """The pointer in ``raw``; None when it does not parse (a damaged file)."""
    try:
        data = json.loads(raw)
        return Current(str(data["version"]), str(data.get("model") or ""), data.get("signature"))
    except (ValueError, KeyError, TypeError):
        return None


def read(home: JobHome) -> Current | None:
    """The current version (None before any commit). A damaged pointer is derived again from
    the commits (and logged); nothing is written."""
    path = home.current_path
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    found = parse(raw)
    if found is None:
        found = derive(home)
        log.warning("%s does not parse: the current version is taken from the commits (%s); the next run "
                    "writes it again", path, found.version if found else "none yet")
    return found


def derive(home: JobHome) -> Current | None:
    """The version the commits make current: of the versions with a committed shard labeled from
    the manifest's input, the one committed last (the bucket's commits for a bucket home)."""
    signature = home.input_signature_now()
    best: tuple[float, Current] | None = None
    for at, version, stats in _committed(home):
        if isinstance(stats, dict) and stats.get("input_signature") == signature and (best is None or at > best[0]):
            best = (at, Current(version, str(stats.get("model") or ""), signature))
    return best[1] if best else None


def _committed(home: JobHome) -> Iterator[tuple[float, str, Any]]:
    """(when, version, stats) of every committed shard the home holds."""
    if home.remote is None:
        for path in (home.root / "out").glob("*/stats/shard-*.json"):
            with contextlib.suppress(OSError, ValueError):
                yield path.stat().st_mtime, path.parent.parent.name, json.loads(path.read_text())
        return
    bucket = home.remote.bucket
    for name in bucket.list("out"):
        version, _, rest = name.partition("/")
        if not rest.startswith("commits/"):
            continue
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            body = json.loads(bucket.get_bytes(f"out/{name}") or b"")
            yield datetime.fromisoformat(body["committed_at"]).timestamp(), version, body["stats"]


def advance(home: JobHome, version: str, model: str, signature: str | None) -> bool:
    """Point ``current.json`` at ``version`` if the home's input is still ``signature``; True when
    it names ``version`` now. A folder home checks and writes under a lock; a bucket home
    writes on the condition that the pointer is still the one read before the check."""
    new = Current(version, model, signature)
    if home.remote is None:
        with FileLock(home.root / ".current.lock").held():
            seen = parse(home.current_path.read_bytes()) if home.current_path.exists() else None
            if seen is not None and seen.version == version:  # a damaged one is written again, whole
                return True
            if home.input_signature_now() != signature:
                return False
            atomic_write_text(home.current_path, new.to_json())
            return True
    written, raw = home.remote.bucket.put_forward(
        home.remote.rel(home.current_path), new.to_json().encode(),
        settled=lambda raw: (found := parse(raw)) is not None and found.version == version,
        may_write=lambda: home.input_signature_now() == signature)
    if raw is not None:
        _keep_local(home.current_path, raw)
    return written


def heal(home: JobHome) -> bool:
    """A writer's repair of a pointer that does not parse (the bucket's, for a bucket home): written
    again, whole, from the commits (:func:`derive`). True if it wrote one."""
    if home.remote is None:
        raw = home.current_path.read_bytes() if home.current_path.exists() else None
    else:
        raw = home.remote.bucket.get_bytes(home.remote.rel(home.current_path))
    if raw is None or parse(raw) is not None:
        return False
    found = derive(home)
    if found is None:
        return False
    log.warning("%s: current.json did not parse: written again from the commits (%s)", home.location, found.version)
    return advance(home, found.version, found.model, found.signature)


def _keep_local(path: Path, raw: bytes) -> None:
    """The bucket's pointer, copied into the cache (whole or absent, as every cache file)."""
    if not path.exists() or path.read_bytes() != raw:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, raw.decode())
