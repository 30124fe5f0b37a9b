"""Empty shards (a header-only CSV, more shards than rows) commit as empty partitions: a labeled
file with 0 rows and the output schema, stats with rows 0, both checks passing, analytics built."""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance, materialize

from sparkbatch_dagster import build_batch_assets
from sparkbatch_dagster.cli.commands import RANGE_END, RANGE_START
from sparkbatch_dagster.run.checkpoint import OUTPUT_SCHEMA, assemble
from testkit import fake_resource, make_spec

ROOT = Path(__file__).resolve().parents[2]
THREE = b"id,text,gold\nid-1,A apple.,fruit\nid-2,A car.,vehicle\nid-3,A dog.,animal\n"


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / "src" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _materialize_all(tmp_path: Path, src: Path, shards: int):
    """input_shards, then labeled_outputs over every partition, then analytics: (job, labeled result, instance)."""
    job = build_batch_assets(spec=make_spec(tmp_path, input=str(src), shards=shards))
    res, inst = {"vllm": fake_resource()[0]}, DagsterInstance.get()
    assert materialize(job.assets, selection=[job.keys["input_shards"]], resources=res, instance=inst).success
    keys = inst.get_dynamic_partitions(job.partitions_def.name)
    assert len(keys) == shards
    tags = {RANGE_START: keys[0], RANGE_END: keys[-1]}
    labeled = materialize(job.assets, selection=[job.keys["labeled_outputs"]], resources=res, instance=inst,
                          tags=tags)
    assert labeled.success
    assert materialize(job.assets, selection=[job.keys["run_metrics"]], resources=res, instance=inst,
                       tags=tags).success
    assert materialize(job.assets, selection=[job.keys["analytics"]], resources=res, instance=inst).success
    assert inst.get_materialized_partitions(job.keys["labeled_outputs"]) == set(keys)
    checks = labeled.get_asset_check_evaluations()
    assert {(e.partition, e.check_name) for e in checks if e.passed} == \
        {(k, c) for k in keys for c in ("every_row_exactly_once", "error_rate")}
    version = job.output_version(res["vllm"])
    for k in keys:  # every partition: a labeled file with the output schema, and stats
        assert pq.read_schema(job.home.labeled_path(version, k)).equals(OUTPUT_SCHEMA, check_metadata=False)
        stats = json.loads(job.home.stats_path(version, k).read_text())
        shard_rows = pq.read_metadata(job.home.shard_path(k)).num_rows
        assert stats["rows"] == shard_rows == pq.read_metadata(job.home.labeled_path(version, k)).num_rows
    return job, labeled, inst


def test_assemble_of_a_shard_without_rows_is_an_empty_table(tmp_path):
    table = assemble(tmp_path / "no-parts", [], "shard-00003")
    assert table.num_rows == 0 and table.schema.equals(OUTPUT_SCHEMA)


def test_more_shards_than_rows_commits_the_empty_ones(tmp_path, caplog):
    src = _write(tmp_path, "rows.csv", THREE)
    with caplog.at_level(logging.WARNING, logger="sparkbatch"):
        job, labeled, _ = _materialize_all(tmp_path, src, shards=8)
    warning = [r.getMessage() for r in caplog.records if "shard_count" in r.getMessage()]
    assert len(warning) == 1 and "shard_count=8" in warning[0] and "3 rows" in warning[0], warning
    assert "set shard_count to at most 3" in warning[0]
    mats = labeled.asset_materializations_for_node("things__labeled_outputs")
    assert len(mats) == 8 and sum(m.metadata["rows"].value for m in mats) == 3
    assert sum(1 for m in mats if m.metadata["rows"].value == 0) >= 5
    out = job.read_outputs().to_pylist()
    assert sorted(r["row_id"] for r in out) == ["id-1", "id-2", "id-3"]
    assert all(r["error"] is None for r in out)


def test_a_header_only_csv_is_a_job_of_empty_partitions(tmp_path, caplog):
    src = _write(tmp_path, "rows.csv", b"id,text,gold\n")
    with caplog.at_level(logging.WARNING, logger="sparkbatch"):
        job, labeled, _ = _materialize_all(tmp_path, src, shards=2)
    assert any("0 rows" in r.getMessage() for r in caplog.records)
    assert job.read_outputs().num_rows == 0


def test_a_header_only_csv_beside_others_in_a_glob(tmp_path):
    _write(tmp_path, "a.csv", THREE)
    _write(tmp_path, "b.csv", b"id,text,gold\n")
    job, _, _ = _materialize_all(tmp_path, tmp_path / "src" / "*.csv", shards=2)
    assert sorted(r["row_id"] for r in job.read_outputs().to_pylist()) == ["id-1", "id-2", "id-3"]


DEFS = """
from dagster import Definitions
from sparkbatch_dagster import JobSpec, OutputSpec, build_batch_assets
from sparkbatch_dagster.testing import FakeVLLMResource
spec = JobSpec(name="things", input={src!r}, id_column="id", text_columns=["text"],
               system_prompt="Answer with one word.", user_template="What is this? {{{{ text }}}}",
               output=OutputSpec(kind="label", labels=["fruit", "vehicle", "animal"]), shard_count=8,
               gold_column="gold", home={home!r})
job = build_batch_assets(spec=spec)
defs = Definitions(assets=job.assets, resources={{"vllm": FakeVLLMResource()}})
"""


@pytest.mark.parametrize("bucket", [False, True])
def test_sparkbatch_run_with_more_shards_than_rows(tmp_path, request, bucket):
    src = _write(tmp_path, "rows.csv", THREE)
    home = f"s3://{request.getfixturevalue('s3_bucket')}/jobs/things" if bucket else str(tmp_path / "home")
    defs = tmp_path / "defs.py"
    defs.write_text(DEFS.format(src=str(src), home=home))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTHONWARNINGS", None)
    proc = subprocess.run([sys.executable, "-m", "sparkbatch_dagster.cli", "run", "-f", str(defs)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["success"] is True and summary["rows"] == 3 and summary["errors"] == 0
    assert summary["partitions_total"] == summary["partitions_done"] == 8
    assert "shard_count=8" in proc.stderr
