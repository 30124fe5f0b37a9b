"""Stray bytes: a NUL, a lone control byte or bytes that are not UTF-8 inside one line of a text
input (JSONL, CSV, an OpenAI batch file) make that one line an error row with its line number and
reason, whether the line is in the first 64 KiB (which the reader sniffs) or later; every other
line is labeled. A file that is binary data (a signature of a binary format, mostly NUL, or a
majority of its first lines holding bytes no text has) is still refused in one line
(docs/failures.md says the rule)."""

from __future__ import annotations

import gzip
import io
import json
import zipfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkbatch_dagster import InputError, JobSpec
from sparkbatch_dagster.engines import FakeEngine
from sparkbatch_dagster.home import JobHome
from sparkbatch_dagster.inputs.files import binary_lines
from sparkbatch_dagster.inputs.shards import build_shards
from sparkbatch_dagster.run.batch_export import export
from sparkbatch_dagster.testing import label_shard
from testkit import LABELS, make_spec

V = "0123456789abcdef"
N = 500  # lines of about 200 bytes: 100 KB, so line 450 lies well past the sniffed 64 KiB
HEAD_LINE, TAIL_LINE = 3, 450
PAD = b" seen" * 30


def _label(spec: JobSpec) -> tuple[dict, dict]:
    """Shard (one shard) and label with the fake engine: (manifest, labeled rows by row id)."""
    home = JobHome(spec.home_path)
    manifest = build_shards(spec, home)
    label_shard(spec, home, V, "shard-00000", FakeEngine())
    out = {r["row_id"]: r for r in pq.read_table(home.labeled_path(V, "shard-00000")).to_pylist()}
    assert len(out) == manifest["rows"]
    return manifest, out


def _errors(out: dict) -> dict[str, str]:
    return {rid: r["error"] for rid, r in out.items() if r["error"]}


def _rest_labeled(out: dict, bad: set[str]) -> None:
    assert all(r["error"] is None and r["output"] in LABELS for rid, r in out.items() if rid not in bad)


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    (tmp_path / "src").mkdir(exist_ok=True)
    path = tmp_path / "src" / name
    path.write_bytes(data)
    return path


def _jsonl(bad_line: int, bad: bytes) -> bytes:
    """N JSONL lines; line ``bad_line`` holds ``bad`` inside its text value."""
    lines = []
    for n in range(1, N + 1):
        text = b"Item %d: a dog%s%s" % (n, bad if n == bad_line else b"", PAD)
        lines.append(b'{"id": "r%05d", "text": "%s", "gold": "animal"}' % (n, text))
    return b"\n".join(lines) + b"\n"


@pytest.mark.parametrize("line", [HEAD_LINE, TAIL_LINE], ids=["first-64k", "later"])
@pytest.mark.parametrize(("bad", "reason"), [
    (b"\x00", "unparsable_row: line {n}: not valid JSON (a raw control byte 0x00 at column {col}: JSON strings must "
              "escape it)"),
    (b"\x01", "unparsable_row: line {n}: not valid JSON (a raw control byte 0x01 at column {col}"),
    (b"\xff\xfe", "invalid_text: line {n}: column 'text' is not valid UTF-8 (byte 0xFF"),
], ids=["nul", "control", "not-utf8"])
def test_a_bad_byte_in_a_jsonl_line_is_that_lines_error_row(tmp_path, line, bad, reason):
    src = _write(tmp_path, "rows.jsonl", _jsonl(line, bad))
    assert (len(src.read_bytes()) > 65536) and (src.read_bytes().index(bad) < 65536) == (line == HEAD_LINE)
    manifest, out = _label(make_spec(tmp_path, input=str(src), shards=1))
    assert manifest["rows"] == N
    errors = _errors(out)
    [(rid, error)] = errors.items()
    col = len(f'{{"id": "r{line:05d}", "text": "Item {line}: a dog') + 1
    assert rid in (f"r{line:05d}", f"unparsable-line-{line}")  # the id when it could be read
    assert error.startswith(reason.format(n=line, col=col)), error
    _rest_labeled(out, set(errors))


def _csv(bad_lines: dict[int, bytes]) -> bytes:
    """A header and N-1 rows; line n's text ends with ``bad_lines[n]``."""
    rows = [b"r%05d,Item %d: a dog%s%s,animal" % (n, n, bad_lines.get(n, b""), PAD) for n in range(2, N + 1)]
    return b"\n".join([b"id,text,gold", *rows]) + b"\n"


@pytest.mark.parametrize("line", [HEAD_LINE, TAIL_LINE], ids=["first-64k", "later"])
@pytest.mark.parametrize("line_by_line", [True, False], ids=["line-by-line", "duckdb"])
def test_a_nul_in_a_csv_line_is_that_lines_error_row(tmp_path, line, line_by_line):
    # line_by_line: a Latin-1 line too, which DuckDB refuses: the file is read line by line.
    other = 200
    src = _write(tmp_path, "rows.csv", _csv({line: b"\x00 tail", **({other: b" caf\xe9"} if line_by_line else {})}))
    manifest, out = _label(make_spec(tmp_path, input=str(src), shards=1))
    assert manifest["rows"] == N - 1
    errors = _errors(out)
    assert set(errors) == {f"r{line:05d}", *([f"r{other:05d}"] if line_by_line else [])}
    nul = errors[f"r{line:05d}"]
    if line_by_line:  # the line-by-line reader names the line
        at = len(f"Item {line}: a dog") + 1
        assert nul == f"invalid_text: line {line}: column 'text' has control character 0x00 at character {at}"
        assert errors[f"r{other:05d}"].startswith(f"invalid_text: line {other}: column 'text' is not valid UTF-8")
    else:
        assert nul == "invalid_text: column 'text' has control or undecodable character '\\x00'"
    _rest_labeled(out, set(errors))


