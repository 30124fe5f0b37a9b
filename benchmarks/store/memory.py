"""Memory: sharding a 10M-row Parquet input, and the labeled-output writer vs shard count.

    python -m benchmarks.store.memory --out benchmarks/results/cpu-memory.json   # 10M rows; one JSON line
    python -m benchmarks.store.memory --rows 1000000  # quicker

(1) sharding runs in a fresh child process, so its peak RSS (ru_maxrss) is sharding alone; then
the estimate's stratified sample is drawn from those shards in another fresh child;
(2) the writer labels the same 20k rows split into 4 and then 64 shards with the fake engine,
each in a fresh child process, and compares peak RSS: it must not grow with the shard count.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.lib.machine import machine
from benchmarks.lib.results_io import emit

ROOT = Path(__file__).resolve().parents[2]


WRITER_ROWS = 20_000
SAMPLE_ROWS = 100


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def make_input(path: Path, rows: int) -> None:
    import duckdb

    con = duckdb.connect()
    con.execute("SET memory_limit = '1GB'")
    con.execute(
        f"COPY (SELECT 'id-' || i AS id, 'Package number ' || i || ' does ' || (i % 977) || ' useful things "
        f"for the desktop and the server, with docs.' AS text, 'sec' || (i % 40) AS gold FROM range({rows}) t(i)) "
        f"TO '{path}' (FORMAT parquet, ROW_GROUP_SIZE 100000)"
    )


def _shard_child(input_path: str, home: str, shards: int, q: Any) -> None:
    from sparkbatch_dagster import JobSpec
    from sparkbatch_dagster.home import JobHome
    from sparkbatch_dagster.inputs.shards import build_shards

    spec = JobSpec(name="mem", input=input_path, id_column="id", text_columns=["text"],
                   user_template="{{ text }}", shard_count=shards, home=home, gold_column="gold")
    t = time.perf_counter()
    manifest = build_shards(spec, JobHome(spec.home_path))
    q.put({"rows": manifest["rows"], "seconds": round(time.perf_counter() - t, 1), "peak_rss_mb": round(_peak_mb())})


def _sample_child(home: str, q: Any) -> None:
    from sparkbatch_dagster import EstimateSpec, JobSpec
    from sparkbatch_dagster.estimate.sample import draw_sample
    from sparkbatch_dagster.home import JobHome

    spec = JobSpec(name="mem", input="unused", id_column="id", text_columns=["text"],
                   user_template="{{ text }}", home=home, gold_column="gold")
    t = time.perf_counter()
    sample = draw_sample(spec, JobHome(spec.home_path), EstimateSpec(sample_rows=SAMPLE_ROWS, warmup_rows=8))
    q.put({"rows": len(sample.rows), "seconds": round(time.perf_counter() - t, 1), "peak_rss_mb": round(_peak_mb())})


def _label_child(input_path: str, home: str, shards: int, q: Any) -> None:
    from sparkbatch_dagster import JobSpec
    from sparkbatch_dagster.engines import FakeEngine
    from sparkbatch_dagster.home import JobHome
    from sparkbatch_dagster.inputs.shards import build_shards
    from sparkbatch_dagster.run.runner import ShardRun

    spec = JobSpec(name="mem", input=input_path, id_column="id", text_columns=["text"],
                   user_template="{{ text }}", shard_count=shards, home=home)
    h = JobHome(spec.home_path)
    keys = build_shards(spec, h)["keys"]
    base = _peak_mb()
    ShardRun(spec, h, "00000000000000ee", FakeEngine()).run(keys)
    q.put({"shards": shards, "peak_rss_mb": round(_peak_mb()), "growth_mb": round(_peak_mb() - base)})


def in_child(fn: Any, *args: Any) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=fn, args=(*args, q))
    p.start()
    out = q.get()
    p.join()
    return dict(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--shards", type=int, default=100)
    ap.add_argument("--out", default=None, help="also write the result object to this file")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="sparkbatch-mem-"))
    big = tmp / "big.parquet"
    make_input(big, args.rows)
    sharding = in_child(_shard_child, str(big), str(tmp / "shard-home"), args.shards)
    sampling = in_child(_sample_child, str(tmp / "shard-home"))
    small = tmp / "small.parquet"
    make_input(small, WRITER_ROWS)
    few = in_child(_label_child, str(small), str(tmp / "few"), 4)
    many = in_child(_label_child, str(small), str(tmp / "many"), 64)
    emit({
        "benchmark": "memory", "machine": machine(cpu_only=True),
        "rows": sharding["rows"], "shards": args.shards, "sharding_s": sharding["seconds"],
        "sharding_peak_rss_mb": sharding["peak_rss_mb"], "sharding_target_mb": 1536,
        "estimate_sample_rows": SAMPLE_ROWS, "estimate_sample_s": sampling["seconds"],
        "estimate_sample_peak_rss_mb": sampling["peak_rss_mb"], "writer_rows": WRITER_ROWS,
        "writer_peak_rss_mb_4_shards": few["peak_rss_mb"], "writer_peak_rss_mb_64_shards": many["peak_rss_mb"],
        "writer_growth_ratio_64_vs_4": round(many["peak_rss_mb"] / few["peak_rss_mb"], 3),
    }, args.out)


if __name__ == "__main__":
    main()
