"""Dagster events for one partition, emitted the moment its shard commits.

Dagster's single-run backfills record every partition's materialization at the end of the run
(dagster-io/dagster#21072), so a 10-hour backfill would show nothing for 10 hours and each
partition would carry the run's totals. ``labeled_outputs`` instead yields, per committed
shard, a materialization with that partition's own numbers and its two checks, so the
partition bar fills shard by shard and a crash leaves the UI agreeing with the disk.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow.parquet as pq
from dagster import (
    AssetCheckEvaluation,
    AssetCheckSeverity,
    AssetKey,
    AssetMaterialization,
    MetadataValue,
)

from ..errors import SparkbatchError
from ..home import JobHome
from ..run.calibration_map import Calibration
from ..run.records import ShardStats
from ..run.reliability import bucket_name, describe
from ..run.shard_stats import read_stats
from ..run.totals import Confidence
from ..spec import JobSpec
from .metadata import md_table

EXACTLY_ONCE = "every_row_exactly_once"
ERROR_RATE = "error_rate"
#: What a partition's materialization carries; sums over materializations give the real bill.
NUMBERS = ("rows", "labeled", "errors", "input_tokens", "output_tokens", "wall_s", "tokens_per_hour",
           "engine_start_s", "cost_usd", "generated_requests", "reused_rows", "truncated_rows", "reasoning_tokens")


def numbers(stats: ShardStats) -> dict[str, Any]:
    """The partition's numbers a materialization carries (:data:`NUMBERS`; 0 where stats of an
    older release did not count one)."""
    values = stats.to_json()
    return {k: 0 if values.get(k) is None else values[k] for k in NUMBERS}


def materialization(key: AssetKey, stats: ShardStats, *, this_run: bool, tags: dict[str, str],
                    home: JobHome, calibrations: Sequence[Calibration] = ()) -> AssetMaterialization:
    """The partition's own numbers. ``this_run=False``: it was already done under this version,
    so this run generated nothing and spent nothing on it (cost 0, every row reused).
    ``calibrations``: the maps its rows' confidences were calibrated with, with their scores."""
    shown = numbers(stats)
    if not this_run:
        shown.update(wall_s=0.0, tokens_per_hour=0, engine_start_s=0.0, cost_usd=0.0, generated_requests=0,
                     reused_rows=stats.rows)
    return AssetMaterialization(
        asset_key=key, partition=stats.partition, tags=tags,
        metadata={**shown, "error_rate": round(stats.error_rate, 4),
                  "computed_in_this_run": this_run, "model": stats.model, "version": stats.version,
                  **histogram_metadata(stats), **calibration_metadata(calibrations),
                  "path": MetadataValue.path(str(home.labeled_path(stats.version, stats.partition)))},
    )


def calibration_metadata(calibrations: Sequence[Calibration]) -> dict[str, Any]:
    """The calibrations in force, each with its ECE and Brier before and after (held out, on the
    gold rows it was fitted on); nothing before one is fitted (``confidence`` is the model's own)."""
    rows = [{"model": c.model, "method": c.method, "gold rows": c.rows, "ECE before -> after":
             f"{c.ece_before} -> {c.ece_after}", "Brier before -> after": f"{c.brier_before} -> {c.brier_after}"}
            for c in calibrations]
    return {"calibration": MetadataValue.md(md_table(rows, list(rows[0])))} if rows else {}


def histogram_metadata(stats: ShardStats) -> dict[str, Any]:
    """The partition's answers per confidence bucket (``{"0.0-0.1": n, ..., "0.9-1.0": n}``) and
    their mean confidence; nothing for stats written before confidences were counted, and no
    mean where no answer had one (free text)."""
    counts = stats.confidence_histogram
    if counts is None:
        return {}
    out: dict[str, Any] = {"confidence_histogram": MetadataValue.json(
        {bucket_name(i): n for i, n in enumerate(counts)})}
    if stats.confidence_mean is not None:
        out["confidence_mean"] = stats.confidence_mean
    return out


def confidence_metadata(summary: Confidence | None, table: list[dict[str, Any]] | None) -> dict[str, Any]:
    """``analytics``' confidence entries: the mean, the rows to review (under ``review_below``),
    and with a gold column the accuracy per confidence bucket, as a table and in words."""
    out: dict[str, Any] = {}
    if summary is not None:
        out.update(confidence_mean=summary.mean, review_rows=summary.review_rows, review_below=summary.review_below)
        if summary.review_share is not None:  # a rank cut: the share is the number; review_below is unused
            out.update(review_share=summary.review_share, review_cut=summary.review_cut)
            out.pop("review_below")
        if summary.review_note:
            out["review_note"] = MetadataValue.text(summary.review_note)
    if table:
        cols = ["bucket", "rows", "truth_rows", "correct", "accuracy", "mean_confidence"]
        head = ("| confidence | rows | rows with a truth | correct | accuracy (of rows with a truth) | mean confidence "
                "|\n|---|---|---|---|---|---|\n")
        out["reliability"] = MetadataValue.md(head + "\n".join(
            "| " + " | ".join(str(b.get(c, b["rows"])) for c in cols) + " |" for b in table))
        out["reliability_summary"] = MetadataValue.text("\n".join(describe(table)))
    return out


