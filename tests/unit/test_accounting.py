"""Every answer accounted for: no read that deletes, truncation as an answer's property, the
checkpoint time bound for every shard in flight, downstream reading what was committed.
Fake engine, real Parquet and DuckDB."""

import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
from dagster import DagsterInstance

from sparkbatch_dagster import OutputSpec, SamplingSpec, build_batch_assets
from sparkbatch_dagster.cli.commands import status
from sparkbatch_dagster.cli.locate import instance
from sparkbatch_dagster.cli.preview import label_warnings
from sparkbatch_dagster.definitions.deploy import pool_limit
from sparkbatch_dagster.engines import Engine, EngineResult, FakeEngine
from sparkbatch_dagster.home import JobHome
from sparkbatch_dagster.inputs.shards import build_shards
from sparkbatch_dagster.run import attempts
from sparkbatch_dagster.run.result_store import ResultStore
from sparkbatch_dagster.run.runner import ShardRun
from sparkbatch_dagster.testing import label_shard
from testkit import fake_resource, make_rows, make_spec, one_shard

V = "00000000000000ab"


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
    assert stats.error_reasons["truncated"] == len(cut) and stats.truncated_rows == len(cut)
    store = ResultStore(spec.result_store_path, spec.answer_context("fake-model"))
    keys = {r["prompt_key"] for r in cut}
    assert not set(store.lookup(sorted(keys)))  # a later run asks the engine again


def test_a_text_cut_at_max_tokens_keeps_its_text_marked_and_counted(tmp_path):
    spec, home = one_shard(tmp_path, make_rows(20), output=OutputSpec(kind="text"),
                            sampling=SamplingSpec(max_tokens=3))
    stats = label_shard(spec, home, V, "shard-00000", FakeEngine(answer="one two three four five"))
    rows = pq.read_table(home.labeled_path(V, "shard-00000")).to_pylist()
    assert {r["output"] for r in rows} == {"one two three"} and all(r["truncated"] for r in rows)
    assert stats.truncated_rows == 20 and stats.errors == 0
    whole = label_shard(spec, home, "00000000000000ac", "shard-00000", FakeEngine("other-model", answer="one two"))
    assert whole.truncated_rows == 0


def test_a_text_that_does_not_match_the_regex_is_a_bad_output_row(tmp_path):
    spec, home = one_shard(tmp_path, make_rows(10), output=OutputSpec(kind="text", regex=r"answer-[0-9]+"))
    assert label_shard(spec, home, V, "shard-00000", FakeEngine()).errors == 0  # "answer-N" matches
    label_shard(spec, home, "00000000000000ac", "shard-00000", FakeEngine("other-model", answer="nope"))
    rows = pq.read_table(home.labeled_path("00000000000000ac", "shard-00000")).to_pylist()
    assert all(r["error"] == "bad_output: 'nope' does not match the output regex" for r in rows)


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


def test_an_attempt_still_running_is_not_taken_for_killed(tmp_path):
    home = JobHome(tmp_path / "home")
    with attempts.Attempt(home, V, 0.79) as live:
        [seen] = attempts.load(home, V)
        assert seen.outcome == "running" and seen.attempt == live.id
    [ended] = attempts.load(home, V)
    assert ended.outcome == "succeeded" and ended.ended


# --- one engine-starting run at a time ------------------------------------------------------


def test_status_warns_when_the_instance_does_not_limit_the_gpu_pool(tmp_path):
    job = build_batch_assets(spec=make_spec(tmp_path, n=20, shards=2))
    res, _ = fake_resource()
    report = status(job, res)
    assert report.pool_limit is None and "`dagster instance concurrency set gpu 1`" in report.warnings[0]
    DagsterInstance.get().event_log_storage.set_concurrency_slots("gpu", 1)
    report = status(job, res)
    assert report.pool_limit == 1 and report.warnings == []


def test_the_clis_own_instance_lets_one_engine_starting_run_in_at_a_time(tmp_path, monkeypatch):
    monkeypatch.delenv("DAGSTER_HOME")
    monkeypatch.chdir(tmp_path)
    assert pool_limit(instance(), "gpu") == 1 and (tmp_path / ".dagster_home").is_dir()
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "someone_elses"))  # an instance the user set up: theirs
    (tmp_path / "someone_elses").mkdir()
    assert pool_limit(instance(), "gpu") is None
