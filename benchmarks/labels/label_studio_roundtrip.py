"""A review round trip through a real Label Studio (``make label-studio``'s, on loopback), timed:
export the review queue's first 200 rows as tasks, export again (nothing to do), annotate every task
through the API as a reviewer would (the gold label), import, import again (nothing to do).

    PYTHONPATH=.:tests/support python -m benchmarks.labels.label_studio_roundtrip --rounds 3 \
        --out benchmarks/results/cpu-label-studio-roundtrip.json

The job is the demo's shape (Debian package descriptions, ``package`` and ``description`` shown, the
demo's 58 section labels, gold ``section``: ``--data``, ``../shared/data/debian_packages.parquet``,
every ``--stride``-th package whose section is a label) labeled by the fake engine (``review_below=1``:
every row is queued; what the model said is not what is timed here). Generated rows stand in when
``--data`` is missing; the result says which. Each round uses a new project and an empty human-labels
store. Times are the Python API's (``export_review``, ``import_review``: what ``sparkbatch review``
runs after loading the definitions) and the SDK's calls; medians over rounds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.lib.machine import machine
from benchmarks.lib.results_io import commit_of, emit
from benchmarks.lib.support import support

ROOT = Path(__file__).resolve().parents[2]

STEPS = ("export_s", "export_again_s", "annotate_s", "import_s", "import_again_s")


def _ls_version() -> str:
    """The label-studio release the server runs (its own virtualenv's)."""
    import subprocess

    LS_PYTHON = support("label_studio_server").LS_PYTHON

    return subprocess.run([str(LS_PYTHON), "-c", "import importlib.metadata as m; print(m.version('label-studio'))"],
                          capture_output=True, text=True, check=True).stdout.strip()


def _demo_labels() -> list[str]:
    import yaml

    text = (ROOT / "assets" / "defs" / "debian_sections" / "defs.yaml").read_text()
    return list(yaml.safe_load(text)["attributes"]["output"]["labels"])


def _input(data: Path, rows: int, stride: int, work: Path) -> tuple[Path, list[str], list[str], str]:
    """The job's input file, its labels, its text columns and what it is."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = work / "input.parquet"
    if data.exists():
        labels = _demo_labels()
        table = pq.read_table(data, columns=["package", "description", "section"]).to_pylist()
        picked = [r for r in table[::stride] if r["section"] in set(labels)][:rows]
        pq.write_table(pa.Table.from_pylist(picked), src)
        return src, labels, ["package", "description"], f"{data.name}: every {stride}th package, {len(picked)} rows"
    labels = ["fruit", "vehicle", "animal"]
    pq.write_table(pa.table({"package": [f"p{i}" for i in range(rows)],
                             "description": [f"item {i}: a {labels[i % 3]} of kind {i % 17}" for i in range(rows)],
                             "section": [labels[i % 3] for i in range(rows)]}), src)
    return src, labels, ["package", "description"], f"generated, {rows} rows"


def _label(src: Path, labels: list[str], texts: list[str], work: Path) -> tuple[Any, Any]:
    """Shard and label the whole job with the fake engine; the built job and its resource."""
    from dagster import DagsterInstance, materialize

    from sparkbatch_dagster import JobSpec, OutputSpec, build_batch_assets
    from sparkbatch_dagster.testing import FakeVLLMResource

    spec = JobSpec(name="debian_review", input=str(src), id_column="package", text_columns=texts,
                   user_template="Package: {{ package }}\nDescription: {{ description }}\nSection?", shard_count=4,
                   gold_column="section", output=OutputSpec(kind="label", labels=labels), home=str(work / "home"),
                   review_below=1.0)
    job, resource = build_batch_assets(spec=spec), FakeVLLMResource()
    res, inst = {"vllm": resource}, DagsterInstance.get()
    assert materialize(job.assets, selection=[job.keys["input_shards"]], resources=res, instance=inst).success
    keys = inst.get_dynamic_partitions(job.partitions_def.name or "")
    tags = {"dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]}
    assert materialize(job.assets, selection=[job.keys["labeled_outputs"]], resources=res, instance=inst,
                       tags=tags).success
    return job, resource


def _round(job: Any, resource: Any, server: Any, tasks: int, title: str, reviewer: int) -> dict[str, Any]:
    import pyarrow.parquet as pq

    from sparkbatch_dagster.review.label_studio import choice, connect, export_review, tasks_by_row
    from sparkbatch_dagster.review.label_studio_import import import_review
    from sparkbatch_dagster.run import human_labels

    shutil.rmtree(human_labels.labels_folder(job.home), ignore_errors=True)  # each round reviews afresh
    gold = {r["package"]: r["section"] for r in pq.read_table(job.spec.input).to_pylist()}
    client = connect(server)
    out: dict[str, Any] = {}
    t = time.perf_counter()
    first = export_review(job, resource, server, title, tasks)
    out["export_s"] = time.perf_counter() - t
    t = time.perf_counter()
    again = export_review(job, resource, server, title, tasks)
    out["export_again_s"] = time.perf_counter() - t
    assert (first.created, again.created, again.unchanged) == (tasks, 0, tasks), (first, again)
    queued = tasks_by_row(client, first.project_id)
    to_name = job.spec.text_columns[0]
    t = time.perf_counter()
    for row_id, task in queued.items():  # one reviewer, one task after another, each answer sent as it is given
        client.annotations.create(task["id"], result=choice(gold[row_id], to_name), completed_by=reviewer,
                                  lead_time=1.0)
    out["annotate_s"] = time.perf_counter() - t
    t = time.perf_counter()
    got = import_review(job, server, title)
    out["import_s"] = time.perf_counter() - t
    t = time.perf_counter()
    second = import_review(job, server, title)
    out["import_again_s"] = time.perf_counter() - t
    assert (got.added, second.added, second.changed, second.unchanged, second.path) == (tasks, 0, 0, tasks, None)
    model = {r: t["predictions"][0]["result"][0]["value"]["choices"][0] for r, t in queued.items()}
    out["corrected"] = sum(model[r] != gold[r] for r in queued)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "debian_packages.parquet"))
    p.add_argument("--rows", type=int, default=400, help="rows of the job (the queue: all of them)")
    p.add_argument("--stride", type=int, default=97, help="every n-th package of --data")
    p.add_argument("--tasks", type=int, default=200, help="queue rows exported and annotated per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--work", default="/tmp/sparkbatch-label-studio-bench")
    p.add_argument("--out", default=None)
    args = p.parse_args()

    from importlib.metadata import version

    from sparkbatch_dagster.review.label_studio import Server, connect

    LabelStudioServer = support("label_studio_server").LabelStudioServer
    installed = support("label_studio_server").installed

    if not installed():
        sys.exit("Label Studio's virtualenv (.ls-venv) is not installed: run `make label-studio`")
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    os.environ["DAGSTER_HOME"] = str(work / "dagster_home")
    Path(os.environ["DAGSTER_HOME"]).mkdir(parents=True)
    src, labels, texts, what = _input(Path(args.data), args.rows, args.stride, work)
    t = time.perf_counter()
    job, resource = _label(src, labels, texts, work)
    label_s = time.perf_counter() - t
    t = time.perf_counter()
    with LabelStudioServer.start(work / "label-studio") as ls:
        start_s = time.perf_counter() - t
        server = Server(ls.url, ls.token)
        reviewer = connect(server).users.create(username="reviewer", email="reviewer@example.com",
                                                password="reviewer-password-1").id
        runs = [_round(job, resource, server, args.tasks, f"debian-review-{i}", reviewer) for i in range(args.rounds)]
    medians = {k: round(statistics.median(r[k] for r in runs), 3) for k in STEPS}
    emit({"benchmark": "label_studio_roundtrip", "machine": machine(cpu_only=True),
          "label_studio": _ls_version(), "label_studio_sdk": version("label-studio-sdk"), "job": what,
          "engine": "fake (sparkbatch_dagster.testing.FakeVLLMResource)", "labels": len(labels),
          "tasks": args.tasks, "rounds": args.rounds, **medians,
          "round_trip_s": round(sum(medians.values()), 3),
          "export_ms_per_task": round(medians["export_s"] / args.tasks * 1000, 2),
          "import_ms_per_task": round(medians["import_s"] / args.tasks * 1000, 2),
          "annotate_ms_per_task": round(medians["annotate_s"] / args.tasks * 1000, 2),
          "rounds_s": [{k: round(r[k], 3) for k in STEPS} for r in runs],
          "corrected": [r["corrected"] for r in runs], "server_start_s": round(start_s, 2),
          "fake_engine_label_s": round(label_s, 2), "code": commit_of(ROOT),
          "command": " ".join(["python", *sys.argv])}, args.out)


if __name__ == "__main__":
    main()
