"""Label one shard: check rows, render prompts, dedupe and order them, stream them through an
engine, checkpoint finished rows, finalize. Knows nothing of Dagster.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import Any

import pyarrow.parquet as pq

from .checkpoint import CheckpointWriter, finalize
from .engines.base import Engine, EngineRequest, EngineResult
from .errors import ConfigError
from .prompts import RenderedPrompt, check_text, render
from .spec import JobSpec
from .store import JobHome, atomic_write_text

ProgressFn = Callable[[dict[str, Any]], None]


def parse_output(text: str, spec: JobSpec) -> tuple[str | None, str | None]:
    """(output, error) for one generated text, checked against the declared output kind."""
    kind = spec.output.kind
    if kind == "label":
        label = text.strip()
        if label in spec.output.labels:
            return label, None
        return None, f"bad_output: {label[:80]!r} is not one of the declared labels"
    if kind == "json":
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            return None, f"bad_output: not valid JSON ({exc.msg} at char {exc.pos})"
        if not isinstance(value, dict):
            return None, f"bad_output: expected a JSON object, got {type(value).__name__}"
        return json.dumps(value, sort_keys=True), None
    return text, None


def _row(row_id: str, fp: str, model: str, output: str | None = None, error: str | None = None,
         res: EngineResult | None = None, dedup: bool = False) -> dict[str, Any]:
    fresh = res is not None and not dedup
    return {
        "row_id": row_id, "output": output, "error": error,
        "prompt_tokens": res.prompt_tokens if fresh and res else 0,
        "output_tokens": res.output_tokens if fresh and res else 0,
        "cached_tokens": res.cached_tokens if fresh and res else 0,
        "deduplicated": dedup, "fingerprint": fp, "model": model,
    }


def plan_rows(spec: JobSpec, rows: list[dict[str, Any]], skip: set[str]
              ) -> tuple[dict[str, str], dict[str, tuple[RenderedPrompt, list[str]]]]:
    """Split pending rows into error rows {id: reason} and unique prompts {key: (prompt, ids)}."""
    errors: dict[str, str] = {}
    groups: dict[str, tuple[RenderedPrompt, list[str]]] = {}
    for row in rows:
        rid = row["row_id"]
        if rid in skip:
            continue
        reason = row.get("_input_error") or next(
            (r for c in spec.text_columns if (r := check_text(row[c], c, spec.max_input_chars))), None
        )
        if reason:
            errors[rid] = reason
            continue
        try:
            prompt = render(spec.system_prompt, spec.user_template, {c: row[c] for c in spec.text_columns})
        except ConfigError as exc:
            errors[rid] = f"render_error: {exc}"
            continue
        groups.setdefault(prompt.key, (prompt, []))[1].append(rid)
    return errors, groups


def label_shard(spec: JobSpec, home: JobHome, version: str, key: str, engine: Engine,
                progress: ProgressFn | None = None, progress_every_s: float = 10.0) -> dict[str, Any]:
    """Label every row of one shard and finalize it; return the shard's statistics."""
    started = time.perf_counter()
    rows = pq.read_table(home.shard_path(key)).to_pylist()
    writer = CheckpointWriter(home.parts_dir(version, key), spec.checkpoint_rows, spec.checkpoint_seconds)
    done = set(writer.existing().column("row_id").to_pylist())
    errors, groups = plan_rows(spec, rows, done)
    for rid, reason in errors.items():
        writer.add(_row(rid, version, engine.model_id, error=reason))

    # Sorted prompt keys put rows that share a prefix next to each other (prefix-cache hits).
    order = sorted(groups)
    requests: Iterator[EngineRequest] = (EngineRequest(str(i), groups[k][0].messages()) for i, k in enumerate(order))
    gen_started = time.perf_counter()
    finished = 0
    fresh_tokens = 0
    last_report = gen_started
    for res in engine.generate(requests, spec.sampling, spec.output):
        ids = groups[order[int(res.id)]][1]
        output, error = parse_output(res.text, spec) if res.error is None and res.text is not None else (None, res.error)
        for n, rid in enumerate(ids):
            writer.add(_row(rid, version, engine.model_id, output, error, res, dedup=n > 0))
        finished += len(ids)
        fresh_tokens += res.prompt_tokens + res.output_tokens
        if writer.due():
            writer.flush()
        now = time.perf_counter()
        if progress and now - last_report >= progress_every_s:
            last_report = now
            progress(_progress(key, finished, sum(len(g[1]) for g in groups.values()), fresh_tokens, now - gen_started))
    engine_s = time.perf_counter() - gen_started
    writer.flush()
    table = finalize(writer.parts_dir, [r["row_id"] for r in rows], home.labeled_path(version, key))
    stats = _stats(spec, key, version, engine.model_id, table, time.perf_counter() - started, engine_s,
                   resumed=len(done), generated=len(groups), fresh_tokens=fresh_tokens)
    atomic_write_text(home.stats_path(version, key), json.dumps(stats, indent=2))
    return stats


def _progress(key: str, done: int, total: int, tokens: int, seconds: float) -> dict[str, Any]:
    rate = done / seconds if seconds > 0 else 0.0
    return {"partition": key, "rows_done": done, "rows_total": total,
            "tokens_per_s": round(tokens / seconds, 1) if seconds > 0 else 0.0,
            "eta_s": round((total - done) / rate, 1) if rate > 0 else None}


def _stats(spec: JobSpec, key: str, version: str, model: str, table: Any, wall_s: float, engine_s: float,
           resumed: int, generated: int, fresh_tokens: int) -> dict[str, Any]:
    cols = table.select(["error", "prompt_tokens", "output_tokens", "cached_tokens", "deduplicated"]).to_pydict()
    errs = [e for e in cols["error"] if e]
    prompt_t, output_t, cached_t = (sum(cols[c]) for c in ("prompt_tokens", "output_tokens", "cached_tokens"))
    return {
        "partition": key, "version": version, "model": model, "rows": table.num_rows,
        "labeled": table.num_rows - len(errs), "errors": len(errs),
        "error_reasons": dict(Counter(e.split(":", 1)[0] for e in errs)),
        "input_tokens": prompt_t, "output_tokens": output_t,
        "wall_s": round(wall_s, 3), "engine_s": round(engine_s, 3),
        # Throughput counts only what this attempt generated: resumed rows cost nothing now.
        "tokens_per_hour": round(fresh_tokens / wall_s * 3600) if wall_s > 0 else 0,
        "cost_usd": round(wall_s / 3600 * spec.hourly_rate_usd, 6),
        "prefix_cache_hit_rate": round(cached_t / prompt_t, 4) if prompt_t else None,
        "resumed_rows": resumed, "generated_requests": generated,
        "deduplicated_rows": sum(1 for d in cols["deduplicated"] if d),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
