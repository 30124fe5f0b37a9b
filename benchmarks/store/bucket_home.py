"""What a bucket home costs: the same job labeled with its home in a local folder and in an S3
bucket (moto's S3 server on loopback, s3fs the client), on one warm engine, rounds in A-B / B-A
order.

    export PYTHONPATH=.:tests/support   # the tests' shared code these use (benchmarks/lib/support.py)
    python -m benchmarks.store.bucket_home --rounds 4 --out benchmarks/results/cpu-bucket-home.json
    python3 -m benchmarks.store.bucket_home --mode summary --rows 40000 --model /tmp/llama-1b --load-format dummy \\
        --gpu --rounds 4 --data .bench/debian_packages.parquet --out $OUT/h200-bucket-home.json   # the H200

Each round gets a fresh home (nothing done, nothing stored) and times, as ``throughput.py`` does,
the labeling run (``labeled_outputs`` over every partition, then ``run_metrics``): ``pipeline_s``,
and the runner's own wall time summed over partitions, ``labeling_s``. The bucket arm pays its
uploads (parts every checkpoint interval, each shard's objects and commit, the answer segments,
the attempt record, leases) inside those times; its sharding (the input shards uploaded once)
is timed apart, ``sharding_s``, as it happens once per job. The ratio is bucket / local, per
round and over the medians; the target is at most 1.03 for labeling.

With a bucket home a shard's commit in the bucket (its objects, the commit object, its answer
segment) is made from the upload thread while the engine keeps generating; the figures here are
of that design. Loopback is not a WAN: an S3 region adds 10-50 ms per request. The result says how many
requests the bucket arm made per round, so that latency can be priced in.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.lib.machine import machine
from benchmarks.lib.results_io import emit
from benchmarks.lib.support import support
from benchmarks.lib.workload import arg_parser, set_up, shape_of, vllm_version

ROOT = Path(__file__).resolve().parents[2]


def _requests(server: Any) -> int:
    """Requests moto has answered so far (its log has a line per request)."""
    return sum(1 for line in server.log_path.read_text(errors="replace").splitlines() if '" 2' in line
               or '" 4' in line or '" 5' in line)


def _cpu(server: Any) -> float:
    """CPU seconds the S3 server's process has used: on this box, not on a real store's."""
    import psutil

    t = psutil.Process(server.proc.pid).cpu_times()
    return float(t.user + t.system)


def main() -> None:
    p = arg_parser(__doc__, "debian", 4000)
    p.add_argument("--rounds", type=int, default=4, help="rounds of local + bucket (A-B / B-A)")
    p.add_argument("--out", default=None)
    args = p.parse_args()

    from dagster import DagsterInstance, materialize

    S3Server = support("s3_server").S3Server
    from sparkbatch_dagster import VLLMResource, build_batch_assets

    server = S3Server.start()
    for k, v in server.env().items():
        os.environ[k] = v
    spec, kw, engine, engine_start_s = set_up(args)
    res = {"vllm": VLLMResource(**kw)}
    inst = DagsterInstance.get()
    base = spec.home_path
    requests: list[int] = []
    store_cpu: list[float] = []

    def arm(name: str, n: int) -> dict[str, float]:
        # A bucket per round: moto lists a prefix by walking every key of its bucket.
        home = f"s3://{server.new_bucket('bench')}/job" if name == "bucket" else str(base / f"local-{n}")
        round_spec = spec.model_copy(update={"home": home, "cache_dir": str(base / f"cache-{n}")})
        job = build_batch_assets(spec=round_spec)
        t = time.perf_counter()
        materialize(job.assets, selection=[job.keys["input_shards"]], resources=res, instance=inst)
        sharding = time.perf_counter() - t
        keys = inst.get_dynamic_partitions(job.partitions_def.name or "")
        if getattr(engine, "_llm", None) is not None:
            engine._llm.reset_prefix_cache()  # type: ignore[attr-defined]
        tags = {"dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]}
        before, cpu_before = _requests(server), _cpu(server)
        t = time.perf_counter()
        result = materialize(job.assets, selection=[job.keys["labeled_outputs"]], resources=res, instance=inst,
                             tags=tags)
        materialize(job.assets, selection=[job.keys["run_metrics"]], resources=res, instance=inst, tags=tags)
        pipeline = time.perf_counter() - t
        if name == "bucket":
            requests.append(_requests(server) - before)
            store_cpu.append(round(_cpu(server) - cpu_before, 3))
        mds = [m.metadata for m in result.asset_materializations_for_node("bench__labeled_outputs")]
        rows = sum(md["rows"].value for md in mds)
        assert rows == totals.setdefault("rows", rows), "an arm lost rows"
        return {"pipeline_s": pipeline, "labeling_s": sum(md["wall_s"].value for md in mds), "sharding_s": sharding}

    totals: dict[str, Any] = {}
    times: dict[str, list[dict[str, float]]] = {"local": [], "bucket": []}
    arm("local", -1)  # warm-up of both paths (imports, s3fs session), not counted
    arm("bucket", -1)
    for n in range(args.rounds):
        for name in ("local", "bucket") if n % 2 == 0 else ("bucket", "local"):
            times[name].append(arm(name, n))
        lo, bu = times["local"][-1], times["bucket"][-1]
        print(f"round {n}: local {lo['pipeline_s']:.2f} s (labeling {lo['labeling_s']:.2f}), bucket "
              f"{bu['pipeline_s']:.2f} s (labeling {bu['labeling_s']:.2f}), "
              f"ratio {bu['pipeline_s'] / lo['pipeline_s']:.3f}", file=sys.stderr, flush=True)
    res["vllm"].shutdown()
    server.stop()

    def med(name: str, part: str) -> float:
        return round(statistics.median(r[part] for r in times[name]), 3)

    emit({
        "benchmark": "bucket_home", "mode": args.mode, "rows": totals["rows"], "shards": args.shards,
        "model": engine.model_id, "shape": shape_of(engine.model_id), "machine": machine(),
        "vllm": vllm_version(), "engine_start_s": round(engine_start_s, 1), "rounds": args.rounds,
        "store": "moto S3 server on loopback, s3fs client", "checkpoint_seconds": spec.checkpoint_seconds,
        "local": times["local"], "bucket": times["bucket"],
        "pipeline_ratio_rounds": [round(b["pipeline_s"] / a["pipeline_s"], 3)
                                  for a, b in zip(times["local"], times["bucket"], strict=True)],
        "labeling_ratio_rounds": [round(b["labeling_s"] / a["labeling_s"], 3)
                                  for a, b in zip(times["local"], times["bucket"], strict=True)],
        "pipeline_ratio": round(med("bucket", "pipeline_s") / med("local", "pipeline_s"), 3),
        "labeling_ratio": round(med("bucket", "labeling_s") / med("local", "labeling_s"), 3),
        "sharding_s": {"local": med("local", "sharding_s"), "bucket": med("bucket", "sharding_s")},
        "labeling_ratio_median_of_rounds": round(statistics.median(
            b["labeling_s"] / a["labeling_s"] for a, b in zip(times["local"], times["bucket"], strict=True)), 3),
        "bucket_requests_per_round": requests,
        # The store runs on the measured box here; a real S3 does not use its CPU.
        "store_cpu_s_per_round": store_cpu,
        "date": time.strftime("%Y-%m-%d"), "command": " ".join(["python3", *sys.argv]),
    }, args.out)


if __name__ == "__main__":
    main()
