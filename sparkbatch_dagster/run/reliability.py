"""How far a model's confidence can be trusted: answers grouped in ten confidence buckets
([0, 0.1), [0.1, 0.2), ..., [0.9, 1.0]), and in each the share that was right.

One bucket rule for every reader: each shard's histogram (:mod:`.shard_stats`), the
``reliability`` view (:mod:`.metrics`, the same rule in SQL: :data:`BUCKET_SQL`) and the
estimate's table per model (``estimate/forecast.py``). A row with no confidence (an error row,
free text, a file written before confidences were kept) is in no bucket.

Example::

    reliability([(0.95, True), (0.97, False), (0.42, True)])
    # [{'bucket': '0.4-0.5', 'low': 0.4, 'high': 0.5, 'rows': 1, 'correct': 1, 'accuracy': 1.0,
    #   'truth_rows': 1, 'mean_confidence': 0.42},
    #  {'bucket': '0.9-1.0', ..., 'rows': 2, 'correct': 1, 'accuracy': 0.5, 'mean_confidence': 0.96}]
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

BUCKETS = 10
#: :func:`bucket` in DuckDB, over a column named ``confidence``: the same double arithmetic
#: (x * 10, floored), so a value on a bucket's edge lands where Python puts it.
BUCKET_SQL = f"least(greatest(floor(confidence * {BUCKETS}), 0), {BUCKETS - 1})::INTEGER"


def bucket(confidence: float) -> int:
    """The bucket of a confidence: 0 for [0, 0.1), ..., 9 for [0.9, 1.0] (1.0 included)."""
    return min(max(math.floor(confidence * BUCKETS), 0), BUCKETS - 1)


def bucket_name(index: int) -> str:
    """``'0.9-1.0'`` for bucket 9."""
    return f"{index / BUCKETS:.1f}-{(index + 1) / BUCKETS:.1f}"


def histogram(confidences: Iterable[float | None]) -> list[int]:
    """Rows per bucket (ten counts); rows with no confidence are left out."""
    counts = [0] * BUCKETS
    for c in confidences:
        if c is not None and not math.isnan(c):
            counts[bucket(c)] += 1
    return counts


def reliability(pairs: Iterable[tuple[float, bool]]) -> list[dict[str, Any]]:
    """Per non-empty bucket of (confidence, right) pairs: rows, correct, accuracy, mean confidence."""
    rows, right, total = [0] * BUCKETS, [0] * BUCKETS, [0.0] * BUCKETS
    for confidence, correct in pairs:
        b = bucket(confidence)
        rows[b] += 1
        right[b] += bool(correct)
        total[b] += confidence
    return [bucket_row(b, rows[b], right[b], total[b] / rows[b]) for b in range(BUCKETS) if rows[b]]


def bucket_row(index: int, rows: int, correct: int | None, mean_confidence: float,
               truth_rows: int | None = None) -> dict[str, Any]:
    """One bucket as :func:`reliability` and the ``reliability`` view give it: ``accuracy`` is
    ``correct`` over ``truth_rows``, the bucket's rows whose truth is known (default: all of them)."""
    known = rows if truth_rows is None else truth_rows
    return {"bucket": bucket_name(index), "low": index / BUCKETS, "high": (index + 1) / BUCKETS, "rows": rows,
            "truth_rows": known, "correct": correct,
            "accuracy": round(correct / known, 4) if correct is not None and known else None,
            "mean_confidence": round(mean_confidence, 4)}


def describe(table: Sequence[dict[str, Any]]) -> list[str]:
    """Each bucket in words, most confident first: 'confidence 0.9-1.0: right 94% of the time
    (120 rows, mean confidence 0.953)'."""
    return [f"confidence {b['bucket']}: right {b['accuracy']:.0%} of the time ({_rows(b)}, mean confidence "
            f"{b['mean_confidence']:.3f})" for b in reversed(table) if b.get("accuracy") is not None]


def _rows(b: dict[str, Any]) -> str:
    known = b.get("truth_rows", b["rows"])
    return f"{b['rows']:,} rows" if known == b["rows"] else f"of {known:,} rows with a truth, {b['rows']:,} in all"