def _openai(n: int, bad_line: int) -> bytes:
    lines = []
    for i in range(1, n + 1):
        content = b"Question %d?%s%s" % (i, b"\x00" if i == bad_line else b"", PAD)
        lines.append(b'{"custom_id": "q%d", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", '
                     b'"messages": [{"role": "user", "content": "%s"}], "max_tokens": 4}}' % (i, content))
    return b"\n".join(lines) + b"\n"


@pytest.mark.parametrize("line", [HEAD_LINE, 280], ids=["first-64k", "later"])
def test_a_nul_in_an_openai_batch_line_is_that_requests_error_line(tmp_path, line):
    n = 300  # lines of about 300 bytes: 90 KB
    src = _write(tmp_path, "requests.jsonl", _openai(n, line))
    assert (src.read_bytes().index(b"\x00") < 65536) == (line == HEAD_LINE)
    spec = JobSpec(name="batch_requests", input=str(src), input_format="openai_batch", shard_count=1,
                   home=str(tmp_path / "home"))
    manifest, out = _label(spec)
    assert manifest["rows"] == n
    errors = _errors(out)
    col = src.read_bytes().splitlines()[line - 1].index(b"\x00") + 1
    assert errors == {f"unparsable-line-{line}": f"unparsable_row: line {line}: not valid JSON (a raw control byte "
                                                  f"0x00 at column {col}: JSON strings must escape it)"}
    summary = export(JobHome(spec.home_path), V, "openai_batch", tmp_path / "out.jsonl", tmp_path / "err.jsonl")
    answered = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    [failed] = [json.loads(x) for x in (tmp_path / "err.jsonl").read_text().splitlines()]
    assert sorted(x["custom_id"] for x in answered) == sorted(f"q{i}" for i in range(1, n + 1) if i != line)
    assert failed["custom_id"] == f"unparsable-line-{line}" and failed["response"]["status_code"] == 400
    assert failed["error"] is None and "0x00" in failed["response"]["body"]["error"]["message"] and summary.complete


# --- Binary data is still refused: the rule ---------------------------------------------------


def _refusal(tmp_path: Path, name: str, data: bytes) -> str:
    src = _write(tmp_path, name, data)
    spec = make_spec(tmp_path, input=str(src), shards=1)
    with pytest.raises(InputError) as info:
        build_shards(spec, JobHome(spec.home_path))
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"input file {src} is "), msg
    return msg.removeprefix(f"input file {src} is ")


def _parquet_bytes() -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table({"id": ["1"], "text": ["A dog."]}), buf)
    return buf.getvalue()


def _zip_bytes() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("rows.jsonl", _jsonl(0, b"").decode())
    return buf.getvalue()


@pytest.mark.parametrize(("data", "said"), [
    (_parquet_bytes, "a Parquet file, not JSONL: set input_format='parquet'"),
    (lambda: gzip.compress(_jsonl(0, b"")), "gzip-compressed: name it rows.jsonl.gz so it is decompressed"),
    (_zip_bytes, "a zip archive: unzip it and give the files inside as input"),
    (lambda: b"\x00" * 70000, "binary data, not JSONL text (it starts with bytes 00 00 00 00 00 00 00 00; 1 of the "
                              "1 lines of its first 64 KiB hold NUL or other bytes no text has)"),
    (lambda: _jsonl(0, b"")[:3000] + b"\x00" * 60000, "binary data, not JSONL text"),  # a few lines, then mostly NUL
    (lambda: bytes(range(256)) * 300, "binary data, not JSONL text"),
    (lambda: _jsonl(0, b"").decode().encode("utf-16-le"), "binary data, not JSONL text"),  # UTF-16 without its mark
], ids=["parquet", "gzip", "zip", "all-nul", "mostly-nul", "blob", "utf16"])
def test_binary_data_named_jsonl_is_refused_in_one_line(tmp_path, data, said):
    assert _refusal(tmp_path, "rows.jsonl", data()).startswith(said)


def test_the_binary_rule():
    text = _jsonl(0, b"")[:65536]
    assert binary_lines(text) is None
    assert binary_lines(_jsonl(HEAD_LINE, b"\x00")[:65536]) is None  # one bad line of many: text
    assert binary_lines(b'{"a": "x"}\n{"a": "\x00"}\n') is None  # half the lines: still text (one error row)
    assert binary_lines(b'{"a": "\x00"}\n{"a": "\x00"}\n{"a": "x"}\n') == (2, 3)  # most lines: binary
    assert binary_lines(b"x" * 60000 + b"\x00") is None  # one NUL in a long line: text
    assert binary_lines(b"ok\n" * 10 + b"\x00" * 100) == (1, 11)  # mostly NUL by its bytes
    assert binary_lines(b"\x1b[31mred\x1b[0m \x07\x08\x0b\x0c\n" * 50) is None  # ESC, BEL, BS, VT, FF: text bytes
