"""The typed records of a run (``run/records.py``, ``run/totals.py``): what they hold, that their
dict form is the one files, Parquet and the CLI have always had, and that files written by older
releases still read."""

import json

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkbatch_dagster.engines import FakeEngine
from sparkbatch_dagster.engines.base import EngineResult
from sparkbatch_dagster.errors import SparkbatchError
from sparkbatch_dagster.home import JobHome
from sparkbatch_dagster.inputs.shards import build_shards
from sparkbatch_dagster.run import attempts
from sparkbatch_dagster.run.checkpoint import OUTPUT_SCHEMA, rows_table
from sparkbatch_dagster.run.metrics import prediction_check
from sparkbatch_dagster.run.records import AttemptRecord, OutputRow, ShardStats
from sparkbatch_dagster.run.rows import Answer, row
from sparkbatch_dagster.run.shard_stats import ShardTime, ShardWork, read_stats, shard_stats
from sparkbatch_dagster.run.totals import Prediction, RunSummary
from sparkbatch_dagster.spec import JobSpec, OutputSpec
from sparkbatch_dagster.testing import label_shard
from testkit import make_rows, make_spec, write_parquet

V = "00000000000000aa"
#: A stats file as the first release wrote it (commit 9d9df99): no engine start, no generation
#: cost apart, no reuse, truncation, reasoning, confidence or commit record yet.
FIRST_RELEASE_STATS = {
    "partition": "shard-00000", "version": V, "model": "m", "rows": 10, "labeled": 9, "errors": 1,
    "error_reasons": {"too_long": 1}, "input_tokens": 100, "output_tokens": 20, "wall_s": 2.5, "engine_s": 2.0,
    "tokens_per_hour": 172800, "cost_usd": 0.000549, "prefix_cache_hit_rate": None, "resumed_rows": 0,
    "generated_requests": 9, "deduplicated_rows": 0, "finished_at": "2026-11-29T18:41:38+00:00",
}

#: The keys of a stats file as releases before the typed records wrote them, in their order.
STATS_FILE_KEYS = [
    "partition", "version", "model", "rows", "labeled", "errors", "error_reasons", "input_tokens", "output_tokens",
    "wall_s", "engine_s", "engine_start_s", "tokens_per_hour", "generation_cost_usd", "cost_usd",
    "prefix_cache_hit_rate", "resumed_rows", "generated_requests", "reused_rows", "deduplicated_rows",
    "truncated_rows", "reasoning_tokens", "finished_at", "confidence_histogram", "confidence_mean",
    "input_signature", "attempt", "labeled_sha256", "labeled_bytes",
]


def _table(n: int) -> pa.Table:
    return pa.table({"error": [None] * n, "prompt_tokens": [10] * n, "output_tokens": [2] * n,
                     "cached_tokens": [0] * n, "deduplicated": [False] * n, "reused": [False] * n})


def _stats(**fields) -> ShardStats:
    base = {"partition": "shard-00000", "version": V, "model": "m", "labeled": 300, "errors": 0, "input_tokens": 0,
            "output_tokens": 0}
    return ShardStats.from_json({**base, **fields})


def test_an_output_row_is_the_output_schema_field_for_field():
    assert list(OutputRow.__struct_fields__) == OUTPUT_SCHEMA.names
    res = EngineResult("0:0", "b", prompt_tokens=7, output_tokens=1, cached_tokens=3, finish_reason="stop",
                       confidence=0.75)
    spec = JobSpec(name="j", input="x.parquet", text_columns=["t"], user_template="{{ t }}",
                   output=OutputSpec(kind="label", labels=["a", "b"]))
    answer = Answer.of_engine(res, spec, None, "k1", "fake-model")
    first, dup = row("r1", V, answer), row("r2", V, answer, duplicate=True)
    failed = row("r3", V, Answer.failed("too_long: 9 chars", "m"))
    table = rows_table([first, dup, failed])  # column by column, as the checkpoint writer builds its parts
    got = table.to_pylist()
    assert got == pa.Table.from_pylist([r.to_json() for r in (first, dup, failed)], schema=OUTPUT_SCHEMA).to_pylist()
    assert got[0]["prompt_tokens"] == 7 and got[0]["cached_tokens"] == 3 and got[0]["confidence"] == 0.75
    # Tokens are counted once per generation: the duplicate carries the answer, not its cost.
    assert got[1]["prompt_tokens"] == got[1]["output_tokens"] == 0 and got[1]["deduplicated"]
    assert got[1]["output"] == "b" and got[1]["confidence"] == 0.75 and got[1]["finish_reason"] == "stop"


