"""Every answer accounted for: no read that deletes, truncation as an answer's property, the
checkpoint time bound for every shard in flight, downstream reading what was committed.
Fake engine, real Parquet and DuckDB."""

import errno
import json
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance, materialize

from testkit import fake_resource, label_then_metrics, make_rows, make_spec, one_shard
from sparkbatch_dagster import OutputSpec, SamplingSpec, SparkbatchError, build_batch_assets
from sparkbatch_dagster.cli.commands import RANGE_END, RANGE_START, status
from sparkbatch_dagster.cli.locate import instance
from sparkbatch_dagster.cli.preview import label_warnings
from sparkbatch_dagster.definitions.deploy import pool_limit
from sparkbatch_dagster.engines import Engine, EngineResult, FakeEngine
from sparkbatch_dagster.home import JobHome
from sparkbatch_dagster.inputs.shards import build_shards
from sparkbatch_dagster.run import attempts, metrics
from sparkbatch_dagster.run.result_store import ResultStore
from sparkbatch_dagster.run.runner import ShardRun, label_shard
from sparkbatch_dagster.testing import FakeVLLMResource

V = "00000000000000ab"


def _run_all(job, res, inst=None):
    inst = inst or DagsterInstance.get()
    assert materialize(job.assets, selection=[job.keys["input_shards"]], resources=res, instance=inst).success
    keys = inst.get_dynamic_partitions(job.partitions_def.name)
    return label_then_metrics(job.assets, job.keys, res, inst, keys[0], keys[-1])


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


# --- no read ever deletes ------------------------------------------------------------------


def test_a_read_error_fails_status_naming_the_file_and_removes_nothing(tmp_path, monkeypatch):
    job = build_batch_assets(spec=make_spec(tmp_path, n=40, shards=2))
    res, _ = fake_resource()
    labeled, measured = _run_all(job, {"vllm": res})
    assert labeled.success and measured.success
    version = job.output_version(res)
    stats = job.home.stats_path(version, "shard-00001")
    before = _files(job.home.root)
    real_read = Path.read_text

    def flaky(self, *a, **kw):
        if self == stats:  # shared storage away for a moment: an I/O error, not a broken file
            raise OSError(errno.EIO, "Input/output error", str(self))
        return real_read(self, *a, **kw)

    monkeypatch.setattr(Path, "read_text", flaky)
    readers = (lambda: status(job, res), lambda: job.done_partitions(res), job.read_outputs,  # status: the CLI's
               lambda: metrics.committed_stats(job.home, version))
    for read in readers:
        with pytest.raises(SparkbatchError, match=r"cannot read .*shard-00001\.json .*Input/output error"):
            read()
    monkeypatch.setattr(Path, "read_text", real_read)
    assert _files(job.home.root) == before
    assert len(job.done_partitions(res)) == 2


def test_a_broken_commit_is_kept_by_readers_set_aside_by_the_run_and_recomputed_from_the_store(tmp_path):
    job = build_batch_assets(spec=make_spec(tmp_path, n=40, shards=2))
    res, engine = fake_resource()
    assert all(r.success for r in _run_all(job, {"vllm": res}))
    version = job.output_version(res)
    answers = lambda: sorted((r["row_id"], r["output"], r["error"]) for r in job.read_outputs().to_pylist())  # noqa: E731
    before = answers()
    stats = job.home.stats_path(version, "shard-00000")
    stats.write_text("")  # zero bytes, as after a power loss of the disk
    labeled = job.home.labeled_path(version, "shard-00000")
    assert job.done_partitions(res) == ["shard-00001"]  # status: not done...
    assert labeled.exists() and stats.exists()  # ...and nothing removed
    assert job.home.broken(version, "shard-00000").startswith("shard-00000.json")
    res, engine = fake_resource()
    assert all(r.success for r in _run_all(job, {"vllm": res}))
    assert engine.requests_seen == 0  # its answers came from the result store
    aside = sorted(p.name for p in labeled.parent.parent.rglob("*.broken-*"))
    assert [n.split(".broken-")[0] for n in aside] == ["shard-00000.json", "shard-00000.parquet"]
    assert answers() == before


