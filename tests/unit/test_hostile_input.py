"""Hostile input, built byte by byte: bad bytes, broken lines, ragged rows and stray quotes are
a row's problem (one error row with its reason and line), never the job's; a file that cannot
be read at all stops before the engine with one clear line."""

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkbatch_dagster import InputError
from sparkbatch_dagster.engines import FakeEngine
from sparkbatch_dagster.home import JobHome
from sparkbatch_dagster.inputs import delimiter_hint
from sparkbatch_dagster.inputs.shards import build_shards
from sparkbatch_dagster.testing import label_shard
from testkit import LABELS, WORDS, make_spec

V = "0123456789abcdef"


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / "src" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _run(tmp_path: Path, src: Path, extra: dict | None = None, **kw):
    """Shard (one shard) and label with the fake engine: (manifest, labeled rows, shard rows) by row id."""
    spec = make_spec(tmp_path, input=str(src), shards=1, **kw, **(extra or {}))
    home = JobHome(spec.home_path)
    manifest = build_shards(spec, home)
    stats = label_shard(spec, home, V, "shard-00000", FakeEngine())
    out = {r["row_id"]: r for r in pq.read_table(home.labeled_path(V, "shard-00000")).to_pylist()}
    shard = {r["row_id"]: r for r in pq.read_table(home.shard_path("shard-00000")).to_pylist()}
    assert len(out) == len(shard) == manifest["rows"] == stats.rows
    return manifest, out, shard


def _errors(out: dict) -> dict[str, str]:
    return {rid: r["error"] for rid, r in out.items() if r["error"]}


def _assert_rest_labeled(out: dict, bad: set[str]) -> None:
    for rid, r in out.items():
        if rid not in bad:
            assert r["error"] is None and r["output"] in LABELS, (rid, r)


def _text(i: int) -> bytes:
    label = LABELS[i % 3]
    return f"Item {i}: a {WORDS[label][i % 3]}".encode()


def _csv_75(bad_lines: dict[int, bytes], with_id: bool = True) -> bytes:
    """A header and 74 data rows (75 lines); line N holds data row N-1, or bad_lines[N]."""
    out = [b"id,text,gold\n" if with_id else b"text,gold\n"]
    for line in range(2, 76):
        i = line - 1
        text = bad_lines.get(line, _text(i))
        out.append((b"id-%05d," % i if with_id else b"") + text + b"," + LABELS[i % 3].encode() + b"\n")
    return b"".join(out)


BAD_UTF8 = {30: b"Caf\xe9 cr\xe8me", 75: b"broken \xff\xfe tail"}


def test_csv_with_invalid_utf8_rows_labels_every_good_row(tmp_path):
    data = _csv_75(BAD_UTF8)
    assert data.count(b"\n") == 75
    manifest, out, shard = _run(tmp_path, _write(tmp_path, "rows.csv", data))
    assert manifest["rows"] == 74  # every data line: 75 lines less the header
    errors = _errors(out)
    # The id column is clean on both lines: the error rows keep their ids.
    assert set(errors) == {"id-00029", "id-00074"}
    assert errors["id-00029"].startswith("invalid_text: line 30: column 'text' is not valid UTF-8 (byte 0xE9")
    assert errors["id-00074"].startswith("invalid_text: line 75: column 'text'")
    assert shard["id-00029"]["text"] is None and shard["id-00074"]["gold"] == LABELS[74 % 3]
    _assert_rest_labeled(out, set(errors))
    assert shard["id-00031"]["text"] == _text(31).decode()


def test_csv_with_invalid_utf8_and_generated_ids_keeps_every_good_rows_id(tmp_path):
    _, out, shard = _run(tmp_path, _write(tmp_path, "rows.csv", _csv_75(BAD_UTF8, with_id=False)), id_column=None)
    errors = _errors(out)
    assert set(errors) == {"row-0000000029", "row-0000000074"}
    assert errors["row-0000000029"].startswith("invalid_text: line 30:")
    _assert_rest_labeled(out, set(errors))
    # The same file without the bad bytes: every good row has the id (and text) it has here.
    clean = tmp_path / "clean"
    _, _, clean_shard = _run(clean, _write(clean, "rows.csv", _csv_75({}, with_id=False)), id_column=None)
    assert {k: v["text"] for k, v in shard.items() if k not in errors} == {
        k: v["text"] for k, v in clean_shard.items() if k not in errors}


