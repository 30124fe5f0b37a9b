"""JSONL: :func:`stage_json`, one row per non-blank line."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from ..errors import InputError
from .files import SURROGATE, json_problem, lit, open_binary, physical_lines
from .staging import STAGED_COLUMNS, FastRead, RowWriter, Staged, Tally, check_values, staged_schema, wanted_columns


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_ESCAPED_SURROGATE = re.compile("[\ud800-\udfff]")


def json_reader(con: Any, files_var: str, spec: Any, filename: bool = False) -> str:
    """``read_json`` over the JSONL files listed in the DuckDB variable ``files_var``, with the
    id column read as text whatever JSON types its values have.

    DuckDB types a column from a sample of lines: ints and floats make a DOUBLE (``1`` becomes
    ``1.0``, 9007199254740993 becomes 9007199254740992, a duplicate of that id), all-int lines make
    a BIGINT that silently rounds a later ``2.5`` to ``2``, and a mix of strings and arrays makes
    a JSON column whose strings keep their quotes. Read as text instead, an id is its value as
    written: a string as it is (``"b"`` -> ``b``), an integer its digits at any size (never
    through DOUBLE), a float its shortest text (``1.0`` -> ``1.0``, ``1e2`` -> ``100.0``: so ``1``
    and ``1.0`` are two ids), ``true``/``false``, an array or object its compact JSON (``[1,2]``).
    The other wanted columns keep DuckDB's types. Example::

        con.execute("SET VARIABLE sb_files = ?", [["rows.jsonl"]])
        con.execute(f"SELECT id FROM {json_reader(con, 'sb_files', spec)}")   # VARCHAR
    """
    plain = f"read_json(getvariable({lit(files_var)}), format = 'newline_delimited', union_by_name = true"
    end = ", filename = true)" if filename else ")"
    types = {r[0]: r[1] for r in con.execute(f"DESCRIBE SELECT * FROM {plain})").fetchall()} \
        if spec.id_column else {}
    wanted = wanted_columns(spec)
    # Text already (a later non-string value then reads as its text), or a missing column (its
    # error lists every column): as DuckDB reads it.
    if types.get(spec.id_column, "VARCHAR") == "VARCHAR" or any(c not in types for c in wanted):
        return plain + end
    # Only the columns the job reads: naming one column per key, the list must leave out the
    # columns DuckDB invents for keys that differ only in case ('UP' beside 'up' becomes 'up_1').
    keep = [*wanted, *(c for c in STAGED_COLUMNS if c in types)]
    columns = ", ".join(f"{lit(c)}: {lit('VARCHAR' if c == spec.id_column else types[c])}" for c in keep)
    return f"{plain}, columns = {{{columns}}}{end}"


def json_file_reader(con: Any, spec: Any, files: list[str]) -> FastRead:
    """DuckDB's read of JSONL files (:func:`json_reader`), the reader's ordinality the row order."""
    return FastRead(json_reader(con, "sb_files", spec, filename=True) + " WITH ORDINALITY", "ordinality")


def _pairs_hook(doubled: list[tuple[dict[str, Any], list[str]]]) -> Any:
    """An ``object_pairs_hook`` noting, in ``doubled``, every object with a key given twice."""
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(pairs)  # the last value wins, as with plain json.loads
        if len(obj) < len(pairs):
            doubled.append((obj, sorted(k for k, c in Counter(k for k, _ in pairs).items() if c > 1)))
        return obj

    return hook


def _json_line(text: str, n: int, spec: Any, wanted_columns: list[str]
               ) -> tuple[str | None, dict[str, Any], str | None]:
    """(line to keep or None, recovered values, error) for one non-blank JSONL line.

    A key given twice in one object is legal JSON that DuckDB refuses: in a column the job uses
    (which value was meant?) the row is an error row; anywhere else the line is kept as Python's
    json reads it (the last value wins), rewritten so that DuckDB reads the same."""
    doubled: list[tuple[dict[str, Any], list[str]]] = []
    try:
        obj = json.loads(text, parse_constant=_no_constant, object_pairs_hook=_pairs_hook(doubled))
    except (ValueError, RecursionError) as exc:
        return None, {}, f"unparsable_row: line {n}: not valid JSON ({json_problem(exc, text)})"
    if not isinstance(obj, dict):
        return None, {}, f"unparsable_row: line {n}: a JSON {type(obj).__name__}, expected an object"
    twice = [k for o, keys in doubled if o is obj for k in keys if k in wanted_columns]
    if twice:
        kept = {spec.id_column: _id_text(obj.get(spec.id_column))} if spec.id_column not in (None, *twice) else {}
        return None, kept, (f"unparsable_row: line {n}: key {twice[0]!r} appears more than once in the object "
                            "(which value is meant?): keep one")
    wanted = {c: obj[c] for c in wanted_columns if c in obj}
    if SURROGATE.search(text):  # bytes that are not UTF-8 somewhere in the line
        error = check_values(wanted, n, spec)
        if error:
            return None, {spec.id_column: _id_text(wanted.get(spec.id_column))} if spec.id_column else {}, error
        # The bad bytes sit in a column the job does not use: keep the row without them.
        obj = {k: v for k, v in obj.items() if not _ESCAPED_SURROGATE.search(k + json.dumps(v, ensure_ascii=False))}
        text = json.dumps(obj, ensure_ascii=False)
    elif "\\u" in text and _ESCAPED_SURROGATE.search(json.dumps(obj, ensure_ascii=False)):
        return None, {}, f"unparsable_row: line {n}: not valid JSON (an unpaired \\u surrogate escape)"
    elif doubled:  # a repeated key the job does not use: the line as read, each key once
        text = json.dumps(obj, ensure_ascii=False)
    return text, {}, None


def _id_text(value: Any) -> str | None:
    if value is None:
        return None
    # As json_reader reads it: a string as is, anything else its compact JSON.
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def stage_json(con: Any, spec: Any, files: list[str], scratch: Path) -> Staged:
    """Good lines go, unchanged (but for bad bytes or a repeated key in a column the job does not
    use), to a JSONL file per input file (with ``_sb_file``/``_sb_line`` added) that DuckDB's own
    JSON reader reads (:func:`json_reader`), so their values are typed exactly as a clean file's
    are; bad lines go to one Parquet file; the view is both."""
    import pyarrow as pa

    fields = [(spec.id_column, pa.string())] if spec.id_column else []
    schema = staged_schema(fields)
    wanted = wanted_columns(spec)
    bad_path = scratch / "json-bad.parquet"
    bad_writer = RowWriter(bad_path, schema)
    good_files: list[str] = []
    bad_rows = 0
    for i, f in enumerate(files):
        tally = Tally(f)
        good_path = scratch / f"json-{i:06d}.jsonl"
        with open_binary(f) as fh, good_path.open("w", encoding="utf-8", errors="surrogateescape") as out:
            for n, raw in physical_lines(fh):
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
    try:
        good = json_reader(con, "sb_staged", spec)
        columns = [r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {good}").fetchall()]
        con.execute(f"SELECT count(_sb_line) FROM {good}").fetchone()
    except Exception as exc:  # noqa: BLE001 - Python's JSON parser took a line DuckDB's rejects
        raise InputError(f"cannot read input {files[0] if len(files) == 1 else files}: "
                         f"{str(exc).splitlines()[0]}: check the file") from None
    # Always with the bad rows' file, even empty: the view must have its _sb_error column.
    con.execute(f"CREATE OR REPLACE TEMP VIEW src AS SELECT * FROM {good} "
                "UNION ALL BY NAME SELECT * FROM read_parquet(getvariable('sb_bad'))")
    return Staged(columns=[c for c in columns if c not in STAGED_COLUMNS], bad_rows=bad_rows)
