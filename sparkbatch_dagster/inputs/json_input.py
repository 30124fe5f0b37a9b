"""JSONL: :func:`stage_json`, one row per non-blank line."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ..errors import InputError
from .files import _SURROGATE, _lines, diagnose, open_binary
from .staging import STAGED_COLUMNS, Staged, _check_values, _Tally, _wanted, _Writer


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_ESCAPED_SURROGATE = re.compile("[\ud800-\udfff]")


def _json_line(text: str, n: int, spec: Any, wanted_columns: list[str]
               ) -> tuple[str | None, dict[str, Any], str | None]:
    """(line to keep or None, recovered values, error) for one non-blank JSONL line."""
    try:
        obj = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        msg = (f"{exc.msg}: column {exc.colno}" if isinstance(exc, json.JSONDecodeError)
               else "nested too deeply" if isinstance(exc, RecursionError) else str(exc))
        return None, {}, f"unparsable_row: line {n}: not valid JSON ({msg})"
    if not isinstance(obj, dict):
        return None, {}, f"unparsable_row: line {n}: a JSON {type(obj).__name__}, expected an object"
    wanted = {c: obj[c] for c in wanted_columns if c in obj}
    if _SURROGATE.search(text):  # bytes that are not UTF-8 somewhere in the line
        error = _check_values(wanted, n, spec)
        if error:
            return None, {spec.id_column: _id_text(wanted.get(spec.id_column))} if spec.id_column else {}, error
        # The bad bytes sit in a column the job does not use: keep the row without them.
        obj = {k: v for k, v in obj.items() if not _ESCAPED_SURROGATE.search(k + json.dumps(v, ensure_ascii=False))}
        text = json.dumps(obj, ensure_ascii=False)
    elif "\\u" in text and _ESCAPED_SURROGATE.search(json.dumps(obj, ensure_ascii=False)):
        return None, {}, f"unparsable_row: line {n}: not valid JSON (an unpaired \\u surrogate escape)"
    return text, {}, None


def _id_text(value: Any) -> str | None:
    if value is None or isinstance(value, dict | list):
        return None
    return value if isinstance(value, str) else json.dumps(value)


def stage_json(con: Any, spec: Any, files: list[str], scratch: Path) -> Staged:
    """Good lines go, unchanged, to a JSONL file per input file (with ``_sb_file``/``_sb_line``
    added) that DuckDB's own JSON reader reads, so their values are typed exactly as a clean
    file's are; bad lines go to one Parquet file; the view is both."""
    import pyarrow as pa

    fields = [(spec.id_column, pa.string())] if spec.id_column else []
    schema = pa.schema([*fields, ("_sb_file", pa.int32()), ("_sb_line", pa.int64()), ("_sb_error", pa.string())])
    wanted = _wanted(spec)
    bad_path = scratch / "json-bad.parquet"
    bad_writer = _Writer(bad_path, schema)
    good_files: list[str] = []
    bad_rows = 0
    for i, f in enumerate(files):
        diagnose(f, "json")
        tally = _Tally(f)
        good_path = scratch / f"json-{i:06d}.jsonl"
        with open_binary(f) as fh, good_path.open("w", encoding="utf-8", errors="surrogateescape") as out:
            for n, raw in _lines(fh):
                text = raw.strip()
                if not text:
                    continue
                keep, values, error = _json_line(text, n, spec, wanted)
                tally.count(n, error)
                if keep is not None:
                    rest = keep[1:]
                    out.write(f'{{"_sb_file":{i},"_sb_line":{n}{"" if rest.lstrip().startswith("}") else ","}{rest}\n')
                else:
                    bad_writer.add({**values, "_sb_file": i, "_sb_line": n, "_sb_error": error})
        bad_rows += tally.check()
        good_files.append(str(good_path))
    bad_writer.close()
    con.execute("SET VARIABLE sb_staged = ?", [good_files])
    con.execute("SET VARIABLE sb_bad = ?", [str(bad_path)])
    good = "read_json(getvariable('sb_staged'), format = 'newline_delimited', union_by_name = true)"
    try:
        columns = [r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {good}").fetchall()]
        con.execute(f"SELECT count(_sb_line) FROM {good}").fetchone()
    except Exception as exc:  # noqa: BLE001 - Python's JSON parser took a line DuckDB's rejects
        raise InputError(f"cannot read input {files[0] if len(files) == 1 else files}: "
                         f"{str(exc).splitlines()[0]}: check the file") from None
    union = " UNION ALL BY NAME SELECT * FROM read_parquet(getvariable('sb_bad'))" if bad_rows else ""
    con.execute(f"CREATE OR REPLACE TEMP VIEW src AS SELECT * FROM {good}{union}")
    return Staged(columns=[c for c in columns if c not in STAGED_COLUMNS], bad_rows=bad_rows)
