"""Provider batch files (``input_format: openai_batch`` / ``anthropic_batch``): :func:`stage_batch`
reads every non-blank line into exactly one row of the view ``src``.

A row is ``custom_id`` (the row id), ``request`` (the normalized request, one JSON text:
``spec/batch_requests.py``) and, for a line that cannot run, ``_sb_error`` with the line number
and the reason: not JSON, no ``custom_id``, an unknown url or method, no body, a field this
product does not run (tools...). The shard query (``ids.py``) then names rows as for any input:
a repeated ``custom_id`` is ``<id>#dup2`` (error ``duplicate_id``), a line whose id could not be
read ``unparsable-line-<n>``. So every line ends as one output row or one error row, and the
export (``run/batch_export.py``) writes each of them once. Example::

    staged = stage_batch(con, spec, ["requests.jsonl"], scratch)   # then shard_sql over src
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..spec.batch_requests import LineError, parse_line
from .files import SURROGATE, json_problem, open_binary, physical_lines
from .staging import RowWriter, Staged, staged_schema

#: The staged file's columns; ``request`` is the job's one text column.
COLUMNS = ("custom_id", "request")


def read_line(text: str, n: int, spec: Any) -> tuple[str | None, str | None, str | None]:
    """(custom_id, request, error) of line ``n``; the error starts with its kind and the line."""
    if SURROGATE.search(text):
        return None, None, f"invalid_text: line {n}: the line is not valid UTF-8"
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return None, None, f"unparsable_row: line {n}: not valid JSON ({json_problem(exc, text)})"
    try:
        line = parse_line(obj, spec.input_format, spec.sampling)
    except LineError as exc:
        kind, _, why = str(exc.args[0]).partition(": ")
        return exc.args[1], None, f"{kind}: line {n}: {why}"
    return line.custom_id, line.request.to_text(), None


def stage_batch(con: Any, spec: Any, files: list[str], scratch: Path) -> Staged:
    """Every line of ``files`` as one row of the view ``src`` (one Parquet file in ``scratch``).

    Raises :class:`InputError` when a file is not a batch file at all (binary, empty, no line a
    JSON object)."""
    import pyarrow as pa

    schema = staged_schema([("custom_id", pa.string()), ("request", pa.string())])
    path = scratch / "batch.parquet"
    writer = RowWriter(path, schema)
    bad = 0
    for i, f in enumerate(files):
        objects = 0
        with open_binary(f) as fh:
            for n, raw in physical_lines(fh):
                text = raw.strip()
                if not text:
                    continue
                cid, request, error = read_line(text, n, spec)
                objects += not error or not error.startswith(("unparsable_row", "invalid_text"))
                bad += error is not None
                writer.add({"custom_id": cid, "request": request, "_sb_file": i, "_sb_line": n, "_sb_error": error})
        if not objects:
            raise InputError(f"input file {f} has no JSON object on any line: it is not a {spec.input_format} file "
                             "(one request object per line); check input and input_format")
    writer.close()
    con.execute("SET VARIABLE sb_batch = ?", [str(path)])
    con.execute("CREATE OR REPLACE TEMP VIEW src AS SELECT * FROM read_parquet(getvariable('sb_batch'))")
    return Staged(columns=list(COLUMNS), bad_rows=bad)


def sniff_format(f: str) -> str:
    """``openai_batch`` or ``anthropic_batch``, from the first line that is a JSON object: an
    OpenAI line has ``url`` / ``body``, an Anthropic one ``params``."""
    with open_binary(f) as fh:
        for n, raw in physical_lines(fh):
            try:
                obj = json.loads(raw)
            except ValueError:
                continue
            if isinstance(obj, dict) and ("body" in obj or "url" in obj):
                return "openai_batch"
            if isinstance(obj, dict) and "params" in obj:
                return "anthropic_batch"
            if n >= 1000:
                break
    raise InputError(f"cannot tell whether {f} is an OpenAI or an Anthropic batch file (no line with body/url or "
                     "params in its first 1000): give --format openai_batch or anthropic_batch")
