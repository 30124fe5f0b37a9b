"""Row ids: a generated id (a duplicate's, a null id's, an unreadable line's) never equals a real
one, every id is the same however often the same input is sharded, and a JSONL id keeps the text
it has in the file whatever the other rows' ids are."""

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sparkbatch_dagster import OutputSpec
from sparkbatch_dagster.definitions.events import exactly_once
from sparkbatch_dagster.engines import FakeEngine
from sparkbatch_dagster.home import JobHome
from sparkbatch_dagster.inputs.shards import build_shards
from sparkbatch_dagster.testing import label_shard
from testkit import make_spec, write_parquet

V = "0123456789abcdef"
TEXT = dict(output=OutputSpec(kind="text"), gold_column=None)  # a distinct answer per distinct text


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / "src" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _shard(tmp_path: Path, src: Path, shards: int = 1, **kw) -> dict[str, dict]:
    """The sharded rows by row id (each id once: asserted)."""
    spec = make_spec(tmp_path, input=str(src), shards=shards, **{**TEXT, **kw})
    home = JobHome(spec.home_path)
    manifest = build_shards(spec, home)
    rows = [r for k in manifest["keys"] for r in pq.read_table(home.shard_path(k)).to_pylist()]
    got = {r["row_id"]: r for r in rows}
    assert len(got) == len(rows) == manifest["rows"], sorted(r["row_id"] for r in rows)
    return got


def _label(tmp_path: Path, src: Path, **kw) -> tuple[dict[str, dict], dict[str, dict]]:
    """One shard, labeled with the fake engine: (output rows, shard rows) by row id, after the
    every-row-exactly-once check has passed."""
    spec = make_spec(tmp_path, input=str(src), shards=1, **{**TEXT, **kw})
    home = JobHome(spec.home_path)
    build_shards(spec, home)
    label_shard(spec, home, V, "shard-00000", FakeEngine())
    passed, counts = exactly_once(home, V, "shard-00000")
    assert passed, counts
    out = pq.read_table(home.labeled_path(V, "shard-00000")).to_pylist()
    shard = pq.read_table(home.shard_path("shard-00000")).to_pylist()
    return {r["row_id"]: r for r in out}, {r["row_id"]: r for r in shard}


def _answers(tmp_path: Path, texts: list[str]) -> dict[str, str]:
    """What the fake engine answers for each text, from a clean input (distinct ids, no collision)."""
    src = write_parquet(tmp_path / "clean" / "rows.parquet", [{"id": f"c{i}", "text": t} for i, t in enumerate(texts)])
    out, shard = _label(tmp_path / "clean", src)
    return {shard[rid]["text"]: r["output"] for rid, r in out.items()}


def test_a_real_id_that_looks_like_a_duplicates_id_keeps_its_own_row(tmp_path):
    rows = [{"id": "a", "text": "first a"}, {"id": "a", "text": "second a"}, {"id": "a#dup2", "text": "real"},
            {"id": "a", "text": "third a"}, {"id": "a#dup3~", "text": "real too"}]
    out, shard = _label(tmp_path, write_parquet(tmp_path / "in" / "ids.parquet", rows))
    answers = _answers(tmp_path, [r["text"] for r in rows])
    assert len(out) == 5
    for real in ("a", "a#dup2", "a#dup3~"):  # each real row: its own text, its own answer
        text = next(r["text"] for r in rows if r["id"] == real)
        assert shard[real]["text"] == text and out[real]["error"] is None and out[real]["output"] == answers[text]
    dups = {rid: r for rid, r in out.items() if r["error"]}
    assert {shard[rid]["text"] for rid in dups} == {"second a", "third a"}
    assert all(r["error"].startswith("duplicate_id: id a already used") for r in dups.values())


def test_null_ids_never_take_a_real_null_id_name(tmp_path):
    rows = [{"id": None, "text": "n1"}, {"id": "null-id-1", "text": "real 1"}, {"id": None, "text": "n3"},
            {"id": "null-id-3", "text": "real 3"}, {"id": "null-id-3~", "text": "real 3~"}]
    out, shard = _label(tmp_path, write_parquet(tmp_path / "in" / "ids.parquet", rows))
    answers = _answers(tmp_path, [r["text"] for r in rows])
    assert len(out) == 5
    for real in ("null-id-1", "null-id-3", "null-id-3~"):
        text = next(r["text"] for r in rows if r["id"] == real)
        assert shard[real]["text"] == text and out[real]["output"] == answers[text] and out[real]["error"] is None
    nulls = {shard[rid]["text"]: r["error"] for rid, r in out.items() if r["error"]}
    assert nulls == {"n1": "null_id: id column is null", "n3": "null_id: id column is null"}


def test_an_unreadable_lines_id_never_takes_a_real_id(tmp_path):
    data = (b"id,text\nunparsable-line-3,A apple.\nragged,row,here\nunparsable-line-3~,A car.\n"
            b"x,\"never closed\n")
    out, shard = _label(tmp_path, _write(tmp_path, "rows.csv", data))
    assert shard["unparsable-line-3"]["text"] == "A apple." and out["unparsable-line-3"]["error"] is None
    assert shard["unparsable-line-3~"]["text"] == "A car." and out["unparsable-line-3~"]["error"] is None
    errors = {rid: r["error"] for rid, r in out.items() if r["error"]}
    assert len(errors) == 2 and {e.split(":")[1].strip() for e in errors.values()} == {"line 3", "line 5"}


