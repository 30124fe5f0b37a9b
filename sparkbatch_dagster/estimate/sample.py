"""Know the bill before paying it: draw and time a sample of the job's own rows on the real engine and
extrapolate wall time, tokens per hour and cost for each way of renting the box; name the best
buy among the candidate models. Knows nothing of Dagster (the ``estimate`` asset and
``sparkbatch estimate`` drive it).

    draw_sample -> sample_model (one engine per model, open only while it samples)
                -> count_stored -> forecast.predict -> choice.choose -> choice.advise
                -> forecast.write_report (JSON + chart)

The sample is spread evenly over input-length bands (long rows cost more), and warm-up rows
(other rows, untimed) go first so the shared template is in the prefix cache, as it is for
all but the first rows of a real run. The engine's start is measured and priced with the job.

Accuracy against the gold column is a 95% Wilson score interval; a model clears the bar when
the interval's LOWER bound does. While a model's interval straddles the bar, more rows of the
same stratified draw are timed and scored on the same engine (the sample doubled, up to
``EstimateSpec.max_sample_rows``); their speed counts only when a draw is as large as the first,
since a smaller one runs a part-empty batch, slower per token than the run. The best buy is the
cheapest model that clears: predicted cost of the whole job (engine start + generation) on its
cheapest node option.

Prompts whose answer the result store already holds cost a run nothing: they are counted
(``stored_rows``) and left out of the prediction, which covers only the prompts still to
generate, exactly what the run's ``generated_requests`` count.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

from ..engines.base import Engine, request_of
from ..engines.platform.heap import frozen_heap
from ..errors import SparkbatchError
from ..home import JobHome
from ..run.result_store import ResultStore
from ..run.rows import parse_output, plan_rows, read_shard, store_key
from ..run.truth import truth
from ..spec import EstimateSpec, JobSpec
from .choice import verdict

#: Inputs up to this many rows have every prompt rendered and looked up in the result store;
#: larger ones extrapolate the stored share from the sample (rendering 10M prompts takes minutes).
EXACT_STORE_COUNT_ROWS = 1_000_000


@dataclass
class Sample:
    """Rows to time, rows to warm up with, and what the whole input looks like."""

    rows: list[dict[str, Any]]
    warmup: list[dict[str, Any]]
    total_rows: int
    distinct_prompts: int  # per shard, as the run deduplicates: the requests a full run makes


@dataclass
class Timing:
    """One model's run of the sample (and of the rows added while its interval straddled the bar)."""

    model: str
    engine_start_s: float
    seconds: float
    rows: int
    prompt_tokens: int
    output_tokens: int
    errors: int
    correct: int | None  # None without a gold column
    requests: int | None = None  # distinct prompts generated (None: one per row)
    #: (rows, correct, truth rows) after each draw
    steps: list[tuple[int, int, int]] = field(default_factory=list)
    #: Rows with a truth (``run/truth.py``: a gold value that says something), the accuracy's rows;
    #: None without a gold column. A row without one is neither right nor wrong.
    truth_rows: int | None = None
    #: Time = fill_s + s_per_token x tokens, fitted from two draws of different sizes (see
    #: :func:`fit`); 0 when the sample was one draw.
    fill_s: float = 0.0
    s_per_token: float = 0.0
    #: Each scored row's (confidence, right): None where its answer had none (an error row). Two
    #: models' rows in common make a cascade's accuracy on the sample (``estimate/cascades.py``).
    by_row: dict[str, tuple[float | None, bool]] = field(default_factory=dict)

    @property
    def scored(self) -> int:
        """The rows the accuracy is over: those with a truth (every row for a record without the count)."""
        return self.rows if self.truth_rows is None else self.truth_rows

    @property
    def sure(self) -> list[tuple[float, bool]]:
        """(confidence, right) of each scored row whose answer had a confidence: the reliability table."""
        return [(c, ok) for c, ok in self.by_row.values() if c is not None]


@dataclass
class Stored:
    """What the result store already holds for one model: rows a run takes from it for free."""

    rows: int  # input rows whose answer is stored
    prompts: int  # their distinct prompts (per shard, as the run counts them)
    to_generate: int  # prompts a run still sends to the engine: what the prediction covers
    exact: bool = True  # False: extrapolated from the sample (an input over EXACT_STORE_COUNT_ROWS)


