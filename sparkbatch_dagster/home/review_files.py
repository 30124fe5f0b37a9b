"""What the review learnt and was told, kept in step between the bucket and a box's cache, and what
is set aside when one of those files is found damaged.

    calibration/<model>-<key>.json     a fitted confidence map per model and label set (overwritten)
    review/threshold.json              the review threshold a budget became (overwritten)
    review/*.json                      the review's other small records (the last export...)
    review/labels/<digest>.parquet     the reviewers' labels, append-only, named by their content
    review/queue/<event>-<digest>.parquet   the rows queued and dismissed (``run/review_members.py``)

:func:`pull` brings the bucket's copies into the cache (every refresh does it, so every read on any
box sees the same reviewers' labels, calibration, threshold and queue): a small file whose bytes differ
from the bucket's is replaced, a label or queue file is fetched when absent (or not the bucket's size). It checks
nothing: what the bytes mean is the reader's (``run/calibration_map.py``, ``run/review_queue.py``,
``run/human_labels.py``), which leaves a damaged file out; a writer then sets it aside with
:func:`set_aside` (and :func:`set_aside_object` in the bucket): renamed ``<name>.broken-<time>``, kept
for a look, never deleted, and one warning line.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from .atomic import atomic_write_bytes
from .bucket import Bucket
from .mirror import Mirror

log = logging.getLogger("sparkbatch")
#: The suffix a damaged file is set aside under (a name no reader globs: ``*.json``, ``*.parquet``).
BROKEN = ".broken-"


def broken_name(name: str) -> str:
    """``name`` as a damaged copy of it is kept: ``<name>.broken-<UTC time>``."""
    return f"{name}{BROKEN}{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"


_told: set[tuple[str, int, int]] = set()


def tell_once(path: Path, message: str) -> None:
    """Log ``message`` (a damaged file left out by a reader) once per process for this file as it is
    now: a command reads the same file several times, and a log says it once."""
    try:
        st = path.stat()
        seen = (str(path), st.st_size, st.st_mtime_ns)
    except OSError:
        seen = (str(path), -1, -1)
    if seen not in _told:
        _told.add(seen)
        log.warning("%s", message)


def pull(mirror: Mirror, calibration_dir: Path, review_dir: Path) -> None:
    """The bucket's calibrations, review records and label files into the cache (two listings, a GET
    per small file, a download per new label file)."""
    for folder in (calibration_dir, review_dir):
        rel = mirror.rel(folder)
        listing = mirror.bucket.list(rel)
        for name, size in sorted(listing.items()):
            if name.endswith(".json") and "/" not in name:
                fetch_bytes(mirror.bucket, f"{rel}/{name}", folder / name)
            elif name.startswith(("labels/", "queue/")) and name.endswith(".parquet") and name.count("/") == 1:
                local = folder / name
                if not local.exists() or local.stat().st_size != size:  # content-named: same size, same file
                    try:
                        mirror.bucket.get_file(f"{rel}/{name}", local)
                    except FileNotFoundError:  # set aside by another box since the listing
                        continue


def fetch_bytes(bucket: Bucket, rel: str, local: Path) -> bool:
    """The object's bytes into ``local`` (whole or absent), unless they are there already; True if
    the bucket has it. Bytes, not text: a garbled object is copied as it is, for its reader to judge."""
    raw = bucket.get_bytes(rel)
    if raw is None:
        return False
    if not local.exists() or local.read_bytes() != raw:
        local.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(local, raw)
    return True


def set_aside(path: Path, why: str, then: str) -> Path | None:
    """Rename a damaged file to :func:`broken_name` beside it, with one warning line saying ``why``
    and what ``then`` happens; None when it was gone already (another process set it aside)."""
    aside = path.with_name(broken_name(path.name))
    try:
        path.rename(aside)
    except FileNotFoundError:
        return None
    log.warning("%s is damaged (%s): set aside as %s; %s", path, why, aside.name, then)
    return aside


def set_aside_object(bucket: Bucket, rel: str, only_if: bytes | None = None) -> str | None:
    """Copy a damaged object to :func:`broken_name` beside it, then remove it, so that no box fetches
    it again; returns the name it is kept under (None: it was gone already, or its bytes are not
    ``only_if``, the damaged ones a box found: another box wrote it again since). The copy is made
    first: nothing is lost if the removal fails. (A good copy written over it between this read and
    the removal would go too: these files are rebuilt by the next analytics, or published again by a
    box that holds them.)"""
    raw = bucket.get_bytes(rel)
    if raw is None or (only_if is not None and raw != only_if):
        return None
    aside = broken_name(rel)
    bucket.put_bytes(aside, raw)
    bucket.delete([rel])
    log.warning("%s/%s is damaged in the bucket: kept as %s, removed from where boxes read it", bucket.url, rel,
                aside.rsplit("/", 1)[-1])
    return aside
