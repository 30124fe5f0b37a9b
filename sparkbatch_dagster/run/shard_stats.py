"""What a labeling run reports: a progress report while it runs, each shard's statistics when
it commits (the numbers behind ``run_metrics``, the partition's materialization and the bill)::

    stats = shard_stats(spec, ShardWork(key, version, model, resumed=0, generated=40, fresh_tokens=9000),
                        ShardTime(wall_s=12.5, engine_s=11.0), table)
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import msgspec

from ..errors import SparkbatchError
from ..spec import JobSpec
from .records import ProgressReport, ShardStats
from .reliability import histogram


def progress_report(key: str, done: int, total: int, tokens: int, seconds: float, measured: int,
                    expected_rows_per_s: float | None = None, window_s: float = 10.0) -> ProgressReport:
    """A progress report. The ETA uses the rate this run measured once it has ``window_s`` of
    answers behind it; before that the estimate's rate when there is one, else no ETA at all."""
    rate = measured / seconds if seconds >= window_s and measured > 0 else expected_rows_per_s
    eta = 0.0 if done >= total else round((total - done) / rate, 1) if rate else None
    return ProgressReport(partition=key, rows_done=done, rows_total=total,
                          tokens_per_s=round(tokens / seconds, 1) if seconds > 0 else 0.0, eta_s=eta)


@dataclass(frozen=True)
class ShardWork:
    """What a run did of one shard: whose (version, model), rows resumed from earlier attempts,
    prompts sent to the engine and the tokens they cost in this attempt."""

    key: str
    version: str
    model: str
    resumed: int = 0
    generated: int = 0
    fresh_tokens: int = 0


@dataclass(frozen=True)
class ShardTime:
    """A shard's share of the run's time (:class:`~.finish.ShardClock`): ``wall_s`` as measured,
    ``engine_s`` from its first prompt sent, ``engine_start_s`` the engine start charged to it (a
    run charges its start, once, to the first shard it finalizes after the engine started; that
    shard's ``wall_s`` holds it)."""

    wall_s: float
    engine_s: float = 0.0
    engine_start_s: float = 0.0


def shard_stats(spec: JobSpec, work: ShardWork, time: ShardTime, table: Any) -> ShardStats:
    """One shard's statistics from its assembled output ``table``. The stats keep the engine start
    apart: ``wall_s`` and ``tokens_per_hour`` are generation alone, ``generation_cost_usd`` its
    price, ``cost_usd`` the whole bill (generation + engine start) at ``spec.hourly_rate_usd``."""
    cols = table.select(["error", "prompt_tokens", "output_tokens", "cached_tokens", "deduplicated"]).to_pydict()
    errs = [e for e in cols["error"] if e]
    prompt_t, output_t, cached_t = (sum(cols[c]) for c in ("prompt_tokens", "output_tokens", "cached_tokens"))
    start = max(time.engine_start_s, 0.0)
    generation_s = max(time.wall_s - start, 0.0)
    sure = _confidences(table)
    return ShardStats(
        partition=work.key, version=work.version, model=work.model, rows=table.num_rows,
        labeled=table.num_rows - len(errs), errors=len(errs),
        error_reasons=dict(Counter(e.split(":", 1)[0] for e in errs)),
        input_tokens=prompt_t, output_tokens=output_t,
        wall_s=round(generation_s, 3), engine_s=round(time.engine_s, 3), engine_start_s=round(start, 3),
        # Throughput counts only what this attempt generated: resumed rows cost nothing now.
        tokens_per_hour=round(work.fresh_tokens / generation_s * 3600) if generation_s > 0 else 0,
        generation_cost_usd=round(generation_s / 3600 * spec.hourly_rate_usd, 6),
        cost_usd=round((generation_s + start) / 3600 * spec.hourly_rate_usd, 6),
        prefix_cache_hit_rate=round(cached_t / prompt_t, 4) if prompt_t else None,
        resumed_rows=work.resumed, generated_requests=work.generated,
        reused_rows=sum(1 for r in table.column("reused").to_pylist() if r),
        deduplicated_rows=sum(1 for d in cols["deduplicated"] if d),
        # Answers cut at max_tokens: texts kept and marked, labels and JSON as ``truncated`` error rows.
        truncated_rows=_count(table, "truncated"),
        # A reasoning model's thinking (output_tokens counts it too): null in files older than the column.
        reasoning_tokens=sum(t or 0 for t in table.column("reasoning_tokens").to_pylist())
        if "reasoning_tokens" in table.column_names else 0,
        finished_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        # The answers per confidence bucket (ten counts, :mod:`.reliability`) and their mean
        # confidence (None where none had one: free text, error rows).
        confidence_histogram=histogram(sure), confidence_mean=round(sum(sure) / len(sure), 4) if sure else None,
    )


def _count(table: Any, column: str) -> int:
    return sum(1 for t in table.column(column).to_pylist() if t) if column in table.column_names else 0


def _confidences(table: Any) -> list[float]:
    return [c for c in (table.column("confidence").to_pylist() if "confidence" in table.column_names else [])
            if c is not None and c == c]  # c == c: not NaN


def read_stats(path: Path) -> ShardStats:
    """A committed shard's stats file, written by this release or an older one (what it did not
    write yet reads as the default); one that is not stats is an error naming the file."""
    try:
        return ShardStats.from_json(msgspec.json.decode(path.read_text()))
    except msgspec.DecodeError as exc:  # a ValidationError too: it names the field
        raise SparkbatchError(f"{path} is not a shard's stats file ({exc}): run the partition again "
                              "(sparkbatch run) to write it anew") from exc
