"""Know the bill before paying it: time a sample of the job's own rows on the real engine and
extrapolate wall time, tokens per hour and cost for each way of renting the box. Knows
nothing of Dagster (the ``estimate`` asset and ``sparkbatch estimate`` drive it).

    draw_sample -> time_sample (one engine per model) -> predict -> report (JSON + chart)

The sample is spread evenly over input-length bands (long rows cost more), and warm-up rows
(other rows, untimed) go first so the shared template is in the prefix cache, as it is for
all but the first rows of a real run. The engine's start is measured and priced apart.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .engines.base import Engine, EngineRequest
from .errors import SparkbatchError
from .runner import parse_output, plan_rows
from .spec import EstimateSpec, JobSpec, NodeOption
from .store import JobHome, atomic_write_text

#: Weights may fill this share of a node's memory; the rest is left to the KV cache.
WEIGHTS_SHARE = 0.8


@dataclass
class Sample:
    """Rows to time, rows to warm up with, and what the whole input looks like."""

    rows: list[dict[str, Any]]
    warmup: list[dict[str, Any]]
    total_rows: int
    distinct_prompts: int  # per shard, as the run deduplicates: the requests a full run makes


@dataclass
class Timing:
    """One model's run of the sample."""

    model: str
    engine_start_s: float
    seconds: float
    rows: int
    prompt_tokens: int
    output_tokens: int
    errors: int
    correct: int | None  # None without a gold column


def draw_sample(spec: JobSpec, home: JobHome, est: EstimateSpec) -> Sample:
    """Pick ``est.sample_rows`` rows spread over ``est.strata`` input-length bands, plus warm-up rows."""
    from .shards import connect, quote_ident

    files = sorted(str(p) for p in home.shards_dir.glob("shard-*.parquet"))
    if not files:
        raise SparkbatchError(f"{home.shards_dir} has no shards: materialize input_shards first")
    con = connect()
    con.execute("SET VARIABLE sb_files = ?", [files])
    cols = [quote_ident(c) for c in spec.text_columns]
    length = " + ".join(f"coalesce(length(CAST({c} AS VARCHAR)), 0)" for c in cols)
    con.execute(f"CREATE TEMP VIEW src AS SELECT *, {length} AS _sb_len "
                "FROM read_parquet(getvariable('sb_files'), filename='_sb_file')")
    total, distinct = con.execute(
        f"SELECT sum(n), sum(u) FROM (SELECT count(*) AS n, count(DISTINCT ({', '.join(cols)},)) AS u "
        "FROM src GROUP BY _sb_file)"
    ).fetchone() or (0, 0)
    total = int(total or 0)
    k = max(1, min(est.strata, total))
    base, extra = divmod(min(est.sample_rows, total), k)
    warm_per_band = -(-est.warmup_rows // k)
    # ntile() makes equal-sized bands, so equal quotas are a proportional (self-weighting) sample.
    # The sorts see only ids and lengths, and only the chosen rows leave DuckDB: a 10M-row input
    # is never loaded into Python.
    cur = con.execute(
        f"""WITH banded AS (
                SELECT row_id, ntile({k}) OVER (ORDER BY _sb_len, row_id) AS _sb_band, md5(row_id || ?) AS _sb_h
                FROM src),
            ranked AS (
                SELECT row_id, _sb_band, row_number() OVER (PARTITION BY _sb_band ORDER BY _sb_h) AS _sb_rank,
                       ? + (CASE WHEN _sb_band <= ? THEN 1 ELSE 0 END) AS _sb_quota
                FROM banded)
            SELECT s.* EXCLUDE (_sb_file, _sb_len), c._sb_rank <= c._sb_quota AS _sb_timed
            FROM ranked c JOIN src s USING (row_id)
            WHERE c._sb_rank <= c._sb_quota + ?
            ORDER BY c._sb_band, c._sb_rank""",
        [str(est.seed), base, extra, warm_per_band],
    )
    names = [d[0] for d in cur.description or []]
    rows: list[dict[str, Any]] = []
    rest: list[dict[str, Any]] = []
    for values in cur.fetchall():
        r = dict(zip(names, values, strict=True))
        (rows if r.pop("_sb_timed") else rest).append(r)
    rest.sort(key=lambda r: r["row_id"])
    return Sample(rows, rest[: est.warmup_rows], total, int(distinct or 0))


def _run(engine: Engine, spec: JobSpec, rows: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, str], Any]:
    errors, groups = plan_rows(spec, rows, set())
    requests = [EngineRequest(key, prompt.messages()) for key, (prompt, _) in groups.items()]
    results = {r.id: r for r in engine.generate(requests, spec.sampling, spec.output)}
    return results, errors, groups


