"""label_shard with the fake engine: the row contract, dedup, resume after a crash."""


import pyarrow.parquet as pq
import pytest

from sparkbatch_dagster import EngineError, OutputSpec
from sparkbatch_dagster.engines import FakeEngine
from sparkbatch_dagster.home import JobHome
from sparkbatch_dagster.inputs.shards import build_shards
from sparkbatch_dagster.run.records import ProgressReport, ShardStats
from sparkbatch_dagster.run.rows import parse_output
from sparkbatch_dagster.testing import label_shard
from testkit import make_rows, make_spec, write_parquet

V = "0123456789abcdef"


def _one_shard(tmp_path, rows, **kw):
    src = write_parquet(tmp_path / "in" / "rows.parquet", rows)
    spec = make_spec(tmp_path, input=str(src), shards=1, **kw)
    home = JobHome(spec.home_path)
    build_shards(spec, home)
    return spec, home


def test_every_row_once_and_duplicates_generated_once(tmp_path):
    rows = make_rows(70)
    spec, home = _one_shard(tmp_path, rows)
    engine = FakeEngine()
    stats = label_shard(spec, home, V, "shard-00000", engine)
    out = pq.read_table(home.labeled_path(V, "shard-00000")).to_pylist()
    assert sorted(r["row_id"] for r in out) == sorted(r["id"] for r in rows)
    unique_texts = len({r["text"] for r in rows})
    assert engine.requests_seen == unique_texts < 70
    assert stats.deduplicated_rows == 70 - unique_texts
    assert all(r["output"] in spec.output.labels for r in out)
    assert {r["fingerprint"] for r in out} == {V} and {r["model"] for r in out} == {"fake-model"}
    by_id = {r["row_id"]: r for r in out}
    assert by_id["id-00000"]["output"] == by_id["id-00063"]["output"]  # both "A apple."


def test_bad_rows_become_error_rows_and_the_rest_completes(tmp_path):
    rows = make_rows(30)
    rows[0]["text"], rows[1]["text"], rows[2]["text"] = None, "", "x" * 50_000
    rows[3]["text"], rows[4]["text"] = "ctrl \x07 char", "{{ 7*7 }} {% raw %}"
    spec, home = _one_shard(tmp_path, rows)
    stats = label_shard(spec, home, V, "shard-00000", FakeEngine())
    out = {r["row_id"]: r for r in pq.read_table(home.labeled_path(V, "shard-00000")).to_pylist()}
    assert [out[f"id-0000{i}"]["error"].split(":")[0] for i in range(4)] == [
        "null_text", "empty_text", "too_long", "invalid_text"]
    assert out["id-00004"]["error"] is None  # template syntax in data is just text
    assert stats.errors == 4 and stats.labeled == 26
    assert stats.error_reasons == {"null_text": 1, "empty_text": 1, "too_long": 1, "invalid_text": 1}


def test_unparseable_output_is_an_error_row(tmp_path):
    spec, home = _one_shard(tmp_path, make_rows(10))
    label_shard(spec, home, V, "shard-00000", FakeEngine(answer="banana split"))
    out = pq.read_table(home.labeled_path(V, "shard-00000")).to_pylist()
    assert all(r["error"].startswith("bad_output") for r in out)


def test_json_outputs_parse_or_fail():
    from sparkbatch_dagster import JobSpec

    js = JobSpec(name="j", input="x.parquet", text_columns=["t"], user_template="{{ t }}",
                 output=OutputSpec(kind="json", json_schema={"type": "object", "properties": {"a": {}}}))
    assert parse_output('{"a": 1}', js) == ('{"a": 1}', None)
    assert parse_output("[1]", js)[1].startswith("bad_output: expected a JSON object")
    assert parse_output("{nope", js)[1].startswith("bad_output: not valid JSON")


def test_engine_crash_keeps_finished_rows_and_resume_sends_only_the_rest(tmp_path):
    rows = make_rows(100)
    spec, home = _one_shard(tmp_path, rows)
    with pytest.raises(EngineError):
        label_shard(spec, home, V, "shard-00000", FakeEngine(fail_after=40))
    parts = list(home.parts_dir(V, "shard-00000").glob("part-*.parquet"))
    kept = sum(pq.read_metadata(p).num_rows for p in parts)
    assert kept >= 40 - spec.checkpoint_rows  # at most one checkpoint interval lost
    resumed = FakeEngine()
    stats = label_shard(spec, home, V, "shard-00000", resumed)
    unique = len({r["text"] for r in rows})
    assert resumed.requests_seen <= unique - 30  # the finished prompts were not sent again
    assert stats.resumed_rows == kept and stats.rows == 100
    out = pq.read_table(home.labeled_path(V, "shard-00000")).column("row_id").to_pylist()
    assert sorted(out) == sorted(r["id"] for r in rows)


def _progress_reports(tmp_path, monkeypatch, **settings) -> list[ProgressReport]:
    """60 rows, a report every 0.1 s; ``settings``: the run's Pace attributes. The runner's clock is
    the engine's answers, 1/16 s each: which report quotes what never depends on the machine's
    speed (a loaded one would stretch the real seconds between two answers)."""
    import time
    import types

    from sparkbatch_dagster.run import pace, runner
    from sparkbatch_dagster.run.runner import ShardRun

    spec, home = _one_shard(tmp_path, make_rows(60))
    engine = FakeEngine()
    clock = types.ModuleType("time")
    clock.__dict__.update(vars(time))
    clock.perf_counter = lambda: engine.requests_seen / 16  # binary fractions: exact sums
    monkeypatch.setattr(runner, "time", clock)
    monkeypatch.setattr(pace, "time", clock)
    reports: list[ProgressReport] = []
    run = ShardRun(spec, home, V, engine, progress=reports.append, progress_every_s=0.1)
    for name, value in settings.items():
        assert hasattr(run.pace, name)
        setattr(run.pace, name, value)
    run.run(["shard-00000"])
    return reports


