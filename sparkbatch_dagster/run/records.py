"""Typed records of one shard's run, what crosses rooms: an output row (:class:`OutputRow`, one
line of ``OUTPUT_SCHEMA``), a shard's statistics (:class:`ShardStats`, its ``stats/<key>.json``)
and a progress report (:class:`ProgressReport`).

Functions take and return these; the dict form exists only at the edges, through one method per
record: ``to_json()`` (a Parquet row, a JSON file, a DuckDB row, Dagster metadata) and, for what is
read back, ``from_json()``, which checks the types of a file and fills what an older release did
not write yet (a home written by yesterday's version keeps working)::

    stats = ShardStats.from_json(json.loads(home.stats_path(version, key).read_text()))
    stats.cost_usd, stats.to_json()["cost_usd"]
"""

from __future__ import annotations

from typing import Any

import msgspec


class OutputRow(msgspec.Struct, frozen=True):
    """One output row, its fields in ``checkpoint.OUTPUT_SCHEMA``'s order (a test holds them equal)."""

    row_id: str
    output: str | None
    error: str | None
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int
    deduplicated: bool
    reused: bool
    prompt_key: str | None
    fingerprint: str
    model: str
    finish_reason: str | None
    truncated: bool
    confidence: float | None
    reasoning: str | None
    reasoning_tokens: int
    extra: str | None = None
    #: The answer's own confidence; ``confidence`` is it calibrated (``run/calibration_map.py``).
    raw_confidence: float | None = None
    #: Set where a reviewer's label replaced the model's (``run/human_labels.py``): the model's answer,
    #: who reviewed and when (ISO-8601, UTC).
    model_output: str | None = None
    reviewed_by: str | None = None
    reviewed_at: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The row as Parquet (``pa.Table.from_pylist``) takes it."""
        return msgspec.structs.asdict(self)


#: Fields a stats file carries only when known (which input, which attempt, the commit record):
#: absent from the file, not null, when unknown.
_ONLY_WHEN_KNOWN = ("input_signature", "attempt", "labeled_sha256", "labeled_bytes")


class ShardStats(msgspec.Struct, frozen=True, kw_only=True):
    """One committed shard's statistics: the numbers behind ``run_metrics``, the partition's
    materialization and the bill (:func:`.shard_stats.shard_stats` makes them).

    ``wall_s`` and ``tokens_per_hour`` are generation alone, ``generation_cost_usd`` its price,
    ``cost_usd`` the whole bill (generation + the engine start charged to this shard). Fields an
    older release did not write read as their default; ``generated_requests`` and
    ``generation_cost_usd`` read as None there, which their readers tell apart (a prediction
    check of old stats scales by rows; their generation is their whole cost).
    """

    partition: str
    version: str
    model: str
    rows: int
    labeled: int
    errors: int
    error_reasons: dict[str, int] = {}
    input_tokens: int
    output_tokens: int
    wall_s: float
    engine_s: float = 0.0
    engine_start_s: float = 0.0
    tokens_per_hour: int = 0
    generation_cost_usd: float | None = None
    cost_usd: float
    prefix_cache_hit_rate: float | None = None
    resumed_rows: int = 0
    generated_requests: int | None = None
    reused_rows: int = 0
    deduplicated_rows: int = 0
    truncated_rows: int = 0
    reasoning_tokens: int = 0
    finished_at: str | None = None
    confidence_histogram: list[int] | None = None
    confidence_mean: float | None = None
    input_signature: str | None = None
    attempt: str | None = None
    labeled_sha256: str | None = None
    labeled_bytes: int | None = None

    @classmethod
    def from_json(cls, data: Any) -> ShardStats:
        """Stats read back from a file (or a bucket's commit object); a field of the wrong type
        raises :class:`msgspec.ValidationError` naming it."""
        return msgspec.convert(data, cls, strict=False)

    def to_json(self) -> dict[str, Any]:
        """The stats file's content, key for key as it has always been written."""
        out = msgspec.structs.asdict(self)
        for name in _ONLY_WHEN_KNOWN:
            if out[name] is None:
                del out[name]
        return out

    @property
    def generation_usd(self) -> float:
        """Generation's price; stats written before the engine start was kept apart hold it in ``cost_usd``."""
        return self.cost_usd if self.generation_cost_usd is None else self.generation_cost_usd

    @property
    def error_rate(self) -> float:
        return self.errors / max(self.rows, 1)


class ProgressReport(msgspec.Struct, frozen=True, kw_only=True):
    """Where a labeling run stands: rows done of the run's, the last answer's shard (with its own
    rows done when known), tokens per second, and the ETA (None: not known yet)."""

    partition: str
    rows_done: int
    rows_total: int
    tokens_per_s: float
    eta_s: float | None
    partition_rows_done: int | None = None
    partition_rows_total: int | None = None

    @property
    def finished(self) -> bool:
        return self.rows_done >= self.rows_total


class AttemptRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One run attempt's bill (``attempts/<id>.json``, :mod:`.attempts`): when it started and ended,
    its outcome (``running``, ``succeeded``, ``failed``, ``killed``), its wall time split into
    engine start and generation, what it committed, its cost and the part of it that bought
    nothing (``wasted_usd``). ``box``: where it ran; ``last_beat``: its last heartbeat;
    ``timings_s``: where its time went (the step's parts), when the run named them."""

    attempt: str
    version: str
    run_id: str | None = None
    pid: int | None = None
    started: str
    ended: str | None = None
    outcome: str = "running"
    error: str | None = None
    wall_s: float = 0.0
    engine_start_s: float = 0.0
    generation_s: float = 0.0
    prompts_generated: int = 0
    rows_committed: int = 0
    partitions_committed: int = 0
    cost_usd: float = 0.0
    committed_cost_usd: float = 0.0
    wasted_usd: float = 0.0
    engine_starts: int = 0
    box: str | None = None
    last_beat: str | None = None
    timings_s: dict[str, float] | None = None

    @classmethod
    def from_json(cls, data: Any) -> AttemptRecord:
        """A record read back from its file; a field of the wrong type raises
        :class:`msgspec.ValidationError` naming it."""
        return msgspec.convert(data, cls, strict=False)

    def to_json(self) -> dict[str, Any]:
        """The record's file content (``timings_s`` only where the run named its parts)."""
        out = msgspec.structs.asdict(self)
        if self.timings_s is None:
            del out["timings_s"]
        return out


class Bill(msgspec.Struct, frozen=True, kw_only=True):
    """The totals of a version's attempts: how many, what they cost, and what was paid for nothing."""

    attempts: int = 0
    attempts_cost_usd: float = 0.0
    wasted_usd: float = 0.0

    @classmethod
    def of(cls, records: list[AttemptRecord]) -> Bill:
        return cls(attempts=len(records), attempts_cost_usd=round(sum(r.cost_usd for r in records), 6),
                   wasted_usd=round(sum(r.wasted_usd for r in records), 6))

    def to_json(self) -> dict[str, Any]:
        return msgspec.structs.asdict(self)