# --- truncation ------------------------------------------------------------------------------


def test_a_label_cut_at_max_tokens_is_an_error_row_and_never_stored(tmp_path):
    labels = ["a very long label", "b"]
    spec, home = one_shard(tmp_path, make_rows(60), output=OutputSpec(kind="label", labels=labels),
                            sampling=SamplingSpec(max_tokens=2))
    stats = label_shard(spec, home, V, "shard-00000", FakeEngine())
    rows = pq.read_table(home.labeled_path(V, "shard-00000")).to_pylist()
    cut = [r for r in rows if r["truncated"]]
    assert cut and all(r["output"] is None and r["error"] == "truncated: hit max_tokens=2; raise "
                       "sampling.max_tokens" and r["finish_reason"] == "length" for r in cut)
    assert all(r["output"] == "b" and r["finish_reason"] == "stop" for r in rows if not r["truncated"]
               and r["error"] is None)
    assert stats["error_reasons"]["truncated"] == len(cut) and stats["truncated_rows"] == len(cut)
    store = ResultStore(spec.result_store_path, spec.answer_context("fake-model"))
    keys = {r["prompt_key"] for r in cut}
    assert not set(store.lookup(sorted(keys)))  # a later run asks the engine again


def test_a_text_cut_at_max_tokens_keeps_its_text_marked_and_counted(tmp_path):
    spec, home = one_shard(tmp_path, make_rows(20), output=OutputSpec(kind="text"),
                            sampling=SamplingSpec(max_tokens=3))
    stats = label_shard(spec, home, V, "shard-00000", FakeEngine(answer="one two three four five"))
    rows = pq.read_table(home.labeled_path(V, "shard-00000")).to_pylist()
    assert {r["output"] for r in rows} == {"one two three"} and all(r["truncated"] for r in rows)
    assert stats["truncated_rows"] == 20 and stats["errors"] == 0
    whole = label_shard(spec, home, "00000000000000ac", "shard-00000", FakeEngine("other-model", answer="one two"))
    assert whole["truncated_rows"] == 0


def test_a_text_that_does_not_match_the_regex_is_a_bad_output_row(tmp_path):
    spec, home = one_shard(tmp_path, make_rows(10), output=OutputSpec(kind="text", regex=r"answer-[0-9]+"))
    assert label_shard(spec, home, V, "shard-00000", FakeEngine())["errors"] == 0  # "answer-N" matches
    label_shard(spec, home, "00000000000000ac", "shard-00000", FakeEngine("other-model", answer="nope"))
    rows = pq.read_table(home.labeled_path("00000000000000ac", "shard-00000")).to_pylist()
    assert all(r["error"] == "bad_output: 'nope' does not match the output regex" for r in rows)


def test_truncation_reaches_the_partitions_metadata_run_metrics_and_the_log(tmp_path):
    spec = make_spec(tmp_path, n=30, shards=2, output=OutputSpec(kind="text"), sampling=SamplingSpec(max_tokens=2))
    job = build_batch_assets(spec=spec)
    res = FakeVLLMResource(answer="one two three")
    labeled, measured = _run_all(job, {"vllm": res})
    assert labeled.success and measured.success
    mats = labeled.asset_materializations_for_node("things__labeled_outputs")
    assert sum(m.metadata["truncated_rows"].value for m in mats) == 30
    logs = [e.user_message for e in DagsterInstance.get().all_logs(labeled.run_id)]
    assert any("30 answers hit max_tokens=2" in m or "answers hit max_tokens=2" in m for m in logs)
    assert any("raise sampling.max_tokens" in m for m in logs)
    with metrics.connect(job.home.metrics_db) as con:
        assert con.execute("SELECT sum(truncated_rows) FROM run_metrics").fetchone()[0] == 30


