"""Typed records of a version's totals, what crosses rooms: the bill of its committed shards
against the estimate (:class:`CostCheck`), the analytics' headline numbers (:class:`Headline`)
and the summary ``sparkbatch run`` prints (:class:`RunSummary`). As in :mod:`.records`, the dict
form exists only at the edges, through ``to_json()``: the CLI's JSON line, Dagster metadata."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class Prediction:
    """The estimate's generation time, scaled to what the committed shards generated, against
    the time they took (``error_pct`` None where they took none)."""

    predicted_wall_s: float
    actual_wall_s: float
    error_pct: float | None


@dataclass(frozen=True)
class CostCheck:
    """The bill of a version's committed shards: ``cost_usd`` everything the box was rented for
    (generation plus every engine start a run paid), split into ``generation_cost_usd`` and
    ``engine_start_cost_usd`` (``engine_start_s``); and, when an estimate was made, its check."""

    cost_usd: float = 0.0
    generation_cost_usd: float = 0.0
    engine_start_s: float = 0.0
    engine_start_cost_usd: float = 0.0
    prediction: Prediction | None = None

    def to_json(self) -> dict[str, Any]:
        """``run_metrics``' ``job_*`` metadata and its log line, key for key as before."""
        out: dict[str, Any] = {"cost_usd": self.cost_usd, "generation_cost_usd": self.generation_cost_usd,
                               "engine_start_s": self.engine_start_s,
                               "engine_start_cost_usd": self.engine_start_cost_usd}
        if self.prediction is not None:
            p = self.prediction
            out.update(predicted_wall_s=p.predicted_wall_s, actual_wall_s=p.actual_wall_s,
                       prediction_error_pct=p.error_pct)
        return out


@dataclass(frozen=True)
class Confidence:
    """How sure the model was over a version's rows: rows with a confidence, their mean, and the
    rows in the ``review`` view: under the threshold in force (``review_below``: the spec's, or the
    one its review budget became), not yet reviewed."""

    rows: int
    mean: float
    review_below: float
    review_rows: int
    #: The cut as a share of rows (least sure first; None: ``review_below`` is a threshold), in words,
    #: and what was used instead of a plan, if anything.
    review_share: float | None = None
    review_cut: str = ""
    review_note: str = ""


@dataclass(frozen=True)
class Headline:
    """The analytics' headline numbers of a version: rows, error rows, the model's own accuracy
    against the gold column over the ``accuracy_rows`` rows that have a gold value (None without
    one; an error row there counts as wrong), the accuracy after review on those same rows (the
    reviewers' labels over the model's; ``reviewed_gold_rows`` of them reviewed), rows per label,
    cost per 1,000 rows, the confidence summary and, where rows have a truth, the reliability table
    (a row per non-empty confidence bucket, accuracy over its rows with a truth)."""

    rows: int = 0
    labeled: int = 0
    errors: int = 0
    accuracy: float | None = None
    accuracy_rows: int | None = None
    accuracy_after_review: float | None = None
    reviewed_gold_rows: int | None = None
    label_distribution: dict[str, int] | None = None
    cost_per_1k_rows_usd: float | None = None
    confidence: Confidence | None = None
    reliability: list[dict[str, Any]] | None = None

    def numbers(self) -> dict[str, Any]:
        """The plain numbers that are known (``analytics``' metadata)."""
        out = {"rows": self.rows, "labeled": self.labeled, "errors": self.errors, "accuracy": self.accuracy,
               "accuracy_rows": self.accuracy_rows, "accuracy_after_review": self.accuracy_after_review,
               "reviewed_gold_rows": self.reviewed_gold_rows, "cost_per_1k_rows_usd": self.cost_per_1k_rows_usd}
        return {k: v for k, v in out.items() if v is not None}


#: RunSummary keys printed only when known.
_ONLY_KNOWN = ("accuracy_rows", "accuracy_after_review", "review_rows", "review_threshold", "review_share",
               "review_note", "calibration", "timings_s")


@dataclass(frozen=True, kw_only=True)
class RunSummary:
    """The last stdout line of ``sparkbatch run``: totals of the whole version, plus what this
    run did (``partitions_run``; ``generated``: prompts sent to the engine; ``reused``: rows
    answered from the result store). See :func:`~sparkbatch_dagster.cli.commands.summary`."""

    job: str
    partitions_total: int
    partitions_done: int
    partitions_run: int
    rows: int
    labeled: int
    errors: int
    input_tokens: int
    output_tokens: int
    wall_s: float
    tokens_per_hour: int
    cost_usd: float
    generation_cost_usd: float
    engine_start_s: float
    engine_start_cost_usd: float
    #: The model's own accuracy over the ``accuracy_rows`` rows with a gold value, and after review.
    accuracy: float | None
    accuracy_rows: int | None = None
    accuracy_after_review: float | None = None
    generated: int
    reused: int
    prediction: Prediction | None = None
    attempts: int
    attempts_cost_usd: float
    wasted_usd: float
    engine_starts: int
    version: str
    home: str
    success: bool
    #: Rows waiting for a person (the ``review`` view) and the threshold in force; None without confidences.
    review_rows: int | None = None
    review_threshold: float | None = None
    #: The cut as a share of rows (least sure first) when a review budget sets one; what stood in.
    review_share: float | None = None
    review_note: str | None = None
    #: Each model's stored calibration: method, gold rows, ECE and Brier before and after (held out).
    calibration: dict[str, dict[str, Any]] | None = None
    timings_s: dict[str, float] | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON line, key for key: ``predicted_wall_s`` and ``prediction_error_pct`` only
        where an estimate was made, the review's keys only where answers have confidences (and
        ``calibration`` where one is stored), ``timings_s`` only where the command timed its phases."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "prediction":
                if value is not None:
                    out.update(predicted_wall_s=value.predicted_wall_s, prediction_error_pct=value.error_pct)
            elif value is not None or f.name not in _ONLY_KNOWN:
                out[f.name] = dict(value) if isinstance(value, dict) else value
        return out


@dataclass(frozen=True)
class Status:
    """What ``sparkbatch status`` prints: whether the input is sharded, partitions done of the
    total, the missing ones, the command to run next, the ``gpu`` pool's limit (None: none set)
    and warnings."""

    sharded: bool
    partitions_total: int
    partitions_done: int
    missing: list[str]
    next: str
    pool_limit: int | None
    warnings: list[str]

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
