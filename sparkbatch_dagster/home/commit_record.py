"""What a committed labeled file must be, as its commit record says: the file's row count and the
sha256 of its bytes (and their length), written into the shard's statistics before the file itself
(a folder home's ``out/<v>/stats/shard-N.json``; with a bucket home the commit object holds them).

Every reader that counts a shard done checks the file against its record (:func:`mismatch`), so a
file replaced after its commit (a stray ``COPY ... TO``, a restore of the wrong backup) is found,
not counted: the next run recomputes that shard, its answers coming from the result store.
Records written before the hash was kept are checked on their row count only.

Example::

    data = parquet_bytes(table)
    stats.update(record_of(data))      # then write the stats, then the file (the commit point)
    mismatch(path, stats)              # None while the file is what the record says
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

log = logging.getLogger("sparkbatch")
_BLOCK = 1 << 20
#: Digests of files this process hashed, on (path, device, inode, size, mtime_ns, ctime_ns): a file
#: checked by every ``is_done`` of a command is read once. ctime changes with any rewrite or
#: rename into place, and cannot be set back by the writer; only this process's memory holds it.
_seen: dict[tuple[Any, ...], str] = {}
_seen_lock = threading.Lock()


def parquet_bytes(table: Any) -> bytes:
    """The Parquet file of ``table``, in memory: hashed, recorded, then written as it is."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return bytes(sink.getvalue().to_pybytes())


def record_of(data: bytes) -> dict[str, Any]:
    """The record's fields for a labeled file of these bytes (its rows are the stats' ``rows``)."""
    return {"labeled_sha256": hashlib.sha256(data).hexdigest(), "labeled_bytes": len(data)}


def sha256_of(path: Path) -> str:
    """sha256 hex of the file's bytes, hashed once per process while the file is unchanged."""
    st = os.stat(path)
    stamp = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    with _seen_lock:
        hit = _seen.get(stamp)
    if hit is not None:
        return hit
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_BLOCK):
            h.update(block)
    digest = h.hexdigest()
    with _seen_lock:
        _seen[stamp] = digest
    return digest


def mismatch(path: Path, stats: dict[str, Any], rows: int | None = None) -> str | None:
    """Why the labeled file at ``path`` is not the one its record (``stats``) describes; None when
    it is. ``rows``: the file's row count when the caller has read its footer already."""
    if rows is None:
        import pyarrow.parquet as pq

        rows = pq.read_metadata(path).num_rows
    if rows != stats["rows"]:
        return f"{path.name} holds {rows} rows, its commit recorded {stats['rows']}"
    size, digest = stats.get("labeled_bytes"), stats.get("labeled_sha256")
    if size is not None and path.stat().st_size != size:
        return f"{path.name} is {path.stat().st_size} bytes, its commit recorded {size}"
    if digest is not None and sha256_of(path) != digest:
        return f"{path.name} is not the file its commit recorded (its sha256 differs)"
    return None


def commit_of(raw: bytes | None) -> dict[str, Any] | None:
    """A commit object's body, or None when there is none or it does not parse whole."""
    try:
        commit = json.loads(raw) if raw is not None else None
    except ValueError:
        return None
    return commit if isinstance(commit, dict) and {"stats", "labeled"} <= commit.keys() else None


def as_recorded(labeled: Path, stats: Path) -> bool:
    """Whether a bucket home's cached labeled file is the one its stats (the commit's) describe;
    when not, says so (the caller fetches it again)."""
    import pyarrow as pa

    try:
        why = mismatch(labeled, json.loads(stats.read_text()))
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowInvalid) as exc:
        why = str(exc)
    if why is not None:
        log.warning("%s in the cache is not what its commit recorded (%s): fetched again", labeled, why)
    return why is None