def draw_sample(spec: JobSpec, home: JobHome, est: EstimateSpec) -> Sample:
    """Pick ``est.sample_rows`` rows spread over ``est.strata`` input-length bands, plus warm-up rows."""
    from ..inputs.shards import connect, quote_ident

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
    requests = [request_of(key, prompt, store_key(key)) for key, (prompt, _) in groups.items()]
    with frozen_heap():  # as the job's run generates (run/runner.py), so the sample times the same
        results = {r.id: r for r in engine.generate(requests, spec.sampling, spec.output)}
    return results, errors, groups


def time_rows(spec: JobSpec, rows: list[dict[str, Any]], engine: Engine) -> Timing:
    """Time ``rows`` through ``engine`` with the job's settings (no warm-up) and score them."""
    started = time.perf_counter()
    results, errors, groups = _run(engine, spec, rows)
    seconds = time.perf_counter() - started
    outputs: dict[str, str | None] = {}
    confidence: dict[str, float | None] = {}
    for key, (prompt, ids) in groups.items():
        res = results[key]
        own = getattr(prompt, "output", None)  # a batch file line's response_format
        out = parse_output(res.text, spec, own)[0] if res.error is None and res.text is not None else None
        outputs.update(dict.fromkeys(ids, out))
        confidence.update(dict.fromkeys(ids, res.confidence))
    correct = truth_rows = None
    right: dict[str, bool] = {}
    if spec.gold_column:
        known = {r["row_id"]: t for r in rows if (t := truth(r.get(spec.gold_column))) is not None}
        right = {i: outputs.get(i) is not None and outputs[i] == t for i, t in known.items()}
        correct, truth_rows = sum(right.values()), len(right)
    return Timing(
        model=engine.model_id, engine_start_s=engine.start_seconds, seconds=seconds, rows=len(rows),
        prompt_tokens=sum(r.prompt_tokens for r in results.values()),
        output_tokens=sum(r.output_tokens for r in results.values()),
        errors=len(errors) + sum(1 for v in outputs.values() if v is None), correct=correct,
        requests=len(groups), truth_rows=truth_rows,
        steps=[(len(rows), correct, truth_rows)] if correct is not None and truth_rows is not None else [],
        # As in the labeled rows: an answer's confidence, none on an error row.
        by_row={i: (confidence.get(i) if outputs.get(i) is not None else None, ok) for i, ok in right.items()},
    )


def time_sample(spec: JobSpec, sample: Sample, engine: Engine) -> Timing:
    """Warm up on other rows, then time the sample through ``engine`` with the job's settings."""
    if sample.warmup:
        _run(engine, spec, sample.warmup)
    return time_rows(spec, sample.rows, engine)


def merge(a: Timing, b: Timing, first_rows: int) -> Timing:
    """Two timed draws of one model on one engine, as one. Every draw counts for accuracy; for
    speed only draws at least as large as the first (``first_rows``, a full batch when
    ``fill_batch``): a smaller draw runs a part-empty batch, slower per token than the run's
    full one, and would bias the prediction high."""
    correct = None if a.correct is None or b.correct is None else a.correct + b.correct
    truth_rows = None if a.truth_rows is None or b.truth_rows is None else a.truth_rows + b.truth_rows
    fast = b.rows >= first_rows
    return replace(
        a, rows=a.rows + b.rows, errors=a.errors + b.errors, correct=correct, truth_rows=truth_rows,
        seconds=a.seconds + (b.seconds if fast else 0.0),
        prompt_tokens=a.prompt_tokens + (b.prompt_tokens if fast else 0),
        output_tokens=a.output_tokens + (b.output_tokens if fast else 0),
        requests=(a.requests or a.rows) + ((b.requests or b.rows) if fast else 0),
        steps=[*a.steps, (a.rows + b.rows, correct, truth_rows)] if correct is not None and truth_rows is not None
        else [],
        by_row={**a.by_row, **b.by_row},
    )


def sample_model(spec: JobSpec, home: JobHome, est: EstimateSpec, sample: Sample, engine: Engine) -> Timing:
    """Time and score the sample on ``engine``; while the accuracy interval straddles
    ``est.accuracy_bar``, double the sample (new rows of the same stratified draw, never a
    warm-up or already timed row) and time those on the same engine, up to ``est.max_sample_rows``.
    A first draw shorter than ``est.min_sample_seconds`` (one batch of short prompts on an H200:
    under a second) gets one longer draw of new rows first, and the speed is :func:`fit` to both."""
    timing = time_sample(spec, sample, engine)
    seen = {r["row_id"] for r in (*sample.rows, *sample.warmup)}
    size = len(sample.rows)
    target = _long_enough(timing, est, size, sample.total_rows)
    if target is not None:  # one more draw, in one stream, long enough to time: then fit the two
        bigger = draw_sample(spec, home, est.model_copy(update={"sample_rows": target}))
        more = [r for r in bigger.rows if r["row_id"] not in seen]
        if more:
            seen.update(r["row_id"] for r in more)
            first, second = timing, time_rows(spec, more, engine)
            timing = fit(merge(first, second, len(sample.rows)), first, second)
            size = target
    while (grown := _grown(timing, est, size, sample.total_rows)) is not None:
        size = grown
        bigger = draw_sample(spec, home, est.model_copy(update={"sample_rows": size}))
        more = [r for r in bigger.rows if r["row_id"] not in seen]
        if more:
            seen.update(r["row_id"] for r in more)
            timing = merge(timing, time_rows(spec, more, engine), len(sample.rows))
    return timing


