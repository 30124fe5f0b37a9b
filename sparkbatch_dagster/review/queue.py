"""The rows ``sparkbatch review export`` sends: the job's ``review`` view (least sure first) with
each row's text columns, less the rows a reviewer already labeled; and the note of the last export
(``review/exported.json``).

Example::

    queue, reviewed = read_queue(job, resource, ["fruit", "vehicle"], limit=200)
    queue[0].data()          # {'row_id': 'id-00004', 'text': 'A cherry.'}
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ..errors import SparkbatchError
from ..home import JobHome, atomic_write_text
from ..inputs.shards import quote_ident
from ..run.metrics import committed_stats
from ..run.query import read_only
from ..run.views import sql_path

#: Data keys the task itself uses: a text column of that name is shown under another key.
RESERVED = {"row_id", "label"}


@dataclass(frozen=True)
class QueueRow:
    """One row to review: the model's answer, its confidence and model, and the row's text by key."""

    row_id: str
    output: str
    score: float
    model: str
    texts: dict[str, str] = field(default_factory=dict)

    def data(self) -> dict[str, str]:
        """The task's data: ``row_id`` and the text fields."""
        return {"row_id": self.row_id, **self.texts}


def text_keys(text_columns: Sequence[str]) -> list[tuple[str, str]]:
    """Each text column and the key it has in a task's data (and the labeling config): its own name
    where Label Studio can use it as a ``$variable``, else ``text_<i>``."""
    return [(c, c if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", c) and c not in RESERVED else f"text_{i}")
            for i, c in enumerate(text_columns)]


def read_queue(job: Any, resource: Any, labels: Sequence[str], limit: int | None) -> tuple[list[QueueRow], int]:
    """The review queue of the resource's version, least sure first (the ``review`` view: rows with a
    human label are not in it), the first ``limit`` of its rows whose answer is one of ``labels``; and
    how many queued rows a reviewer has labeled."""
    home: JobHome = job.home
    home.refresh()  # a bucket home: the cache in step with the bucket, the reviewers' labels included
    version = job.output_version(resource)
    keys = text_keys(job.spec.text_columns)
    shards = [home.shard_path(k) for k in sorted(committed_stats(home, version))]
    if not shards:
        raise SparkbatchError(f"no partition of job {job.spec.name!r} is labeled yet (version {version}): "
                              "`sparkbatch run` first, then export its review queue")
    texts = ", ".join(f"CAST(s.{quote_ident(c)} AS VARCHAR) AS {quote_ident('t_' + k)}" for c, k in keys)
    sql = (f"SELECT r.row_id, r.output, r.confidence, r.model, {texts} FROM review r "
           f"JOIN read_parquet([{', '.join(map(sql_path, shards))}]) s ON s.row_id = r.row_id "
           "WHERE r.output IS NOT NULL ORDER BY r.review_rank")  # the view's order: ties by the raw confidence
    with read_only(job.spec, home, version) as con:
        rows = con.execute(sql).fetchall()
        # Queued rows a reviewer labeled already (the review view leaves them out): the export says how many.
        reviewed = con.execute("SELECT count(*) FROM queued WHERE review_state = 'reviewed'").fetchone()[0]
    allowed = set(labels)
    fresh = [r for r in rows if r[1] in allowed]
    queue = [QueueRow(row_id=str(r[0]), output=r[1], score=round(float(r[2]), 6), model=str(r[3] or ""),
                      texts={k: "" if v is None else v for (_, k), v in zip(keys, r[4:], strict=True)})
             for r in fresh[:limit]]
    return queue, int(reviewed)


def save_export(home: JobHome, result: dict[str, Any], row_ids: list[str]) -> None:
    """Note what was exported last, and when (``review/exported.json``; published to a bucket home)."""
    path = home.review_dir / "exported.json"
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    atomic_write_text(path, json.dumps({**result, "exported_at": when, "row_ids": row_ids}, indent=1) + "\n")
    home.publish(path)