def time_sample(spec: JobSpec, sample: Sample, engine: Engine) -> Timing:
    """Warm up on other rows, then time the sample through ``engine`` with the job's settings."""
    if sample.warmup:
        _run(engine, spec, sample.warmup)
    started = time.perf_counter()
    results, errors, groups = _run(engine, spec, sample.rows)
    seconds = time.perf_counter() - started
    outputs: dict[str, str | None] = {}
    for key, (_, ids) in groups.items():
        res = results[key]
        out = parse_output(res.text, spec)[0] if res.error is None and res.text is not None else None
        outputs.update(dict.fromkeys(ids, out))
    correct = None
    if spec.gold_column:
        correct = sum(1 for r in sample.rows if outputs.get(r["row_id"]) is not None
                      and outputs[r["row_id"]] == r.get(spec.gold_column))
    return Timing(
        model=engine.model_id, engine_start_s=engine.start_seconds, seconds=seconds, rows=len(sample.rows),
        prompt_tokens=sum(r.prompt_tokens for r in results.values()),
        output_tokens=sum(r.output_tokens for r in results.values()),
        errors=len(errors) + sum(1 for v in outputs.values() if v is None), correct=correct,
    )


def nodes_needed(weights_gb: float | None, memory_gb: float) -> int:
    """Tensor-parallel size (a power of two) whose nodes hold the weights with KV-cache room."""
    if weights_gb is None:
        return 1
    tp = 1
    while weights_gb > tp * memory_gb * WEIGHTS_SHARE:
        tp *= 2
    return tp