def _grown(timing: Timing, est: EstimateSpec, size: int, total: int) -> int | None:
    """The sample's next size while the accuracy interval straddles the bar (doubled, up to
    ``max_sample_rows``), or None when it is decided."""
    if verdict(timing.correct, timing.scored, est.accuracy_bar) == "straddles" and size < min(est.max_sample_rows,
                                                                                             total):
        return min(size * 2, est.max_sample_rows)
    return None


def _long_enough(timing: Timing, est: EstimateSpec, size: int, total: int) -> int | None:
    """Rows a draw needs (these and new ones) to run ``min_sample_seconds`` at the first draw's
    pace, up to a quarter of the job; None when the first draw was long enough (or the job small)."""
    if timing.seconds >= est.min_sample_seconds or size >= total // 4:
        return None
    # 1.2: the longer draw runs faster per row than the first (its fill is a smaller share).
    wanted = math.ceil(size + size * 1.2 * (est.min_sample_seconds - timing.seconds) / max(timing.seconds, 1e-3))
    return min(max(wanted, 2 * size), total // 4)


def fit(merged: Timing, a: Timing, b: Timing) -> Timing:
    """``merged`` with a straight line through two draws timed on one engine: each draw pays the
    engine's fill-up (prefill of a whole batch before the first decode, the drain at its end)
    once, as a whole run does; a per-token rate of the merged draws would charge it twice, which
    on an H200 was +16% and +23% on a 40,000-row job of short prompts. No fit when the second draw
    is not both longer and more tokens (noise): the merged rate stands."""
    tok_a, tok_b = a.prompt_tokens + a.output_tokens, b.prompt_tokens + b.output_tokens
    if tok_b <= tok_a or b.seconds <= a.seconds:
        return merged
    per_token = (b.seconds - a.seconds) / (tok_b - tok_a)
    return replace(merged, s_per_token=per_token, fill_s=max(0.0, a.seconds - per_token * tok_a))


def _prompt_rows(spec: JobSpec, rows: list[dict[str, Any]]) -> dict[str, int]:
    """Result-store keys of the distinct prompts among ``rows`` (as the run groups them), with
    how many rows each stands for (a draw's is none: never stored)."""
    _, groups = plan_rows(spec, rows, set())
    return {key: len(ids) for g, (_, ids) in groups.items() if (key := store_key(g)) is not None}


def count_stored(spec: JobSpec, home: JobHome, sample: Sample, store: ResultStore) -> Stored:
    """Rows and prompts of the input whose answer ``store`` already holds (a run reuses them and
    pays nothing for them), and the prompts left to generate. Shard by shard, as the run
    deduplicates; an empty store costs no rendering."""
    if not store.segments():
        return Stored(0, 0, sample.distinct_prompts)
    if sample.total_rows > EXACT_STORE_COUNT_ROWS:
        keys = _prompt_rows(spec, sample.rows)
        found = store.lookup(list(keys))
        row_share = sum(keys[k] for k in found) / max(sum(keys.values()), 1)
        prompt_share = len(found) / max(len(keys), 1)
        prompts = round(prompt_share * sample.distinct_prompts)
        return Stored(round(row_share * sample.total_rows), prompts, sample.distinct_prompts - prompts, exact=False)
    manifest = home.read_manifest() or {"keys": [], "signature": None}
    per_shard = [_prompt_rows(spec, read_shard(home, key, manifest["signature"])) for key in manifest["keys"]]
    found = store.lookup(sorted({k for shard in per_shard for k in shard}))
    rows = prompts = todo = 0
    for shard in per_shard:
        hits = [k for k in shard if k in found]
        rows += sum(shard[k] for k in hits)
        prompts += len(hits)
        todo += len(shard) - len(hits)
    return Stored(rows, prompts, todo)