def test_csv_stray_quotes_cost_one_row_each(tmp_path):
    data = (b'id,text,gold\n'
            b'1,"A apple, red",fruit\n'
            b'2,"unterminated quote,fruit\n'           # line 3: the quote never closes
            b'3,A car.,vehicle\n'
            b'4,"A dog said ""woof""",animal\n'
            b'5,"A cat" and more,animal\n'            # line 6: text after a closing quote
            b'6,he said "hi" to a horse,animal\n'     # a quote inside an unquoted value is text
            b'7,"A truck,\nlong and red",vehicle\n'   # a quoted line break: one record, two lines
            b'8,A banana.,fruit\n')
    manifest, out, shard = _run(tmp_path, _write(tmp_path, "rows.csv", data))
    assert manifest["rows"] == 8  # 10 lines: the header, and one record over two lines
    errors = _errors(out)
    assert set(errors) == {"unparsable-line-3", "unparsable-line-6"}
    assert errors["unparsable-line-3"].startswith("unparsable_row: line 3: a quote opened on this line is never closed")
    assert errors["unparsable-line-6"].startswith("unparsable_row: line 6: ")
    _assert_rest_labeled(out, set(errors))
    assert shard["1"]["text"] == "A apple, red" and shard["4"]["text"] == 'A dog said "woof"'
    assert shard["6"]["text"] == 'he said "hi" to a horse' and shard["7"]["text"] == "A truck,\nlong and red"
    assert shard["unparsable-line-3"]["text"] is None


@pytest.mark.parametrize("with_id", [True, False])
def test_csv_ragged_rows(tmp_path, with_id):
    data = (b"id,text,gold\n"
            b"1,A apple.,fruit\n"
            b"2,A car.,vehicle,extra\n"      # line 3: too many fields
            b"3,A dog.\n"                    # line 4: too few
            b"4,A cat.,animal\n"
            b"\n"                            # a blank line is not a row
            b"5,A truck.,vehicle\n")
    kw = {} if with_id else {"id_column": None}
    manifest, out, _ = _run(tmp_path, _write(tmp_path, "rows.csv", data), **kw)
    assert manifest["rows"] == 5
    errors = _errors(out)
    ids = ("unparsable-line-3", "unparsable-line-4") if with_id else ("row-0000000002", "row-0000000003")
    assert set(errors) == set(ids)
    assert errors[ids[0]] == "unparsable_row: line 3: expected 3 fields, found 4"
    assert errors[ids[1]] == "unparsable_row: line 4: expected 3 fields, found 2"
    _assert_rest_labeled(out, set(errors))
    assert ("5" if with_id else "row-0000000005") in out


JSONL = (b'{"id":"j1","text":"A apple.","gold":"fruit"}\n'
         b'{"id":"j2","text":"bad \xff\xfe bytes","gold":"fruit"}\n'            # line 2: invalid_text
         b'{"id":"j3","text":"A car.","gold":"vehicle"}\n'
         b'{"id":"j4","text":"broken\n'                                         # line 4: not JSON
         b'[1, 2]\n'                                                            # line 5: not an object
         b'\n'                                                                  # blank: not a row
         b'{"id":"j7","text":"A dog.","gold":"animal","note":"\xc3\x28"}\n'     # bad bytes, unused column
         b'{"id":"j8","text":"A cat \\u00e9.","gold":"animal","n":1.5}\n')


def test_jsonl_bad_bytes_and_broken_lines(tmp_path):
    manifest, out, shard = _run(tmp_path, _write(tmp_path, "rows.jsonl", JSONL))
    assert manifest["rows"] == 7  # the non-blank lines
    errors = _errors(out)
    assert set(errors) == {"j2", "unparsable-line-4", "unparsable-line-5"}
    assert errors["j2"].startswith("invalid_text: line 2: column 'text' is not valid UTF-8 (byte 0xFF")
    assert errors["unparsable-line-4"].startswith("unparsable_row: line 4: not valid JSON (")
    assert errors["unparsable-line-5"] == "unparsable_row: line 5: a JSON list, expected an object"
    _assert_rest_labeled(out, set(errors))
    assert shard["j7"]["text"] == "A dog." and shard["j8"]["text"] == "A cat \u00e9."