def predict(sample: Sample, timing: Timing, options: list[NodeOption], weights_gb: float | None) -> dict[str, Any]:
    """Extrapolate one model's timed sample to the whole job, for every node option."""
    tokens = timing.prompt_tokens + timing.output_tokens
    tps = tokens / timing.seconds if timing.seconds > 0 else 0.0
    # Error rows (0 tokens) stay in the per-row mean; duplicates in a shard are generated once.
    predicted_tokens = tokens / max(timing.rows, 1) * sample.distinct_prompts
    wall = predicted_tokens / tps if tps else 0.0
    accuracy = ci = None
    if timing.correct is not None and timing.rows:
        accuracy = timing.correct / timing.rows
        ci = 1.96 * math.sqrt(accuracy * (1 - accuracy) / timing.rows)
    priced = []
    for opt in options:
        tp = nodes_needed(weights_gb, opt.memory_gb)
        fits = tp <= opt.nodes
        # Nodes beyond what the weights need each run an engine on their own share of partitions.
        opt_wall = wall / (opt.nodes // tp) if fits else None
        priced.append({
            "name": opt.name, "nodes": opt.nodes, "hourly_usd": opt.hourly_usd, "tensor_parallel_size": tp,
            "fits": fits, "wall_s": round(opt_wall, 1) if opt_wall is not None else None,
            "cost_usd": round(opt.hourly_usd * (opt_wall + timing.engine_start_s) / 3600, 4)
            if opt_wall is not None else None,
        })
    return {
        "model": timing.model, "weights_gb": round(weights_gb, 3) if weights_gb is not None else None,
        "engine_start_s": round(timing.engine_start_s, 1), "sample_s": round(timing.seconds, 2),
        "sample_tokens": tokens, "sample_errors": timing.errors,
        "accuracy": round(accuracy, 4) if accuracy is not None else None,
        "accuracy_ci95": round(ci, 4) if ci is not None else None,
        "predicted_tokens": round(predicted_tokens), "predicted_wall_s": round(wall, 1),
        "predicted_tokens_per_hour": round(tps * 3600), "options": priced,
    }


def choose(models: list[dict[str, Any]], bar: float) -> dict[str, Any] | None:
    """The smallest model (by weights) whose sample accuracy clears ``bar``."""
    ok = [m for m in models if m["accuracy"] is not None and m["accuracy"] >= bar]
    return min(ok, key=lambda m: (m["weights_gb"] or math.inf, m["predicted_wall_s"])) if ok else None


def _hm(seconds: float) -> str:
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m{int(seconds % 60):02d}s"


def advise(primary: dict[str, Any], chosen: dict[str, Any] | None, est: EstimateSpec, sample_rows: int,
           batch: int, on_gpu: bool, has_gold: bool) -> list[str]:
    """Plain-language advice: which node option, which model, how much to trust the numbers."""
    out = []
    opts = primary["options"]
    size = f"{primary['weights_gb']} GB of weights" if primary["weights_gb"] is not None else "weight size unknown"
    one = next((o for o in opts if o["fits"] and o["tensor_parallel_size"] == 1 and o["nodes"] == 1), None)
    cheapest = min((o for o in opts if o["fits"]), key=lambda o: o["cost_usd"], default=None)
    if one is not None:
        out.append(f"{primary['model']} ({size}) fits one node: run it on "
                   f"'{one['name']}' ({_hm(one['wall_s'])}, ${one['cost_usd']}).")
        for o in opts:
            if o is not one and o["fits"] and o["cost_usd"] > one["cost_usd"]:
                more = (o["cost_usd"] / one["cost_usd"] - 1) * 100 if one["cost_usd"] else 0.0
                out.append(f"'{o['name']}' would finish in {_hm(o['wall_s'])} but cost ${o['cost_usd']} "
                           f"(+{more:.0f}%): this job is throughput-bound, so more nodes raise the cost "
                           "without raising tokens per dollar; rent them only to meet a deadline.")
    else:
        tp = max(o["tensor_parallel_size"] for o in opts)
        where = f"'{cheapest['name']}'" if cheapest else "no listed option"
        out.append(f"{primary['model']} ({size}) does not fit one node's memory: "
                   f"it needs tensor parallelism over {tp} nodes (VLLMResource(tensor_parallel_size={tp})); "
                   f"{where} can hold it. A smaller model avoids that.")
    if on_gpu and sample_rows < batch:
        out.append(f"The sample ({sample_rows} rows) is smaller than one batch ({batch} rows): the GPU was not "
                   "full, so the predicted time is an upper bound (on an H200, +38% at 80 rows, +2.5% at 1,024); "
                   "set estimate.fill_batch=True or raise estimate.sample_rows for a tighter one.")
    if not has_gold:
        out.append("No gold_column: accuracy cannot be measured, so no model is chosen by quality.")
    elif chosen is not None:
        switch = "" if chosen is primary else (
            f"; the job runs {primary['model']} now: set VLLMResource(model={chosen.get('configured_as')!r}) "
            "to switch")
        out.append(f"Smallest model that clears accuracy {est.accuracy_bar}: {chosen['model']} "
                   f"({chosen['accuracy']} +/- {chosen['accuracy_ci95']} on {sample_rows} rows){switch}.")
    else:
        out.append(f"No candidate reaches accuracy {est.accuracy_bar} on the sample: try larger models, "
                   "or a better prompt.")
    return out


def write_report(report: dict[str, Any], folder: Path) -> dict[str, Any]:
    """Write ``estimate.json`` and ``estimate.png`` into ``folder``; return the report with both paths."""
    from .chart import write_chart

    folder.mkdir(parents=True, exist_ok=True)
    report = {**report, "json": str(folder / "estimate.json"), "chart": str(folder / "estimate.png")}
    write_chart(report, Path(report["chart"]))
    atomic_write_text(Path(report["json"]), json.dumps(report, indent=2))
    return report
