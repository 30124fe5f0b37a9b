"""Label shards: check rows, render prompts, dedupe and order them, stream them through one
engine, checkpoint finished rows, finalize each shard. Knows nothing of Dagster.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import Any

import pyarrow.parquet as pq

from .checkpoint import CheckpointWriter, assemble, commit
from .engines.base import Engine, EngineRequest, EngineResult
from .errors import ConfigError, SparkbatchError
from .prompts import RenderedPrompt, check_text, render
from .spec import JobSpec
from .store import JobHome, atomic_write_text, failpoint

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
    # Tokens are counted once per generation: fanned-out duplicates carry zeros.
    fresh = None if dedup else res
    return {
        "row_id": row_id, "output": output, "error": error,
        "prompt_tokens": fresh.prompt_tokens if fresh else 0,
        "output_tokens": fresh.output_tokens if fresh else 0,
        "cached_tokens": fresh.cached_tokens if fresh else 0,
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


class _Shard:
    """One shard in flight: its writer, its unique prompts, and how many are still out."""

    def __init__(self, spec: JobSpec, home: JobHome, version: str, key: str, model: str) -> None:
        self.key, self.version, self.model = key, version, model
        self.started = time.perf_counter()
        self.rows = pq.read_table(home.shard_path(key)).to_pylist()
        self.writer = CheckpointWriter(home.parts_dir(version, key), spec.checkpoint_rows, spec.checkpoint_seconds)
        done = set(self.writer.existing().column("row_id").to_pylist())
        self.resumed = len(done)
        errors, self.groups = plan_rows(spec, self.rows, done)
        for rid, reason in errors.items():
            self.writer.add(_row(rid, version, model, error=reason))
        # Sorted prompt keys put rows that share a prefix next to each other (prefix-cache hits).
        self.order = sorted(self.groups)
        self.outstanding = len(self.order)
        self.fresh_tokens = 0
        self.first_sent: float | None = None

    def release(self) -> None:
        """Drop the rows once committed, so a run's memory does not grow with its shard count."""
        self.rows, self.groups, self.order = [], {}, []


class ShardRun:
    """Label several shards through one engine without draining it between shards.

    Requests of shard k+1 are queued behind those of shard k, so the engine keeps a full
    batch while shard k's last rows finish; each shard is finalized as soon as its own last
    row is in. ``on_done`` receives each shard's statistics as it finalizes.
    """

    def __init__(self, spec: JobSpec, home: JobHome, version: str, engine: Engine,
                 progress: ProgressFn | None = None, progress_every_s: float = 1.0) -> None:
        self.spec, self.home, self.version, self.engine = spec, home, version, engine
        self.progress, self.progress_every_s = progress, progress_every_s
        self.shards: list[_Shard] = []
        self.stats: list[dict[str, Any]] = []
        self._last_end = time.perf_counter()
        self._rows_done = 0  # rows with a result: generated, fanned out, error rows, resumed
        self._rows_free = 0  # of those, resumed and error rows: done at once, so not in the ETA's rate
        self._on_done: Callable[[dict[str, Any]], None] | None = None

    def run(self, keys: list[str], on_done: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
        """Label ``keys``; raise :class:`SparkbatchError` at once if another process holds one."""
        self._on_done = on_done
        locks = [self.home.partition_lock(self.version, k) for k in keys]
        try:
            for key, lock in zip(keys, locks, strict=True):
                if not lock.acquire(wait=False):
                    raise SparkbatchError(
                        f"partition {key} is being written by another run (pid {lock.holder()}): "
                        "wait for that run to finish, or run the other partitions"
                    )
            self._generate(keys)
        finally:
            # Whatever stopped us, finished rows still in memory go to disk first.
            for shard in self.shards:
                shard.writer.flush()
            for lock in locks:
                lock.release()
        return self.stats

    def _generate(self, keys: list[str]) -> None:
        total = sum(pq.read_metadata(self.home.shard_path(k)).num_rows for k in keys)
        started = last_report = time.perf_counter()
        for res in self.engine.generate(self._requests(keys), self.spec.sampling, self.spec.output):
            idx, _, n = res.id.partition(":")
            shard = self.shards[int(idx)]
            ids = shard.groups[shard.order[int(n)]][1]
            ok = res.error is None and res.text is not None
            output, error = parse_output(res.text or "", self.spec) if ok else (None, res.error)
            for i, rid in enumerate(ids):
                shard.writer.add(_row(rid, self.version, self.engine.model_id, output, error, res, dedup=i > 0))
            self._rows_done += len(ids)
            shard.fresh_tokens += res.prompt_tokens + res.output_tokens
            shard.outstanding -= 1
            if shard.writer.due():
                shard.writer.flush()
            if shard.outstanding == 0:
                self._finish(shard)
            now = time.perf_counter()
            if self.progress and now - last_report >= self.progress_every_s:
                last_report = now
                self._report(shard.key, total, now - started)
        if self.progress and self.shards:
            self._report(self.shards[-1].key, total, time.perf_counter() - started)

    def _report(self, key: str, total: int, seconds: float) -> None:
        assert self.progress is not None
        tokens = sum(s.fresh_tokens for s in self.shards)
        self.progress(_progress(key, self._rows_done, self._rows_free, total, tokens, seconds))

    def _requests(self, keys: list[str]) -> Iterator[EngineRequest]:
        for key in keys:
            shard = _Shard(self.spec, self.home, self.version, key, self.engine.model_id)
            idx = len(self.shards)
            self.shards.append(shard)
            free = len(shard.rows) - sum(len(ids) for _, ids in shard.groups.values())
            self._rows_done += free
            self._rows_free += free
            if shard.outstanding == 0:  # nothing to generate (all resumed or error rows)
                self._finish(shard)
            for n, prompt_key in enumerate(shard.order):
                shard.first_sent = shard.first_sent or time.perf_counter()
                yield EngineRequest(f"{idx}:{n}", shard.groups[prompt_key][0].messages())

    def _finish(self, shard: _Shard) -> None:
        shard.writer.flush()
        table = assemble(shard.writer.parts_dir, [r["row_id"] for r in shard.rows], shard.key)
        now = time.perf_counter()
        # Shards overlap in the engine; each is charged the time since the previous one
        # finished (or since it was prepared), so per-shard wall times add up to the run's.
        wall = now - max(self._last_end, shard.started)
        self._last_end = now
        engine_s = now - shard.first_sent if shard.first_sent else 0.0
        stats = _stats(self.spec, shard.key, self.version, self.engine.model_id, table, wall, engine_s,
                       resumed=shard.resumed, generated=len(shard.order), fresh_tokens=shard.fresh_tokens)
        # Stats first, then the labeled file (the commit point): a done shard always has stats.
        atomic_write_text(self.home.stats_path(self.version, shard.key), json.dumps(stats, indent=2))
        failpoint("finalize:stats")
        commit(shard.writer.parts_dir, table, self.home.labeled_path(self.version, shard.key))
        shard.release()
        self.stats.append(stats)
        if self._on_done:
            self._on_done(stats)


def label_shard(spec: JobSpec, home: JobHome, version: str, key: str, engine: Engine,
                progress: ProgressFn | None = None) -> dict[str, Any]:
    """Label every row of one shard and finalize it; return the shard's statistics."""
    return ShardRun(spec, home, version, engine, progress).run([key])[0]


def _progress(key: str, done: int, free: int, total: int, tokens: int, seconds: float) -> dict[str, Any]:
    rate = (done - free) / seconds if seconds > 0 else 0.0
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