def test_preview_warns_when_max_tokens_is_below_the_longest_label():
    class Words:  # a tokenizer of one token per character: "billing" is 7 tokens
        def __call__(self, text, add_special_tokens=True):
            return {"input_ids": list(text)}

    spec = make_spec(Path("/nonexistent"), output=OutputSpec(kind="label", labels=["tech", "billing"]),
                     sampling=SamplingSpec(max_tokens=5))
    [line] = label_warnings(spec, Words())
    assert "max_tokens=5 is below the longest label's 7 tokens ('billing')" in line and "to 7" in line
    assert label_warnings(spec.model_copy(update={"sampling": SamplingSpec(max_tokens=7)}), Words()) == []
    assert label_warnings(spec, None) == []  # no tokenizer here: nothing to say


# --- the checkpoint time bound holds for every shard in flight -------------------------------


class _Stalling(Engine):
    """Answers every request of shard 0, and the first half of shard 1 in one burst, then goes
    quiet until released: the slow tail of a shard while another shard's rows wait."""

    def __init__(self) -> None:
        self.model_id = "fake-model"
        self.stalled, self.release = threading.Event(), threading.Event()
        self.answered: dict[str, int] = {"0": 0, "1": 0}

    def generate(self, requests, sampling, output):
        held = []
        for req in requests:
            shard = req.id.split(":")[0]
            if shard == "1" and len(held) < 10:
                held.append(req)
                continue
            self.answered[shard] += 1
            yield EngineResult(req.id, output.labels[0], prompt_tokens=5, output_tokens=1, finish_reason="stop")
        self.stalled.set()
        self.release.wait(300)
        for req in held:
            yield EngineResult(req.id, output.labels[0], prompt_tokens=5, output_tokens=1, finish_reason="stop")


def test_every_shard_in_flight_is_checkpointed_within_checkpoint_seconds(tmp_path):
    rows = [{**r, "text": f"{r['text']} #{r['id']}"} for r in make_rows(80)]
    spec, home = one_shard(tmp_path, rows, checkpoint_rows=10_000, checkpoint_seconds=0.2)
    spec = spec.model_copy(update={"shard_count": 2})
    build_shards(spec, home)
    sizes = {k: pq.read_metadata(home.shard_path(k)).num_rows for k in ("shard-00000", "shard-00001")}
    engine = _Stalling()
    run = ShardRun(spec, home, V, engine)
    worker = threading.Thread(target=run.run, args=(["shard-00000", "shard-00001"],), daemon=True)
    worker.start()
    assert engine.stalled.wait(120)

    def on_disk() -> int:
        return sum(pq.read_metadata(p).num_rows for p in home.parts_dir(V, "shard-00001").glob("part-*.parquet"))

    # The flush timer checkpoints them, though no result comes (due after 0.2 s; a loaded machine
    # runs its thread late, so the test waits for it rather than for a fixed time).
    deadline = time.monotonic() + 120  # only bounds a hang
    while on_disk() < sizes["shard-00001"] - 10 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert home.is_done(V, "shard-00000")
    assert on_disk() == sizes["shard-00001"] - 10  # every finished row, though no result came since
    engine.release.set()
    worker.join(300)
    assert home.is_done(V, "shard-00001")


# --- downstream reads what was committed -----------------------------------------------------


def test_a_failed_run_under_new_settings_leaves_downstream_on_the_committed_version(tmp_path):
    job = build_batch_assets(spec=make_spec(tmp_path, n=40, shards=2))
    res, _ = fake_resource()
    assert all(r.success for r in _run_all(job, {"vllm": res}))
    first = job.current_version()
    rows = job.read_outputs().num_rows
    other = FakeVLLMResource(answer="fruit", fail_after=0)  # another model identity, dead at once
    inst = DagsterInstance.get()
    keys = inst.get_dynamic_partitions(job.partitions_def.name)
    tags = {RANGE_START: keys[0], RANGE_END: keys[-1]}
    labeled = materialize(job.assets, selection=[job.keys["labeled_outputs"]], resources={"vllm": other},
                          instance=inst, tags=tags, raise_on_error=False)
    assert not labeled.success
    assert materialize(job.assets, selection=[job.keys["analytics"]], resources={"vllm": other}, instance=inst).success
    with metrics.connect(job.home.metrics_db) as con:  # analytics is still the committed version's
        assert con.execute("SELECT count(*) FROM labeled").fetchone()[0] == 40
    assert job.current_version() == first and job.read_outputs().num_rows == rows == 40
    assert json.loads(job.home.current_path.read_text())["version"] == first