def test_an_error_row_and_a_reused_row_carry_no_confidence_and_no_cost():
    failed = row("r1", V, Answer.failed("too_long: 9 chars", "m"))
    assert failed.error == "too_long: 9 chars" and failed.prompt_key is None and failed.confidence is None
    stored = row("r2", V, Answer.stored(("b", None, 0.9, None, None, None, False, "stop"), "k", "m"))
    assert stored.reused and stored.model == "m" and stored.confidence == 0.9 and stored.prompt_tokens == 0
    wrong = Answer.stored((None, "bad_output: x", 0.9, "stage-1", None, None, None, None), "k", "m")
    assert row("r3", V, wrong).confidence is None and row("r3", V, wrong).model == "stage-1"


def test_shard_stats_keep_the_engine_start_apart(tmp_path):
    spec = make_spec(tmp_path, hourly_rate_usd=3.6)  # $0.001 a second
    s = shard_stats(spec, ShardWork("shard-00000", "0" * 16, "m", resumed=0, generated=100, fresh_tokens=1200),
                    ShardTime(wall_s=10.0, engine_s=9.0, engine_start_s=4.0), _table(100))
    assert s.wall_s == 6.0 and s.engine_start_s == 4.0
    assert s.generation_cost_usd == pytest.approx(0.006) and s.cost_usd == pytest.approx(0.010)
    assert s.tokens_per_hour == 1200 / 6 * 3600  # generation alone
    plain = shard_stats(spec, ShardWork("shard-00001", "0" * 16, "m", 0, 10, 120), ShardTime(2.0, 2.0), _table(10))
    assert plain.engine_start_s == 0 and plain.cost_usd == plain.generation_cost_usd


def test_the_bill_and_the_check_compare_like_with_like(tmp_path):
    home = JobHome(tmp_path / "home")
    version = "0123456789abcdef"
    stats = [_stats(rows=300, wall_s=40.0, cost_usd=0.05, generation_cost_usd=0.04, engine_start_s=36.0,
                    generated_requests=300),
             _stats(rows=300, wall_s=20.0, cost_usd=0.02, generation_cost_usd=0.02, engine_start_s=0.0,
                    generated_requests=200)]
    bill = prediction_check(home, version, stats)
    assert bill is not None and bill.prediction is None  # no estimate made: the bill alone
    assert bill.to_json() == {"cost_usd": 0.07, "generation_cost_usd": 0.06, "engine_start_s": 36.0,
                              "engine_start_cost_usd": 0.01}
    assert prediction_check(home, version, []) is None
    home.prediction_path(version).parent.mkdir(parents=True)
    home.prediction_path(version).write_text(json.dumps(
        {"predicted_wall_s": 100.0, "predicted_prompts": 1000, "total_rows": 1200}))
    check = prediction_check(home, version, stats)
    # 500 of the 1,000 predicted prompts generated: 50 s predicted for them, 60 s measured.
    assert check is not None and check.prediction is not None
    assert check.prediction.predicted_wall_s == 50.0 and check.prediction.actual_wall_s == 60.0
    assert check.prediction.error_pct == pytest.approx(-16.7)
    older = [_stats(rows=300, wall_s=s.wall_s, cost_usd=s.cost_usd) for s in stats]  # no generated_requests
    old = prediction_check(home, version, older)
    assert old is not None and old.prediction is not None
    assert old.prediction.predicted_wall_s == 50.0  # older stats: scaled by rows, 600 of 1,200
    assert old.generation_cost_usd == old.cost_usd  # and their generation is their whole cost


def _one_shard(tmp_path):
    src = write_parquet(tmp_path / "in" / "rows.parquet", make_rows(20))
    spec = make_spec(tmp_path, input=str(src), shards=1)
    home = JobHome(spec.home_path)
    build_shards(spec, home)
    return spec, home


def test_a_stats_file_reads_back_as_written_key_for_key(tmp_path):
    spec, home = _one_shard(tmp_path)
    stats = label_shard(spec, home, V, "shard-00000", FakeEngine())
    path = home.stats_path(V, "shard-00000")
    text = path.read_text()
    assert read_stats(path) == stats and json.dumps(stats.to_json(), indent=2) == text
    assert list(json.loads(text)) == STATS_FILE_KEYS


def test_a_stats_file_of_the_first_release_still_reads(tmp_path):
    path = tmp_path / "shard-00000.json"
    path.write_text(json.dumps(FIRST_RELEASE_STATS, indent=2))
    old = read_stats(path)
    assert old.rows == 10 and old.cost_usd == 0.000549 and old.engine_start_s == 0.0 and old.truncated_rows == 0
    assert old.generation_cost_usd is None and old.generation_usd == old.cost_usd
    assert old.confidence_histogram is None and old.labeled_sha256 is None
    assert "labeled_sha256" not in old.to_json() and "attempt" not in old.to_json()


