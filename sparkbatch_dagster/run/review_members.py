"""Who is in the review queue: the rows ever queued, and the rows a reviewer dismissed, kept in the
job's home under ``review/queue/`` so that a later cut never drops a queued row silently.

A row enters the queue when the cut in force (``run/review_queue.py``) selects it and the queue is
published: the ``review_queue`` asset materializes (``sparkbatch run`` does it at its end) or
``sparkbatch review export`` sends it. It leaves only when a reviewer labels it (``run/human_labels.py``)
or dismisses it: a dismissal is explicit (``sparkbatch review import --dismiss-skipped`` turns the
tasks a reviewer skipped in Label Studio into dismissals; a skip alone is "not now", and the row stays).

The store is append-only, like the human labels: each write is one Parquet file named by the digest of
what it adds (``event``: ``queued`` or ``dismissed``), so two boxes writing at once lose nothing and
writing the same rows again adds no file.

Example::

    remember(home, ["pkg-1", "pkg-2"], "queued", by="review_queue", note="least sure 0.05 of rows")
    members(home).queued        # {'pkg-1', 'pkg-2'}
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from ..home import JobHome, atomic_write_parquet
from ..home.review_files import tell_once

Event = Literal["queued", "dismissed"]
COLUMNS = ("row_id", "event", "at", "by", "note")


@dataclass(frozen=True)
class Members:
    """The rows ever queued and the rows dismissed, by row id."""

    queued: frozenset[str] = field(default_factory=frozenset)
    dismissed: frozenset[str] = field(default_factory=frozenset)


def queue_folder(home: JobHome) -> Path:
    return home.review_dir / "queue"


def members(home: JobHome) -> Members:
    """Every row queued and every row dismissed, from the cache (``home.pull_review()`` brings a bucket's)."""
    import pyarrow.parquet as pq

    queued: set[str] = set()
    dismissed: set[str] = set()
    for path in sorted(queue_folder(home).glob("*.parquet")):
        try:
            table = pq.read_table(path, columns=["row_id", "event"])
        except Exception as exc:  # a damaged file is left out, said once: the next publish queues the cut again
            tell_once(path, f"{path} is left out (not a review-queue file: {str(exc).splitlines()[0]}): move it "
                            "away; the review_queue asset queues the current cut again")
            continue
        for row_id, event in zip(table.column("row_id").to_pylist(), table.column("event").to_pylist(), strict=True):
            (dismissed if event == "dismissed" else queued).add(str(row_id))
    return Members(frozenset(queued), frozenset(dismissed))


def remember(home: JobHome, row_ids: Iterable[str], event: Event, by: str, note: str = "") -> Path | None:
    """Append ``row_ids`` as ``event`` (those not recorded so already in the cache: a caller on a bucket
    home refreshes it first, and a row another box recorded since is only recorded twice, the union the
    same): one new file, published to a bucket home; None when every row was recorded before."""
    import pyarrow as pa

    seen = members(home)
    known = seen.queued if event == "queued" else seen.dismissed
    new = sorted(set(map(str, row_ids)) - known)
    if not new:
        return None
    at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    body = json.dumps([event, new], sort_keys=True).encode()  # the same rows again: the same name
    path = queue_folder(home) / f"{event}-{hashlib.sha256(body).hexdigest()[:32]}.parquet"
    table = pa.table({"row_id": new, "event": [event] * len(new), "at": [at] * len(new), "by": [by] * len(new),
                      "note": [note] * len(new)}, schema=pa.schema([(c, pa.string()) for c in COLUMNS]))
    atomic_write_parquet(path, table, point="write:review_queue")
    home.publish(path)
    return path
