"""The tests of tests/unit/test_reuse.py that start processes: the CLI, Dagster runs (their
log capture), servers, kills. That file says what they cover."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance, Definitions, materialize

from sparkbatch_dagster import JobSpec, OutputSpec, SamplingSpec, build_batch_assets
from sparkbatch_dagster.run.result_store import ResultStore
from testkit import fake_resource, label_then_metrics, make_spec, total, write_parquet
from unit.test_reuse import _unique_rows

ROOT = Path(__file__).resolve().parents[2]


def _run_all(job, res, inst=None):
    inst = inst or DagsterInstance.get()
    assert materialize(job.assets, selection=[job.keys["input_shards"]], resources=res, instance=inst).success
    keys = inst.get_dynamic_partitions(job.partitions_def.name)
    result, measured = label_then_metrics(job.assets, job.keys, res, inst, keys[0], keys[-1])
    assert result.success and measured.success
    return result


def _outputs(job, res) -> dict[str, str]:
    version = job.output_version(res)
    manifest = job.home.read_manifest()
    return {r["row_id"]: r["output"] for k in manifest["keys"]
            for r in pq.read_table(job.home.labeled_path(version, k)).to_pylist()}


def test_appended_rows_are_the_only_prompts_generated_and_a_touch_generates_nothing(tmp_path):
    src = write_parquet(tmp_path / "in" / "rows.parquet", _unique_rows(200))
    job = build_batch_assets(spec=make_spec(tmp_path, input=str(src), shards=4))
    res, engine = fake_resource()
    _run_all(job, {"vllm": res})
    assert engine.requests_seen == 200
    before = _outputs(job, res)

    os.utime(src)  # touched: same bytes, so the same shards and version; nothing to do at all
    version = job.output_version(res)
    res, engine = fake_resource()
    mats = _run_all(job, {"vllm": res}).asset_materializations_for_node("things__labeled_outputs")
    assert engine.requests_seen == 0 and job.output_version(res) == version
    assert not any(m.metadata["computed_in_this_run"].value for m in mats)  # done before: recorded as reused
    assert total(mats, "generated_requests") == total(mats, "cost_usd") == 0
    assert total(mats, "rows") == total(mats, "reused_rows") == 200

    # 10% more rows (a new version: the shards changed), re-sharded into 5: only new prompts are sent.
    write_parquet(src, [*_unique_rows(200), *_unique_rows(20, start=200)])
    job = build_batch_assets(spec=make_spec(tmp_path, input=str(src), shards=5))
    res, engine = fake_resource()
    result = _run_all(job, {"vllm": res})
    assert engine.requests_seen == 20 and job.output_version(res) != version
    after = _outputs(job, res)
    assert len(after) == 220 and all(after[k] == v for k, v in before.items())
    mats = result.asset_materializations_for_node("things__labeled_outputs")
    assert total(mats, "reused_rows") == 200 and total(mats, "generated_requests") == 20


def test_nothing_to_generate_never_starts_the_engine(tmp_path):
    src = write_parquet(tmp_path / "in" / "rows.parquet", _unique_rows(60))
    job = build_batch_assets(spec=make_spec(tmp_path, input=str(src), shards=2))
    res, _ = fake_resource()
    _run_all(job, {"vllm": res})
    # A gold column added: new shards, new version, every answer from the store, no engine started.
    rows = _unique_rows(60)
    for r in rows:
        r["gold2"] = r["gold"]
    write_parquet(src, rows)
    job = build_batch_assets(spec=make_spec(tmp_path, input=str(src), shards=2, gold_column="gold2"))
    res, engine = fake_resource()
    res.shutdown()  # no warm engine: one would be started only if a prompt needed it
    result = _run_all(job, {"vllm": res})
    mats = result.asset_materializations_for_node("things__labeled_outputs")
    assert total(mats, "reused_rows") == 60 and total(mats, "generated_requests") == 0
    assert res.get_engine() is not engine and res.get_engine().requests_seen == 0  # started only now, by us


@pytest.mark.parametrize("change", [
    {"user_template": "Kind? {{ text }}"},
    {"system_prompt": "One word."},
    {"sampling": SamplingSpec(max_tokens=4, temperature=0.7)},
    {"output": OutputSpec(kind="label", labels=["fruit", "vehicle", "animal", "other"])},
])
def test_a_changed_prompt_sampling_or_output_regenerates_everything(tmp_path, change):
    src = write_parquet(tmp_path / "in" / "rows.parquet", _unique_rows(40))
    job = build_batch_assets(spec=make_spec(tmp_path, input=str(src), shards=2))
    res, engine = fake_resource()
    _run_all(job, {"vllm": res})
    job2 = build_batch_assets(spec=make_spec(tmp_path, input=str(src), shards=2, **change))
    res, engine = fake_resource()
    _run_all(job2, {"vllm": res})
    assert engine.requests_seen == 40


def test_another_model_regenerates_and_never_reads_the_first_models_answers(tmp_path):
    src = write_parquet(tmp_path / "in" / "rows.parquet", _unique_rows(30))
    job = build_batch_assets(spec=make_spec(tmp_path, input=str(src), shards=1))
    res, _ = fake_resource()
    _run_all(job, {"vllm": res})
    other, engine = fake_resource(answer="vehicle")  # answers differently: another identity
    _run_all(job, {"vllm": other})
    assert engine.requests_seen == 30
    assert set(_outputs(job, other).values()) == {"vehicle"}
    contexts = sorted(p.name for p in job.spec.result_store_path.iterdir())
    assert len(contexts) == 2  # one folder of answers per model


def test_broken_stats_part_and_store_files_are_recomputed_not_a_crash(tmp_path):
    src = write_parquet(tmp_path / "in" / "rows.parquet", _unique_rows(80))
    job = build_batch_assets(spec=make_spec(tmp_path, input=str(src), shards=2, checkpoint_rows=5))
    res, engine = fake_resource()
    _run_all(job, {"vllm": res})
    version = job.output_version(res)
    before = _outputs(job, res)
    job.home.stats_path(version, "shard-00000").write_text("")  # zero bytes, as after a power loss
    # shard-00001: not committed, with a truncated checkpoint among its parts
    labeled = job.home.labeled_path(version, "shard-00001")
    parts = job.home.parts_dir(version, "shard-00001")
    table = pq.read_table(labeled)
    write_parquet(parts / "part-000001.parquet", table.slice(0, 10).to_pylist())
    (parts / "part-000002.parquet").write_bytes(b"PAR1\x00\x01")
    labeled.unlink()
    store = ResultStore(job.spec.result_store_path, job.spec.answer_context(res.model_identity()))
    store.segments()[0].write_bytes(store.segments()[0].read_bytes()[:100])  # one segment truncated
    res, engine = fake_resource()
    _run_all(job, {"vllm": res})
    assert _outputs(job, res) == before
    # Only answers of the broken segment (one shard's) that no part file held went back to the engine.
    sizes = [pq.read_metadata(job.home.shard_path(k)).num_rows for k in ("shard-00000", "shard-00001")]
    assert 0 < engine.requests_seen <= max(sizes) < 80
    assert any(p.name.endswith(".broken") for p in store.dir.iterdir())
    stats = json.loads(job.home.stats_path(version, "shard-00000").read_text())
    assert stats["rows"] == pq.read_metadata(job.home.labeled_path(version, "shard-00000")).num_rows > 0


def _two_jobs_defs(tmp_path: Path) -> Path:
    for name in ("a", "b"):
        write_parquet(tmp_path / f"{name}.parquet", _unique_rows(40))
    defs = tmp_path / "defs.py"
    defs.write_text(
        "from dagster import Definitions\n"
        "from sparkbatch_dagster import JobSpec, OutputSpec, build_batch_assets\n"
        "from sparkbatch_dagster.testing import FakeVLLMResource\n"
        "def job(name):\n"
        "    return build_batch_assets(spec=JobSpec(name=name, input=f'{name}.parquet', id_column='id',\n"
        "        text_columns=['text'], user_template='{{ text }}?', shard_count=2,\n"
        "        output=OutputSpec(kind='label', labels=['fruit', 'vehicle', 'animal'])))\n"
        "job_a, job_b = job('a'), job('b')\n"
        "defs = Definitions(assets=[*job_a.assets, *job_b.assets],\n"
        "                   resources={'vllm': FakeVLLMResource(delay_s=0.01)})\n"
    )
    return defs


def test_two_jobs_with_default_homes_never_touch_each_others_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    specs = [JobSpec(name=n, input=str(write_parquet(tmp_path / f"{n}.parquet", _unique_rows(40))), id_column="id",
                     text_columns=["text"], user_template="{{ text }}?", shard_count=2,
                     output=OutputSpec(kind="label", labels=["fruit", "vehicle", "animal"])) for n in ("a", "b")]
    jobs = [build_batch_assets(spec=s) for s in specs]
    assert [j.home.root for j in jobs] == [tmp_path / ".sparkbatch" / "a", tmp_path / ".sparkbatch" / "b"]
    Definitions(assets=[*jobs[0].assets, *jobs[1].assets])  # keys and partitions do not clash
    res, _ = fake_resource()
    _run_all(jobs[0], {"vllm": res})
    done_a = {p: p.stat().st_mtime_ns for p in jobs[0].home.root.rglob("*.parquet")}
    _run_all(jobs[1], {"vllm": res})
    assert {p: p.stat().st_mtime_ns for p in jobs[0].home.root.rglob("*.parquet")} == done_a
    assert len(jobs[0].done_partitions(res)) == len(jobs[1].done_partitions(res)) == 2


def test_two_jobs_run_at_once_from_the_cli(tmp_path):
    defs = _two_jobs_defs(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-m", "sparkbatch_dagster.cli", "run", "-f", str(defs), "--job", n],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for n in ("a", "b")]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
    summaries = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert [s["job"] for s in summaries] == ["a", "b"]
    assert all(s["rows"] == 40 and s["generated"] == 40 and s["reused"] == 0 for s in summaries)
    assert [Path(s["home"]) for s in summaries] == [tmp_path / ".sparkbatch" / "a", tmp_path / ".sparkbatch" / "b"]
