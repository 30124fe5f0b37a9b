"""The result store at scale: lookup time per shard against a store of 10M answers, next to
the time the same shard takes to generate on an H200 (from a committed result file).

    python -m benchmarks.store.store_lookup                     # 10M stored answers, 10k-row shards
    python -m benchmarks.store.store_lookup --stored 1000000    # quicker

The store is laid out as the runner leaves it after labeling ``stored / shard_rows`` shards
(merged 16 at a time: a few big segments, a few small ones). Each probe is one shard's prompt
keys, half of them stored (a rerun after appending rows), timed as ``ResultStore.lookup``;
and one full ``_Shard`` planning step (read, render, key, look up) for scale. Prints one JSON
line; ``--out`` writes it to a file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.lib.machine import machine
from benchmarks.lib.results_io import emit
from benchmarks.lib.stored_answers import build
from sparkbatch_dagster.run.result_store import ResultStore, prompt_key, split_key

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stored", type=int, default=10_000_000)
    ap.add_argument("--shard-rows", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--gpu-result", default=str(ROOT / "benchmarks/results/h200-1b-debian.json"))
    ap.add_argument("--out")
    args = ap.parse_args()
    probe = [prompt_key("You sort Debian packages.", f"Package: p{i}\nWhich section?") for i in range(args.shard_rows)]
    with tempfile.TemporaryDirectory() as tmp:
        store = ResultStore(Path(tmp), "0123456789abcdef")
        t = time.perf_counter()
        mb = build(store, args.stored - args.shard_rows // 2, args.shard_rows, probe[: args.shard_rows // 2])
        build_s = time.perf_counter() - t
        times, found = [], 0
        for _ in range(args.repeat):
            t = time.perf_counter()
            found = len(store.lookup(probe))
            times.append(time.perf_counter() - t)
        t = time.perf_counter()
        _ = [split_key(k) for k in probe]
        key_s = time.perf_counter() - t
        segments = len(store.segments())
    gpu = json.loads(Path(args.gpu_result).read_text())
    gpu_shard_s = gpu["pipeline_s"][0] / gpu["rows"] * args.shard_rows  # seconds to label one shard there
    lookup_s = statistics.median(times)
    result = {
        "benchmark": "store_lookup", "machine": machine(cpu_only=True),
        "stored_answers": args.stored,
        "segments": segments, "store_mb": round(mb, 1), "bytes_per_answer": round(mb * 1e6 / args.stored, 1),
        "build_s": round(build_s, 1), "shard_rows": args.shard_rows, "hits": found, "repeat": args.repeat,
        "lookup_s": [round(x, 3) for x in times], "lookup_s_median": round(lookup_s, 3),
        "key_split_s": round(key_s, 4),
        "gpu_reference": {"file": Path(args.gpu_result).name, "machine": gpu["machine"], "model": gpu["model"],
                          "rows": gpu["rows"], "pipeline_s": gpu["pipeline_s"][0]},
        "gpu_shard_s": round(gpu_shard_s, 2), "lookup_share_of_gpu_shard": round(lookup_s / gpu_shard_s, 4),
    }
    emit(result, args.out)


if __name__ == "__main__":
    main()