def test_jsonl_generated_ids_follow_the_lines(tmp_path):
    _, out, shard = _run(tmp_path, _write(tmp_path, "rows.jsonl", JSONL), id_column=None)
    errors = _errors(out)
    assert set(errors) == {"row-0000000002", "row-0000000004", "row-0000000005"}
    assert shard["row-0000000003"]["text"] == "A car." and shard["row-0000000007"]["text"] == "A cat \u00e9."
    _assert_rest_labeled(out, set(errors))


def test_parquet_binary_column_with_bad_utf8_is_invalid_text(tmp_path):
    texts = [b"A apple.", b"Caf\xe9", b"A car.", b"\xff\xfe", b"A dog."]
    table = pa.table({"id": [f"p{i}" for i in range(5)], "text": pa.array(texts, pa.binary()),
                      "gold": ["fruit", "fruit", "vehicle", "animal", "animal"]})
    src = tmp_path / "src" / "rows.parquet"
    src.parent.mkdir(parents=True)
    pq.write_table(table, src)
    manifest, out, _ = _run(tmp_path, src)
    errors = _errors(out)
    assert manifest["rows"] == 5 and set(errors) == {"p1", "p3"}
    assert all(e.startswith("invalid_text: column 'text' is not valid UTF-8") for e in errors.values())
    _assert_rest_labeled(out, set(errors))


def test_parquet_string_column_with_bad_utf8_is_invalid_text(tmp_path):
    # A writer that did not validate: the column says "string", two values are not UTF-8.
    texts = pa.array([b"A apple.", b"Caf\xe9", b"A car.", b"x\xff", b"A dog."], pa.binary()).view(pa.string())
    table = pa.table({"id": [f"p{i}" for i in range(5)], "text": texts,
                      "gold": ["fruit", "fruit", "vehicle", "animal", "animal"]})
    src = tmp_path / "src" / "rows.parquet"
    src.parent.mkdir(parents=True)
    pq.write_table(table, src)
    manifest, out, shard = _run(tmp_path, src)
    errors = _errors(out)
    assert manifest["rows"] == 5 and set(errors) == {"p1", "p3"}
    assert errors["p1"] == "invalid_text: row 2: column 'text' is not valid UTF-8 (byte 0xE9 at byte 4)"
    assert errors["p3"].startswith("invalid_text: row 4: column 'text'")
    assert shard["p2"]["text"] == "A car."
    _assert_rest_labeled(out, set(errors))


def test_glob_of_csv_files_numbers_lines_per_file(tmp_path):
    _write(tmp_path, "a.csv", b"text,gold\nA apple.,fruit\nbad \xff,fruit\n")
    _write(tmp_path, "b.csv", b"text,gold\nA car.,vehicle,x\nA dog.,animal\n")
    manifest, out, _ = _run(tmp_path, tmp_path / "src" / "*.csv", id_column=None)
    assert manifest["rows"] == 4
    assert _errors(out) == {
        "row-0000000002": "invalid_text: line 3: column 'text' is not valid UTF-8 (byte 0xFF at character 5)",
        "row-0000000003": "unparsable_row: line 2: expected 2 fields, found 3"}


# --- Files that cannot be read at all: one clear line, before any engine starts ---------------


def _input_error(tmp_path: Path, src: Path, **kw) -> str:
    spec = make_spec(tmp_path, input=str(src), **kw)
    with pytest.raises(InputError) as info:
        build_shards(spec, JobHome(spec.home_path))
    msg = str(info.value)
    assert "\n" not in msg and len(msg) < 400, msg
    return msg


@pytest.mark.parametrize("name", ["rows.csv", "rows.jsonl", "rows.parquet"])
def test_empty_file(tmp_path, name):
    src = _write(tmp_path, name, b"")
    assert _input_error(tmp_path, src) == (f"input file {src} is empty (0 bytes): re-export it or remove it "
                                           "from input")


def test_binary_blob_named_csv(tmp_path):
    src = _write(tmp_path, "rows.csv", bytes(range(256)) * 40)
    msg = _input_error(tmp_path, src)
    assert msg.startswith(f"input file {src} is binary data, not CSV text")


