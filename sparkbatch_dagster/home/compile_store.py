"""Where a home keeps engine compile caches, so a new machine starts warm (``engines/platform/compile_cache.py``).

    <home>/compile-cache/<key>.tar.gz      a folder home: a file, replaced whole (temporary name, rename)
    <url>/compile-cache/<key>.tar.gz       a bucket home: one object (a PUT is all or nothing)

One archive per key (vLLM build, device, model, dtype, compiled settings); boxes of the same kind
share it. Two boxes saving the same key at once each write a whole archive, and the last one
stays: either is valid for the key. Unlike everything else in the home it is a cache: deleting
it costs the next new machine one cold compile, nothing more.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from ..errors import ConfigError
from .atomic import _durable_replace
from .layout import JobHome

FOLDER = "compile-cache"


def archive_rel(key: str) -> str:
    """The archive's path inside the home; ``key`` must be a compile-cache key (16 hex digits)."""
    if not re.fullmatch(r"[0-9a-f]{16}", key):
        raise ConfigError(f"compile cache key {key!r} is not 16 hex digits")
    return f"{FOLDER}/{key}.tar.gz"


def location(home: JobHome, key: str) -> str:
    """Where the archive of ``key`` lives, for messages: a path, or the bucket's URL."""
    return f"{home.location}/{archive_rel(key)}"


def stored_size(home: JobHome, key: str) -> int | None:
    """The size of the home's archive of ``key`` in bytes; None when it has none."""
    rel = archive_rel(key)
    if home.remote is not None:
        return home.remote.bucket.list(FOLDER).get(rel.split("/", 1)[1])
    path = home.root / rel
    return path.stat().st_size if path.is_file() else None


def fetch(home: JobHome, key: str, into: Path) -> Path | None:
    """A local file holding the home's archive of ``key``, or None when it has none: a folder
    home's own file (read it, never delete it), or a bucket's object downloaded to ``into``."""
    rel = archive_rel(key)
    if home.remote is None:
        path = home.root / rel
        return path if path.is_file() else None
    try:
        home.remote.bucket.get_file(rel, into)
    except FileNotFoundError:
        return None
    return into


def store(home: JobHome, key: str, archive: Path) -> None:
    """Put ``archive`` in the home as the archive of ``key``, whole or not at all."""
    rel = archive_rel(key)
    if home.remote is not None:
        home.remote.bucket.put_file(archive, rel)
        return
    path = home.root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        shutil.copyfile(archive, tmp)
        _durable_replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
