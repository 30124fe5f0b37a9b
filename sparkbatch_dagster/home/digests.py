"""Content digests of inputs and model files: output versions follow bytes, not mtimes, so a touched
file does not make a job pay again for answers it has. Full digests are cached in
``$SPARKBATCH_CACHE_DIR/digests.json`` on (resolved path, size, mtime_ns): a big model is hashed once."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

_BLOCK = 1 << 20  # 1 MiB: large enough for disk throughput, small enough for memory
_MAX_ENTRIES = 4096  # a few models and inputs; keeps the JSON cache quick to read and rewrite
#: Checksum fields of fsspec ``info()`` (s3: ETag, gcs: md5Hash/crc32c, az: etag, http: headers, hf: blob_id).
_CHECKSUM_KEYS = ("etag", "md5hash", "crc32c", "checksum", "content-md5", "blob_id")


def cache_path() -> Path:
    """Where digests are cached; read at call time so tests and callers can move it."""
    root = os.environ.get("SPARKBATCH_CACHE_DIR", "~/.cache/sparkbatch")
    return Path(root).expanduser() / "digests.json"


def _load_cache(path: Path) -> dict[str, list[Any]]:
    # A missing, empty, corrupt or unreadable cache is only a lost speed-up: start empty.
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _save_cache(path: Path, cache: dict[str, list[Any]]) -> None:
    # Drop entries of deleted files, then the oldest inserted, so the file stays small.
    kept = {k: v for k, v in cache.items() if os.path.exists(k)}
    kept = dict(list(kept.items())[-_MAX_ENTRIES:])
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".digests-", suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump(kept, fh)
        # Atomic: a concurrent reader sees the old or the new file, never half of one. Two
        # writers at once may lose one update; that costs a rehash later, nothing more.
        os.replace(tmp, path)
    except OSError:  # a read-only or full disk: run uncached rather than fail the job
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def file_digest(path: Path, *, drop_cache: bool = False) -> str:
    """sha256 hex of a file's bytes, cached on (resolved path, size, mtime_ns).

    ``drop_cache``: after hashing, tell the kernel the file's pages are not needed
    (``posix_fadvise(DONTNEED)``), so hashing a model's weights does not leave them in the page
    cache: on unified memory that cache is taken from the memory the engine measures next. A
    cache hit reads nothing. Example: ``file_digest(Path("model.safetensors"), drop_cache=True)``."""
    key = str(Path(path).resolve())
    before = os.stat(key)
    stamp = [before.st_size, before.st_mtime_ns]
    store = cache_path()
    cache = _load_cache(store)
    hit = cache.get(key)
    if isinstance(hit, list) and len(hit) == 3 and hit[:2] == stamp:
        return str(hit[2])
    h = hashlib.sha256()
    with open(key, "rb") as fh:
        while block := fh.read(_BLOCK):
            h.update(block)
        if drop_cache:
            _drop_pages(fh.fileno())
    digest = h.hexdigest()
    after = os.stat(key)
    # Only cache if the file did not change while we read it; else the entry could lie.
    if [after.st_size, after.st_mtime_ns] == stamp:
        cache.pop(key, None)  # re-insert at the end: the newest entries survive the cap
        cache[key] = [*stamp, digest]
        _save_cache(store, cache)
    return digest


def _drop_pages(fd: int) -> None:
    # Clean pages only (a file just read): they leave the cache at once. Not on every platform.
    if hasattr(os, "posix_fadvise"):
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def parquet_footer_digest(path: Path) -> str:
    """sha256 of a Parquet footer (schema, row groups, chunk sizes, statistics) plus the file size.

    Reads only the tail of a huge input. Weaker than a full hash: a rewrite keeping the size and
    every footer field would go unnoticed. Not valid Parquet: :func:`file_digest`.
    """
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        if size >= 12:
            head = fh.read(4)
            fh.seek(size - 8)
            tail = fh.read(8)
            footer_len = int.from_bytes(tail[:4], "little")
            if head == b"PAR1" and tail[4:] == b"PAR1" and footer_len <= size - 12:
                fh.seek(size - 8 - footer_len)
                return hashlib.sha256(f"parquet:{size}:".encode() + fh.read(footer_len)).hexdigest()
    return file_digest(path)


def object_info(url: str) -> dict[str, Any]:
    """fsspec ``info()`` of a remote object (fsspec imported only when a remote input needs it)."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(url)
    return dict(fs.info(path))


def info_checksum(info: dict[str, Any]) -> str | None:
    """The store's own checksum from an ``info()`` dict plus the size, or None if it gives none."""
    lowered = {str(k).lower(): v for k, v in info.items()}
    for key in _CHECKSUM_KEYS:
        value = lowered.get(key)
        if value:
            text = value.hex() if isinstance(value, (bytes, bytearray)) else str(value)
            return f"{key}:{text.strip(chr(34))}:{info.get('size')}"  # ETags come quoted
    return None
