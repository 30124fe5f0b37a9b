"""The tests of tests/unit/test_hostile_input.py that start processes: the CLI, Dagster runs (their
log capture), servers, kills. That file says what they cover."""


import pyarrow.parquet as pq

from testkit import fake_resource, label_then_metrics, make_spec
from unit.test_hostile_input import BAD_UTF8, _csv_75, _write


def test_the_dagster_job_finishes_on_a_csv_with_bad_bytes(tmp_path):
    from dagster import DagsterInstance, materialize

    from sparkbatch_dagster import build_batch_assets

    src = _write(tmp_path, "rows.csv", _csv_75(BAD_UTF8))
    job = build_batch_assets(spec=make_spec(tmp_path, input=str(src), shards=2))
    res, inst = {"vllm": fake_resource()[0]}, DagsterInstance.get()
    assert materialize(job.assets, selection=[job.keys["input_shards"]], resources=res, instance=inst).success
    result, measured = label_then_metrics(job.assets, job.keys, res, inst, "shard-00000", "shard-00001")
    assert result.success and measured.success
    version = job.output_version(res["vllm"])
    rows = [r for k in ("shard-00000", "shard-00001")
            for r in pq.read_table(job.home.labeled_path(version, k)).to_pylist()]
    assert len(rows) == 74 and sum(1 for r in rows if r["error"]) == 2
