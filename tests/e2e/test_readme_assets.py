"""The README's own downstream assets (its "Your own downstream assets" block), run as written
on a job whose output holds an error row: ``label_counts -> dict[str, int]`` failed Dagster's
type check there (the error row's ``None`` output was a key), issue 59."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pyarrow as pa
from dagster import AssetIn, DagsterInstance, Definitions, asset, materialize
from dagster_duckdb import DuckDBResource

from sparkbatch_dagster import build_batch_assets
from sparkbatch_dagster.cli.commands import RANGE_END, RANGE_START
from testkit import fake_resource, make_rows, make_spec, write_parquet

ROOT = Path(__file__).resolve().parents[2]


def readme_block() -> str:
    """The README's indented code block that defines ``label_counts``, dedented."""
    text = (ROOT / "README.md").read_text()
    start = text.index("    @asset(ins={\"labeled\": AssetIn(key=job.keys[\"labeled_outputs\"])})")
    block = text[start:text.index("\n\n(", start)]
    return re.sub(r"^    ", "", block, flags=re.MULTILINE)


def test_the_readmes_downstream_assets_run_on_a_job_with_an_error_row(tmp_path: Path):
    rows = make_rows(12)
    rows[3]["text"] = ""  # an empty text: an error row, its output null
    src = write_parquet(tmp_path / "in" / "rows.parquet", rows)
    job = build_batch_assets(spec=make_spec(tmp_path, input=str(src), shards=2))
    vllm = fake_resource()[0]
    space = {"asset": asset, "AssetIn": AssetIn, "Definitions": Definitions, "DuckDBResource": DuckDBResource,
             "Counter": Counter, "pa": pa, "job": job, "vllm": vllm}
    exec(readme_block(), space)  # noqa: S102 - the README's own example, run as a user would
    defs, inst = space["defs"], DagsterInstance.get()
    resources = {"vllm": vllm, "duckdb": DuckDBResource(database=str(job.duckdb_path))}
    assert materialize(job.assets, selection=[job.keys["input_shards"]], resources=resources, instance=inst).success
    keys = inst.get_dynamic_partitions(job.partitions_def.name)
    labeled = materialize(job.assets, selection=[job.keys["labeled_outputs"]], resources=resources, instance=inst,
                          tags={RANGE_START: keys[0], RANGE_END: keys[-1]})
    assert labeled.success
    assert any(r["error"] for r in job.read_outputs().to_pylist())  # the job has its error row
    counted = materialize([*job.assets, space["label_counts"]], selection=[space["label_counts"].key],
                          resources=resources, instance=inst)
    assert counted.success
    counts = counted.output_for_node("label_counts")
    assert sum(counts.values()) == 11 and all(isinstance(k, str) for k in counts)
    assert defs is not None