# --- every attempt billed -------------------------------------------------------------------


def test_a_failed_attempt_is_billed_and_the_rerun_shows_what_it_wasted(tmp_path):
    job = build_batch_assets(spec=make_spec(tmp_path, n=40, shards=2))
    inst = DagsterInstance.get()
    assert materialize(job.assets, selection=[job.keys["input_shards"]], resources={"vllm": FakeVLLMResource()},
                       instance=inst).success
    keys = inst.get_dynamic_partitions(job.partitions_def.name)
    tags = {RANGE_START: keys[0], RANGE_END: keys[-1]}
    dying = FakeVLLMResource(delay_s=0.02, fail_after=5)  # the engine dies before any shard commits
    failed = materialize(job.assets, selection=[job.keys["labeled_outputs"]], resources={"vllm": dying},
                         instance=inst, tags=tags, raise_on_error=False)
    assert not failed.success
    version = job.output_version(dying)
    [first] = attempts.load(job.home, version)
    assert first["outcome"] == "failed" and "fake engine died after 5 requests" in first["error"]
    assert first["run_id"] == failed.run_id and first["prompts_generated"] == 5 and first["rows_committed"] == 0
    assert first["cost_usd"] > 0 and first["wasted_usd"] == first["cost_usd"]  # paid, and nothing to show
    labeled, measured = label_then_metrics(job.assets, job.keys, {"vllm": FakeVLLMResource()}, inst, keys[0], keys[-1])
    assert labeled.success and measured.success
    records = attempts.load(job.home, version)
    assert [r["outcome"] for r in records] == ["failed", "succeeded"]
    assert records[1]["rows_committed"] == 40 and records[1]["partitions_committed"] == 2
    assert records[1]["committed_cost_usd"] <= records[1]["cost_usd"]
    md = measured.asset_materializations_for_node("things__run_metrics")[-1].metadata
    assert md["job_attempts"].value == 2 and md["job_wasted_usd"].value >= first["wasted_usd"]
    with metrics.connect(job.home.metrics_db) as con:
        rows = con.execute("SELECT outcome, rows_committed FROM attempts ORDER BY started").fetchall()
    assert rows == [("failed", 0), ("succeeded", 40)]


def test_an_attempt_still_running_is_not_taken_for_killed(tmp_path):
    home = JobHome(tmp_path / "home")
    with attempts.Attempt(home, V, 0.79) as live:
        [seen] = attempts.load(home, V)
        assert seen["outcome"] == "running" and seen["attempt"] == live.id
    [ended] = attempts.load(home, V)
    assert ended["outcome"] == "succeeded" and ended["ended"]


# --- one engine-starting run at a time ------------------------------------------------------


def test_status_warns_when_the_instance_does_not_limit_the_gpu_pool(tmp_path):
    job = build_batch_assets(spec=make_spec(tmp_path, n=20, shards=2))
    res, _ = fake_resource()
    report = status(job, res)
    assert report["pool_limit"] is None and "`dagster instance concurrency set gpu 1`" in report["warnings"][0]
    DagsterInstance.get().event_log_storage.set_concurrency_slots("gpu", 1)
    report = status(job, res)
    assert report["pool_limit"] == 1 and report["warnings"] == []


def test_the_clis_own_instance_lets_one_engine_starting_run_in_at_a_time(tmp_path, monkeypatch):
    monkeypatch.delenv("DAGSTER_HOME")
    monkeypatch.chdir(tmp_path)
    assert pool_limit(instance(), "gpu") == 1 and (tmp_path / ".dagster_home").is_dir()
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "someone_elses"))  # an instance the user set up: theirs
    (tmp_path / "someone_elses").mkdir()
    assert pool_limit(instance(), "gpu") is None