def exactly_once(home: JobHome, version: str, partition: str,
                 stats: ShardStats | None = None) -> tuple[bool, dict[str, Any]]:
    """Read back from disk: does the labeled file hold every input row of the shard once, and nothing else?

    Against the shard file, when it is still the one the partition was labeled from (``stats``
    say which input it read). After a re-shard the shard file is another input's: the labeled
    file is then checked against the rows its commit counted (every id once; the commit itself
    checked them against the input it read)."""
    got = pq.read_table(home.labeled_path(version, partition), columns=["row_id"]).column("row_id").to_pylist()
    planned = stats.input_signature if stats is not None else None
    if stats is not None and planned and planned != (home.read_manifest() or {}).get("signature"):
        duplicated = len(got) - len(set(got))
        return not duplicated and len(got) == stats.rows, {
            "input_rows": stats.rows, "output_rows": len(got), "duplicated": duplicated,
            "version": version, "note": "the input was sharded again since: checked against the rows committed"}
    want = pq.read_table(home.shard_path(partition), columns=["row_id"]).column("row_id").to_pylist()
    missing, extra = set(want) - set(got), set(got) - set(want)
    duplicated = len(got) - len(set(got))
    passed = not missing and not extra and not duplicated
    return passed, {"input_rows": len(want), "output_rows": len(got), "missing": len(missing),
                    "unexpected": len(extra), "duplicated": duplicated, "version": version,
                    **({"first_missing": sorted(missing)[:5]} if missing else {})}


def checks(key: AssetKey, spec: JobSpec, home: JobHome, stats: ShardStats) -> list[AssetCheckEvaluation]:
    """The partition's two checks: every row exactly once (blocking: ``analytics`` is not built
    on a partition that fails it) and the error rate (a warning above ``spec.max_error_rate``)."""
    partition, version = stats.partition, stats.version
    passed, counts = exactly_once(home, version, partition, stats)
    rate = stats.error_rate
    return [
        AssetCheckEvaluation(asset_key=key, check_name=EXACTLY_ONCE, passed=passed, partition=partition,
                             metadata=counts, severity=AssetCheckSeverity.ERROR, blocking=True),
        AssetCheckEvaluation(asset_key=key, check_name=ERROR_RATE, passed=rate <= spec.max_error_rate,
                             partition=partition, severity=AssetCheckSeverity.WARN, blocking=False,
                             metadata={"error_rate": round(rate, 4), "max_error_rate": spec.max_error_rate,
                                       "error_reasons": MetadataValue.json(stats.error_reasons)}),
    ]


def blocked(instance: Any, key: AssetKey, home: JobHome, version: str, partitions: list[str]) -> list[str]:
    """Partitions that fail the blocking exactly-once check of ``version``: as last recorded in
    the instance (a check of another version's files says nothing of these), or, for a
    partition with no recorded evaluation (committed by an older release), on disk now."""
    from dagster import AssetCheckKey
    from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

    records = instance.event_log_storage.get_asset_check_execution_history(
        AssetCheckKey(key, EXACTLY_ONCE), limit=max(100, 4 * len(partitions)))
    latest: dict[str, Any] = {}
    for rec in records:  # newest first
        data = rec.event.dagster_event.event_specific_data if rec.event and rec.event.dagster_event else None
        part = getattr(data, "partition", None)
        checked = (getattr(data, "metadata", None) or {}).get("version")
        checked = getattr(checked, "value", checked)
        if part is not None and part not in latest and checked in (None, version):
            latest[part] = rec.status
    failed = AssetCheckExecutionRecordStatus.FAILED
    return [p for p in partitions if latest.get(p) == failed
            or (p not in latest and not exactly_once(home, version, p, _stats(home, version, p))[0])]


def _stats(home: JobHome, version: str, partition: str) -> ShardStats | None:
    try:
        return read_stats(home.stats_path(version, partition))
    except (OSError, SparkbatchError):
        return None


def adopt(instance: Any, key: AssetKey, home: JobHome, keys: list[str]) -> list[str]:
    """A bucket home seen by a Dagster instance that never ran it (a new box, a new DAGSTER_HOME):
    record each partition the bucket has committed under the current version as materialized
    (a runless event, cost 0 here), so the UI's partitions show what the bucket holds. Returns
    the partitions recorded; nothing for a folder home, whose instance saw its runs."""
    current = home.read_current() if home.remote is not None else None
    if current is None:
        return []
    version = current.version
    have = set(instance.get_materialized_partitions(key))
    adopted = [k for k in keys if k not in have and home.is_done(version, k)]
    for k in adopted:
        stats = read_stats(home.stats_path(version, k))
        instance.report_runless_asset_event(materialization(
            key, stats, this_run=False, home=home, tags={"sparkbatch/adopted": "from-bucket"}))
    return adopted