COLLIDING = [{"id": "a", "text": "t1"}, {"id": "a", "text": "t2"}, {"id": "a#dup2", "text": "t3"},
             {"id": None, "text": "t4"}, {"id": "null-id-4", "text": "t5"}, {"id": "b", "text": "t6"}]


def _colliding_file(tmp_path: Path, fmt: str) -> Path:
    if fmt == "parquet":
        return write_parquet(tmp_path / "src" / "rows.parquet", COLLIDING)
    if fmt == "csv":
        return _write(tmp_path, "rows.csv", b"id,text\n" + b"".join(
            f"{r['id'] or ''},{r['text']}\n".encode() for r in COLLIDING) + b"bad,\"open\n")
    return _write(tmp_path, "rows.jsonl", b"".join(json.dumps(r).encode() + b"\n" for r in COLLIDING))


@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl"])
def test_the_same_input_sharded_again_gets_the_same_ids(tmp_path, fmt):
    src = _colliding_file(tmp_path, fmt)
    first = {rid: r["text"] for rid, r in _shard(tmp_path / "one", src, shards=3).items()}
    again = {rid: r["text"] for rid, r in _shard(tmp_path / "two", src, shards=3).items()}
    other = {rid: r["text"] for rid, r in _shard(tmp_path / "three", src, shards=5).items()}
    assert first == again == other
    assert first["a"] == "t1" and first["a#dup2"] == "t3" and first["null-id-4"] == "t5"
    assert len(first) == len(COLLIDING) + (fmt == "csv")


# --- JSONL ids: the id's own text, never through DOUBLE, never with its JSON quotes ------------

BROKEN = b'{"id": "zz", "text": "broken\n'  # a line DuckDB cannot read: the line-by-line path


def _jsonl(tmp_path: Path, lines: list[str], slow: bool) -> dict[str, dict]:
    data = "".join(line + "\n" for line in lines).encode() + (BROKEN if slow else b"")
    got = _shard(tmp_path / ("slow" if slow else "fast"), _write(tmp_path / ("slow" if slow else "fast"),
                                                                  "rows.jsonl", data))
    if slow:
        assert got.pop(f"unparsable-line-{len(lines) + 1}")["_input_error"].startswith("unparsable_row: line")
    return got


@pytest.mark.parametrize("slow", [False, True])
def test_jsonl_integer_and_float_ids_keep_their_text(tmp_path, slow):
    got = _jsonl(tmp_path, ['{"id": 1, "text": "a"}', '{"id": 2.5, "text": "b"}', '{"id": 1.0, "text": "c"}',
                            '{"id": -7, "text": "d"}'], slow)
    assert {rid: r["text"] for rid, r in got.items()} == {"1": "a", "2.5": "b", "1.0": "c", "-7": "d"}
    assert all(r["_input_error"] is None for r in got.values())


@pytest.mark.parametrize("slow", [False, True])
def test_jsonl_big_integer_ids_never_collide_through_double(tmp_path, slow):
    got = _jsonl(tmp_path, ['{"id": 9007199254740993, "text": "a"}', '{"id": 9007199254740992, "text": "b"}',
                            '{"id": 0.5, "text": "c"}', '{"id": 123456789012345678901234567890, "text": "d"}'], slow)
    assert {rid: r["text"] for rid, r in got.items()} == {
        "9007199254740993": "a", "9007199254740992": "b", "0.5": "c", "123456789012345678901234567890": "d"}
    assert all(r["_input_error"] is None for r in got.values())


@pytest.mark.parametrize("slow", [False, True])
def test_jsonl_string_ids_keep_no_quotes_beside_other_json_types(tmp_path, slow):
    got = _jsonl(tmp_path, ['{"id": "b", "text": "a"}', '{"id": [1, 2], "text": "b"}', '{"id": "c\\"q", "text": "c"}',
                            '{"id": true, "text": "d"}', '{"id": 3, "text": "e"}'], slow)
    assert {rid: r["text"] for rid, r in got.items()} == {"b": "a", "[1,2]": "b", 'c"q': "c", "true": "d", "3": "e"}


def test_jsonl_a_float_id_after_the_type_sample_is_not_rounded(tmp_path):
    # DuckDB types the column from its first ~20k lines (all integers: BIGINT) and would round a
    # later 2.5 to 2, a duplicate of the real id 2.
    lines = [json.dumps({"id": i, "text": f"t{i}"}) for i in range(25_000)] + ['{"id": 2.5, "text": "late"}']
    got = _jsonl(tmp_path, lines, slow=False)
    assert got["2.5"]["text"] == "late" and got["2"]["text"] == "t2"
    assert all(r["_input_error"] is None for r in got.values())


def test_jsonl_number_ids_beside_keys_that_differ_only_in_case(tmp_path):
    # DuckDB names the second of 'Note'/'note' 'note_1'; reading the id as text must not lose a row's text.
    got = _jsonl(tmp_path, ['{"id": 1, "Note": 1, "text": "a"}', '{"id": 2.5, "note": 2, "text": "b"}',
                            '{"id": 3, "text": "c", "NOTE": 3}'], slow=False)
    assert {rid: r["text"] for rid, r in got.items()} == {"1": "a", "2.5": "b", "3": "c"}