def test_parquet_named_csv_and_text_named_parquet(tmp_path):
    pq.write_table(pa.table({"id": ["1"], "text": ["A apple."]}), tmp_path / "real.parquet")
    src = _write(tmp_path, "rows.csv", (tmp_path / "real.parquet").read_bytes())
    assert _input_error(tmp_path, src) == f"input file {src} is a Parquet file, not CSV: set input_format='parquet'"
    src = _write(tmp_path, "rows.parquet", b"id,text,gold\n1,A apple.,fruit\n")
    msg = _input_error(tmp_path, src)
    assert msg.startswith(f"input file {src} is not a Parquet file (it starts with text 'id,text,gold")


def test_latin1_csv_is_one_clear_line(tmp_path):
    src = _write(tmp_path, "rows.csv", b"id,text,gold\n1,Caf\xe9,fruit\n2,Cr\xe8me,fruit\n3,\xc0 la carte,fruit\n")
    msg = _input_error(tmp_path, src)
    assert msg.startswith(f"cannot read input file {src}: none of its 3 rows is valid UTF-8")
    assert msg.endswith("save it as UTF-8")


def test_csv_named_jsonl_is_one_clear_line(tmp_path):
    src = _write(tmp_path, "rows.jsonl", b"id,text,gold\n1,A apple.,fruit\n2,A car.,vehicle\n")
    msg = _input_error(tmp_path, src)
    assert msg.startswith(f"cannot read input file {src}: none of its 3 rows is readable (unparsable_row: line 1")


def test_missing_file(tmp_path):
    assert "matches no files" in _input_error(tmp_path, tmp_path / "nope.csv")


def test_wrong_delimiter_names_the_fix(tmp_path):
    # A semicolon file whose values hold exactly one comma each: DuckDB's sniffer cannot tell.
    assert delimiter_hint(["id;text;gold"], ["text", "gold"], ",") == (
        "the header looks ';'-separated but was read with delimiter ',': set csv_delimiter=';' "
        "(or save the file with ',')")
    src = _write(tmp_path, "rows.csv", b"id|text|gold\n1|A apple.|fruit\n2|A car.|vehicle\n")
    msg = _input_error(tmp_path, src, text_columns=["body"], user_template="{{ body }}")
    assert msg.startswith("input has no column(s) ['body']; it has ['gold', 'id', 'text']: it was read as CSV "
                          "with delimiter '|'")


def test_csv_delimiter(tmp_path):
    data = b"id;text;gold\n1;A apple, red;fruit\n2;A car, fast;vehicle\n3;A dog\xff;animal\n"
    _, out, shard = _run(tmp_path, _write(tmp_path, "rows.csv", data), extra={"csv_delimiter": ";"})
    assert shard["1"]["text"] == "A apple, red"
    assert set(_errors(out)) == {"3"}


RICH_CSV = (b'text,gold,note\r\n'
            b'"A apple, red",fruit,\r\n'
            b'"She said ""a car""",vehicle,x\r\n'
            b'"A truck\r\nover two lines",vehicle, padded \r\n'
            b'Caf\xc3\xa9 \xe2\x80\x94 a dog,animal,"quoted"\r\n'
            b'he said "hi" to a horse,animal,007\r\n')
RICH_JSONL = (b'{"text":"A apple","gold":"fruit","n":1.5,"tags":["a"]}\n'
              b'{"text":"Caf\\u00e9 \xe2\x80\x94 \\"car\\"","gold":"vehicle","n":7}\n'
              b'{"text":"A dog\\nbarks","gold":null,"extra":{"k":1}}\n'
              b'{"text":42,"gold":"animal"}\n')


