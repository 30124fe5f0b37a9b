"""What a labeling run reports: a progress report while it runs, each shard's statistics when
it commits (the numbers behind ``run_metrics``, the partition's materialization and the bill)."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timezone
from typing import Any

from ..spec import JobSpec
from .reliability import histogram


def progress_report(key: str, done: int, total: int, tokens: int, seconds: float, measured: int,
              expected_rows_per_s: float | None = None, window_s: float = 10.0) -> dict[str, Any]:
    """A progress report. The ETA uses the rate this run measured once it has ``window_s`` of
    answers behind it; before that the estimate's rate when there is one, else no ETA at all."""
    rate = measured / seconds if seconds >= window_s and measured > 0 else expected_rows_per_s
    eta = 0.0 if done >= total else round((total - done) / rate, 1) if rate else None
    return {"partition": key, "rows_done": done, "rows_total": total,
            "tokens_per_s": round(tokens / seconds, 1) if seconds > 0 else 0.0, "eta_s": eta}


def shard_stats(spec: JobSpec, key: str, version: str, model: str, table: Any, wall_s: float, engine_s: float,
           resumed: int, generated: int, fresh_tokens: int, engine_start_s: float = 0.0) -> dict[str, Any]:
    """One shard's statistics. ``engine_start_s``: the engine start charged to this shard (a run
    charges its start, once, to the first shard it finalizes after the engine started; that
    shard's ``wall_s`` as measured holds it). The stats keep the start apart: ``wall_s`` and
    ``tokens_per_hour`` are generation alone, ``generation_cost_usd`` its price, ``cost_usd``
    the whole bill (generation + engine start) at ``spec.hourly_rate_usd``."""
    cols = table.select(["error", "prompt_tokens", "output_tokens", "cached_tokens", "deduplicated"]).to_pydict()
    errs = [e for e in cols["error"] if e]
    prompt_t, output_t, cached_t = (sum(cols[c]) for c in ("prompt_tokens", "output_tokens", "cached_tokens"))
    start = max(engine_start_s, 0.0)
    generation_s = max(wall_s - start, 0.0)
    return {
        "partition": key, "version": version, "model": model, "rows": table.num_rows,
        "labeled": table.num_rows - len(errs), "errors": len(errs),
        "error_reasons": dict(Counter(e.split(":", 1)[0] for e in errs)),
        "input_tokens": prompt_t, "output_tokens": output_t,
        "wall_s": round(generation_s, 3), "engine_s": round(engine_s, 3), "engine_start_s": round(start, 3),
        # Throughput counts only what this attempt generated: resumed rows cost nothing now.
        "tokens_per_hour": round(fresh_tokens / generation_s * 3600) if generation_s > 0 else 0,
        "generation_cost_usd": round(generation_s / 3600 * spec.hourly_rate_usd, 6),
        "cost_usd": round((generation_s + start) / 3600 * spec.hourly_rate_usd, 6),
        "prefix_cache_hit_rate": round(cached_t / prompt_t, 4) if prompt_t else None,
        "resumed_rows": resumed, "generated_requests": generated,
        "reused_rows": sum(1 for r in table.column("reused").to_pylist() if r),
        "deduplicated_rows": sum(1 for d in cols["deduplicated"] if d),
        # Answers cut at max_tokens: texts kept and marked, labels and JSON as ``truncated`` error rows.
        "truncated_rows": sum(1 for t in table.column("truncated").to_pylist() if t)
        if "truncated" in table.column_names else 0,
        # A reasoning model's thinking (output_tokens counts it too): null in files older than the column.
        "reasoning_tokens": sum(t or 0 for t in table.column("reasoning_tokens").to_pylist())
        if "reasoning_tokens" in table.column_names else 0,
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **_confidence(table),
    }


def _confidence(table: Any) -> dict[str, Any]:
    """The shard's answers per confidence bucket (ten counts, :mod:`.reliability`) and their mean
    confidence (None where none had one: free text, error rows)."""
    sure = [c for c in (table.column("confidence").to_pylist() if "confidence" in table.column_names else [])
            if c is not None and c == c]  # c == c: not NaN
    return {"confidence_histogram": histogram(sure),
            "confidence_mean": round(sum(sure) / len(sure), 4) if sure else None}
