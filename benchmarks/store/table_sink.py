"""What the table sink costs: syncing a job's committed shards into its Delta Lake table, in a
folder home and in a bucket home (moto's S3 server on loopback), timed apart from the labeling.

    export PYTHONPATH=.:tests/support   # the tests' shared code these use (benchmarks/lib/support.py)
    python -m benchmarks.store.table_sink --rounds 3 --out benchmarks/results/cpu-table-sink.json

The job is labeled once per home with the fake engine (its answers are not what is measured:
the table holds the same columns whatever the model said), then each round syncs into a fresh
table (``sink.uri`` per round) and times: ``first_s``, every shard into an empty table (one Delta
commit); ``replay_s``, the sync again with nothing to do (it reads the table's ``version`` and
``shard`` columns and writes nothing); ``one_shard_s``, the sync that brings back one shard whose
rows were deleted from the table (what a sync after each finished run pays). Medians over rounds.
Input: ``--data`` (the Debian records, ``../shared/data/debian_packages.parquet``) when it exists,
else ``--rows`` generated rows.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.lib.machine import machine
from benchmarks.lib.results_io import emit
from benchmarks.lib.support import support

ROOT = Path(__file__).resolve().parents[2]


def _spec(data: Path | None, rows: int, shards: int, work: Path) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sparkbatch_dagster import JobSpec, OutputSpec, SinkSpec

    if data is not None and data.exists():
        table = pq.read_table(data, columns=["package", "description", "section"])
    else:
        table = pa.table({"package": [f"p{i}" for i in range(rows)],
                          "description": [f"package number {i}, a tool for thing {i % 97}" for i in range(rows)],
                          "section": [["utils", "libs", "devel"][i % 3] for i in range(rows)]})
    src = work / "input.parquet"
    pq.write_table(table, src)
    return JobSpec(name="bench", input=str(src), id_column="package", text_columns=["description"],
                   user_template="{{ description }}\nSection?", shard_count=shards, gold_column="section",
                   output=OutputSpec(kind="label", labels=["utils", "libs", "devel"]), home=str(work / "home"),
                   sink=SinkSpec())


def _label(spec: Any) -> Any:
    """Shard and label the whole job (fake engine); returns the built job."""
    from dagster import DagsterInstance, materialize

    from sparkbatch_dagster import build_batch_assets
    from sparkbatch_dagster.testing import FakeVLLMResource

    job = build_batch_assets(spec=spec)
    res, inst = {"vllm": FakeVLLMResource()}, DagsterInstance.get()
    assert materialize(job.assets, selection=[job.keys["input_shards"]], resources=res, instance=inst).success
    keys = inst.get_dynamic_partitions(job.partitions_def.name or "")
    tags = {"dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]}
    assert materialize(job.assets, selection=[job.keys["labeled_outputs"]], resources=res, instance=inst,
                       tags=tags).success
    return job


def _round(job: Any, uri: str, options: dict[str, str]) -> dict[str, float]:
    from deltalake import DeltaTable

    from sparkbatch_dagster import SinkSpec
    from sparkbatch_dagster.run.table_sink import sync_table

    spec = job.spec.model_copy(update={"sink": SinkSpec(uri=uri, storage_options=options)})
    version = job.current_version()
    t = time.perf_counter()
    first = sync_table(spec, job.home, version)
    first_s = time.perf_counter() - t
    t = time.perf_counter()
    replay = sync_table(spec, job.home, version)
    replay_s = time.perf_counter() - t
    assert replay["shards_added"] == [] and replay["table_version"] == first["table_version"], "a replay wrote"
    DeltaTable(first["uri"], storage_options=options).delete("shard = 'shard-00000'")
    t = time.perf_counter()
    again = sync_table(spec, job.home, version)
    one_s = time.perf_counter() - t
    assert again["shards_added"] == ["shard-00000"] and again["rows"] == first["rows"], "the shard came back wrong"
    return {"first_s": first_s, "replay_s": replay_s, "one_shard_s": one_s, "rows": first["rows"],
            "files_after_first": first["files"]}


def _arm(job: Any, uris: list[str], options: dict[str, str]) -> dict[str, Any]:
    runs = [_round(job, uri, options) for uri in uris]
    out: dict[str, Any] = {k: round(statistics.median(r[k] for r in runs), 3) for k in ("first_s", "replay_s",
                                                                                       "one_shard_s")}
    out["rounds_s"] = [{k: round(r[k], 3) for k in ("first_s", "replay_s", "one_shard_s")} for r in runs]
    out["rows_per_s_first"] = round(runs[0]["rows"] / out["first_s"])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "debian_packages.parquet"))
    p.add_argument("--rows", type=int, default=60_000, help="generated rows when --data does not exist")
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--work", default="/tmp/sparkbatch-table-sink-bench")
    p.add_argument("--out", default=None)
    args = p.parse_args()

    import shutil

    import deltalake

    S3Server = support("s3_server").S3Server

    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    os.environ.setdefault("DAGSTER_HOME", str(work / "dagster_home"))
    Path(os.environ["DAGSTER_HOME"]).mkdir(parents=True, exist_ok=True)
    data = Path(args.data)
    spec = _spec(data, args.rows, args.shards, work)
    t = time.perf_counter()
    local_job = _label(spec)
    label_s = time.perf_counter() - t
    rows = len(local_job.read_outputs())
    local = _arm(local_job, [str(work / "tables" / f"local-{i}") for i in range(args.rounds)], {})

    server = S3Server.start()
    try:
        for k, v in server.env().items():
            os.environ[k] = v
        bucket_spec = spec.model_copy(update={"home": f"s3://{server.new_bucket('bench')}/job",
                                              "cache_dir": str(work / "cache")})
        bucket_job = _label(bucket_spec)
        home = bucket_spec.home_url
        bucket = _arm(bucket_job, [f"{home}/tables/round-{i}" for i in range(args.rounds)], {"AWS_ALLOW_HTTP": "true"})
    finally:
        server.stop()
    emit({"benchmark": "table_sink", "machine": machine(cpu_only=True),
          "deltalake": deltalake.__version__, "input": data.name if data.exists() else "generated", "rows": rows,
          "shards": args.shards, "rounds": args.rounds, "fake_engine_label_s": round(label_s, 2),
          "local": local, "bucket": bucket, "command": " ".join(["python", *sys.argv])}, args.out)


if __name__ == "__main__":
    main()