@pytest.mark.parametrize(("name", "clean", "bad_line"), [
    ("rows.csv", RICH_CSV, b"broken \xff,fruit,\r\n"),
    ("rows.jsonl", RICH_JSONL, b'{"text": "broken\n'),
])
def test_the_line_by_line_read_gives_good_rows_the_values_duckdb_gives(tmp_path, name, clean, bad_line):
    """The same rows, read in one go (clean file) and line by line (one bad line added at the end):
    every good row has the same id and the same values."""
    fast_home, slow_home = tmp_path / "fast", tmp_path / "slow"
    _, fast_out, fast = _run(fast_home, _write(fast_home, name, clean), id_column=None)
    _, out, slow = _run(slow_home, _write(slow_home, name, clean + bad_line), id_column=None)
    assert _errors(out) == {**_errors(fast_out), f"row-{len(fast) + 1:010d}": _errors(out)[f"row-{len(fast) + 1:010d}"]}
    assert {k: v for k, v in slow.items() if k in fast} == fast
    assert len(slow) == len(fast) + 1


def test_a_stray_quote_never_leaves_quotes_in_other_values(tmp_path):
    # DuckDB's sniffer reads this file without a quote character (no error, every "A apple"
    # keeping its quotes); the quote is forced, the stray one fails the read, and only its row is lost.
    data = b'id,text,gold\n1,"A apple",fruit\n2,"A car",vehicle\n3,"unterminated,animal\n4,"A dog",animal\n'
    _, out, shard = _run(tmp_path, _write(tmp_path, "rows.csv", data))
    assert set(_errors(out)) == {"unparsable-line-4"}
    assert [shard[k]["text"] for k in ("1", "2", "4")] == ["A apple", "A car", "A dog"]


def test_gzipped_csv_with_bad_bytes(tmp_path):
    import gzip

    src = _write(tmp_path, "rows.csv.gz", gzip.compress(_csv_75(BAD_UTF8)))
    manifest, out, _ = _run(tmp_path, src)
    assert manifest["rows"] == 74 and set(_errors(out)) == {"id-00029", "id-00074"}


# --- A key given twice: Python's json takes the line, DuckDB refuses it --------------------------

DOUBLED = (b'{"id": 1, "text": "A apple.", "gold": "fruit"}\n'
           b'{"id": 2, "text": "x", "text": "y", "gold": "fruit"}\n'          # a used column twice: which text?
           b'{"id": 3, "text": "A car.", "gold": "vehicle", "note": 1, "note": 2}\n'   # an unused one twice
           b'{"id": 4, "text": "A dog.", "gold": "animal", "meta": {"k": 1, "k": 2}}\n')  # nested, unused


@pytest.mark.parametrize("with_id", [True, False])
def test_jsonl_with_a_repeated_key_shards_and_labels(tmp_path, with_id):
    manifest, out, shard = _run(tmp_path, _write(tmp_path, "rows.jsonl", DOUBLED),
                                **({} if with_id else {"id_column": None}))
    assert manifest["rows"] == 4
    bad = "2" if with_id else "row-0000000002"
    assert _errors(out) == {bad: "unparsable_row: line 2: key 'text' appears more than once in the object "
                                 "(which value is meant?): keep one"}
    ids = ("1", "3", "4") if with_id else ("row-0000000001", "row-0000000003", "row-0000000004")
    assert [shard[i]["text"] for i in ids] == ["A apple.", "A car.", "A dog."]
    _assert_rest_labeled(out, {bad})


def test_jsonl_with_a_repeated_id_key_loses_the_id_not_the_row(tmp_path):
    data = b'{"id": "a", "text": "A apple."}\n{"id": "b", "id": "c", "text": "A car."}\n'
    _, out, _ = _run(tmp_path, _write(tmp_path, "rows.jsonl", data), gold_column=None)
    assert _errors(out) == {"unparsable-line-2": "unparsable_row: line 2: key 'id' appears more than once in the "
                                                 "object (which value is meant?): keep one"}


def test_jsonl_that_duckdb_refuses_but_whose_every_line_is_good(tmp_path):
    # Bad bytes in a column the job does not use, a key repeated in another: DuckDB refuses the
    # file, and the line-by-line read keeps every row, so it has no bad row at all.
    data = (b'{"id": 1, "text": "A apple.", "note": "caf\xe9"}\n'
            b'{"id": 2, "text": "A car.", "note": "x", "note": "y", "m": {"k": 1, "k": 2}}\n')
    manifest, out, shard = _run(tmp_path, _write(tmp_path, "rows.jsonl", data), gold_column=None)
    assert manifest["rows"] == 2 and _errors(out) == {}
    assert shard["1"]["text"] == "A apple." and shard["2"]["text"] == "A car."
