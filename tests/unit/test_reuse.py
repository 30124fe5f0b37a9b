"""Pay once per answer: the result store, content signatures, pending rows, one home per job,
broken files recomputed. Fake engine (it counts the prompts it receives), real Parquet and DuckDB."""

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sparkbatch_dagster import SparkbatchError
from sparkbatch_dagster.engines import FakeEngine
from sparkbatch_dagster.errors import PendingRowsError
from sparkbatch_dagster.home import JobHome
from sparkbatch_dagster.inputs.shards import build_shards
from sparkbatch_dagster.run.result_store import ResultStore
from sparkbatch_dagster.run.rows import read_shard
from sparkbatch_dagster.testing import label_shard
from testkit import make_rows, make_spec, write_parquet


def _unique_rows(n: int, start: int = 0) -> list[dict]:
    """Rows with distinct texts: one prompt each, so prompts received == rows to generate."""
    rows = make_rows(n + start)[start:]
    for r in rows:
        r["text"] = f"{r['text']} (#{r['id']})"
    return rows


def test_transient_failures_leave_rows_pending_and_the_rerun_sends_exactly_those(tmp_path):
    src = write_parquet(tmp_path / "in" / "rows.parquet", _unique_rows(50))
    spec = make_spec(tmp_path, input=str(src), shards=1)
    home = JobHome(spec.home_path)
    build_shards(spec, home)
    v = "00000000000000ee"
    with pytest.raises(PendingRowsError, match=r"7 rows in \['shard-00000'\] got only transient failures"):
        label_shard(spec, home, v, "shard-00000", FakeEngine(transient_first=7))
    assert not home.is_done(v, "shard-00000")  # nothing committed
    parts = pq.read_table(home.parts_dir(v, "shard-00000")).to_pylist()
    assert len(parts) == 43 and not any(r["error"] for r in parts)  # no error row for a transient failure
    again = FakeEngine()
    stats = label_shard(spec, home, v, "shard-00000", again)
    assert again.requests_seen == 7 and stats.rows == 50 and stats.errors == 0


def test_reading_a_shard_that_was_resharded_since_planning_stops(tmp_path):
    spec = make_spec(tmp_path, n=40, shards=2)
    home = JobHome(spec.home_path)
    planned = build_shards(spec, home)["signature"]
    assert len(read_shard(home, "shard-00000", planned)) > 0
    write_parquet(Path(spec.input), make_rows(41))
    build_shards(spec, home)
    with pytest.raises(SparkbatchError, match="sharded again while this run was labeling"):
        read_shard(home, "shard-00000", planned)


def test_the_store_stays_a_few_files_and_finds_every_answer(tmp_path, monkeypatch):
    import sparkbatch_dagster.run.result_store as results

    monkeypatch.setattr(results, "FAN_IN", 4)
    store = ResultStore(tmp_path / "store", "0123456789abcdef")
    keys = []
    for seg in range(21):
        rows = [{"prompt_key": results.prompt_key("s", f"u{seg}-{i}"), "output": f"o{seg}-{i}", "error": None,
                 "prompt_tokens": 3, "output_tokens": 1, "model": "m"} for i in range(10)]
        keys += [r["prompt_key"] for r in rows]
        store.add(rows)
    # 21 segments of 10 answers, merged 4 at a time: 1 at level 2, 1 at level 1, 1 at level 0.
    assert sorted(p.name[:6] for p in store.segments()) == ["seg-L0", "seg-L1", "seg-L2"]
    found = store.lookup([*keys, results.prompt_key("s", "never")])
    assert len(found) == 210 and found[keys[0]] == ("o0-0", None, None, "m", None, None, False, None)
    assert found[keys[-1]] == ("o20-9", None, None, "m", None, None, False, None)