def test_a_stats_file_that_is_not_stats_is_one_error_naming_the_file_and_field(tmp_path):
    path = tmp_path / "shard-00000.json"
    path.write_text(json.dumps({**FIRST_RELEASE_STATS, "rows": "many"}))
    with pytest.raises(SparkbatchError, match=r"shard-00000\.json is not a shard's stats file.*\$\.rows"):
        read_stats(path)


def test_an_attempt_file_of_an_older_release_still_loads(tmp_path):
    home = JobHome(tmp_path / "home")
    folder = attempts.folder(home, V)
    folder.mkdir(parents=True)
    first = {"attempt": "20261201T095518-0123abcd", "version": V, "run_id": None, "pid": 1,
             "started": "2026-12-01T09:55:18.000+00:00", "ended": "2026-12-01T09:56:18.000+00:00",
             "outcome": "succeeded", "error": None, "wall_s": 60.0, "engine_start_s": 10.0, "generation_s": 50.0,
             "prompts_generated": 5, "rows_committed": 5, "partitions_committed": 1, "cost_usd": 0.02,
             "committed_cost_usd": 0.015, "wasted_usd": 0.005}  # no engine_starts, box or heartbeat yet
    (folder / f"{first['attempt']}.json").write_text(json.dumps(first))
    (folder / "foreign.json").write_text(json.dumps({"attempt": "x"}))  # not an attempt: left out
    [record] = attempts.load(home, V)
    assert record.outcome == "succeeded" and record.engine_starts == 0 and record.box is None
    assert attempts.bill([record]).to_json() == {"attempts": 1, "attempts_cost_usd": 0.02, "wasted_usd": 0.005}


def test_an_attempt_record_is_written_as_it_reads(tmp_path):
    home = JobHome(tmp_path / "home")
    with attempts.Attempt(home, V, 3.6) as live:
        live.committed(_stats(rows=4, wall_s=1.0, cost_usd=0.0))
    written = json.loads(live.path.read_text())
    assert AttemptRecord.from_json(written).to_json() == written
    assert written["outcome"] == "succeeded" and written["rows_committed"] == 4 and "timings_s" not in written
    assert list(written)[:5] == ["attempt", "version", "run_id", "pid", "started"]
    with pytest.raises(msgspec.ValidationError, match="wall_s"):
        AttemptRecord.from_json({**written, "wall_s": "long"})


def _summary(**fields) -> RunSummary:
    base = dict(job="j", partitions_total=2, partitions_done=2, partitions_run=1, rows=10, labeled=9, errors=1,
                input_tokens=100, output_tokens=20, wall_s=2.5, tokens_per_hour=172800, cost_usd=0.1,
                generation_cost_usd=0.05, engine_start_s=50.0, engine_start_cost_usd=0.05, accuracy=None,
                generated=9, reused=0, attempts=1, attempts_cost_usd=0.1, wasted_usd=0.0, engine_starts=1,
                version=V, home="/h", success=True)
    return RunSummary(**{**base, **fields})


def test_the_run_summary_prints_the_line_it_always_printed():
    keys = ["job", "partitions_total", "partitions_done", "partitions_run", "rows", "labeled", "errors",
            "input_tokens", "output_tokens", "wall_s", "tokens_per_hour", "cost_usd", "generation_cost_usd",
            "engine_start_s", "engine_start_cost_usd", "accuracy", "generated", "reused"]
    bill = ["attempts", "attempts_cost_usd", "wasted_usd", "engine_starts", "version", "home", "success"]
    assert list(_summary().to_json()) == keys + bill  # no estimate, no timings: neither key
    line = _summary(prediction=Prediction(81.4, 80.3, None), timings_s={"startup": 1.2}).to_json()
    assert list(line) == keys + ["predicted_wall_s", "prediction_error_pct"] + bill + ["timings_s"]
    assert line["prediction_error_pct"] is None and line["timings_s"] == {"startup": 1.2}
    assert json.loads(json.dumps(line)) == line
    cal = {"m@1": {"method": "platt", "rows": 80, "ece_before": 0.2, "ece_after": 0.05, "brier_before": 0.3,
                   "brier_after": 0.2}}
    reviewed = _summary(review_rows=7, review_threshold=0.31, calibration=cal).to_json()
    assert list(reviewed) == keys + bill + ["review_rows", "review_threshold", "calibration"]
    assert json.loads(json.dumps(reviewed)) == reviewed


def test_labeled_files_hold_the_rows_the_records_made(tmp_path):
    spec, home = _one_shard(tmp_path)
    label_shard(spec, home, V, "shard-00000", FakeEngine())
    table = pq.read_table(home.labeled_path(V, "shard-00000"))
    assert table.schema.names == OUTPUT_SCHEMA.names
    assert [OutputRow(**r) for r in table.to_pylist()][0].fingerprint == V