def test_progress_reports_rows_tokens_and_eta(tmp_path, monkeypatch):
    reports = _progress_reports(tmp_path, monkeypatch, window_s=0.3)
    done = [r.rows_done for r in reports]
    assert len(reports) >= 3 and done == sorted(done)
    assert reports[-1].rows_done == reports[-1].rows_total == 60 and reports[-1].eta_s == 0
    first = reports[0]
    assert 0 < first.rows_done < 60 and first.tokens_per_s > 0
    assert first.eta_s is None  # no ETA from a rate measured over a fraction of a second
    assert any(r.eta_s and r.rows_done < 60 for r in reports)  # then one from the run's own rate
    assert first.partition == "shard-00000" and first.partition_rows_total == 60
    assert 0 < first.partition_rows_done == first.rows_done


def test_progress_quotes_the_estimates_rate_before_its_own(tmp_path, monkeypatch):
    reports = _progress_reports(tmp_path, monkeypatch, expected_rows_per_s=6.0)
    first = reports[0]
    assert first.eta_s == round((60 - first.rows_done) / 6.0, 1)


def test_stream_yields_each_shard_as_it_commits(tmp_path):
    from sparkbatch_dagster.run.runner import ShardRun

    spec = make_spec(tmp_path, n=60, shards=3)
    home = JobHome(spec.home_path)
    keys = build_shards(spec, home)["keys"]
    run = ShardRun(spec, home, V, FakeEngine(delay_s=0.01))
    seen = []
    for stats in run.stream(keys):
        seen.append(stats.partition)
        assert home.is_done(V, stats.partition)  # committed before the caller hears of it
        assert not any(home.is_done(V, k) for k in keys if k not in seen)  # and the others not yet
    assert sorted(seen) == sorted(keys)


def test_relay_logs_at_a_steady_interval_and_feeds_listeners(monkeypatch):
    from sparkbatch_dagster.run import progress

    clock = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    logged: list[str] = []
    heard: list[ProgressReport] = []
    relay = progress.Relay(logged.append, log_every_s=10.0)
    with progress.listening(heard.append):
        for i in range(1, 31):  # a report a second for 30 s
            clock[0] = float(i)
            relay(ProgressReport(partition="shard-00000", rows_done=i, rows_total=40, tokens_per_s=5.0, eta_s=1.0))
    relay(ProgressReport(partition="shard-00000", rows_done=40, rows_total=40, tokens_per_s=5.0, eta_s=0.0))
    assert len(heard) == 30  # every report while listening, none after
    assert [x.split()[1] for x in logged] == ["10", "20", "30", "40"]  # every 10 s, and the last
    assert logged[-1] == "labeled 40 of 40 rows (100%); shard-00000; 5 tokens/s; ETA 0:00"


def test_bar_redraws_in_place_on_a_terminal():
    import io

    from sparkbatch_dagster.run.progress import Bar

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    bar = Bar(out)
    bar(ProgressReport(partition="shard-00001", rows_done=50, rows_total=200, tokens_per_s=1234.0, eta_s=75.0))
    bar(ProgressReport(partition="shard-00001", rows_done=200, rows_total=200, tokens_per_s=1300.0, eta_s=0.0))
    frames = out.getvalue().split("\r")[1:]
    assert frames[0].startswith("[#######.") and "50/200 rows" in frames[0] and "1,234 tok/s" in frames[0]
    assert "ETA 1:15" in frames[0] and frames[1].endswith("200/200 rows  1,300 tok/s  ETA 0:00  shard-00001\n")


def test_a_metrics_table_from_an_older_release_gains_the_new_columns(tmp_path):
    import duckdb

    from sparkbatch_dagster.run import metrics

    home = JobHome(tmp_path / "job")
    home.metrics_db.parent.mkdir(parents=True, exist_ok=True)
    with duckdb.connect(str(home.metrics_db)) as con:  # the table as an older release made it
        con.execute("CREATE TABLE run_metrics (partition VARCHAR, version VARCHAR, rows BIGINT, "
                    "PRIMARY KEY (partition, version))")
        con.execute("INSERT INTO run_metrics VALUES ('old', 'v0', 7)")
    for rows in (3, 4):
        metrics.record(home, [ShardStats(partition="shard-00000", version="v1", model="m", rows=rows, labeled=rows,
                                         errors=0, input_tokens=0, output_tokens=0, wall_s=1.0, cost_usd=0.5)])
    with duckdb.connect(str(home.metrics_db)) as con:
        cols = [r[0] for r in con.execute("DESCRIBE run_metrics").fetchall()]
        got = con.execute("SELECT partition, rows, cost_usd FROM run_metrics ORDER BY partition").fetchall()
    assert set(cols) == {c for c, _ in metrics.METRIC_COLUMNS}
    assert got == [("old", 7, None), ("shard-00000", 4, 0.5)]
