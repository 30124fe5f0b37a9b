"""Staging, shared by every format's reader: the one-go read (:class:`FastRead`) and the row-by-row
result (:class:`Staged`), the scratch Parquet writer (:class:`RowWriter`), per-file tallies of good
and bad rows (:class:`Tally`), the columns a job reads (:func:`wanted_columns`) and the UTF-8 checks
of their values."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .files import bad_utf8, no_good_rows

log = logging.getLogger("sparkbatch")

#: Columns the staged view adds: which file, which line, and why the row is bad (NULL if good).
STAGED_COLUMNS = ("_sb_file", "_sb_line", "_sb_error")
#: Rows a staged file is written (and a columnar file read) in at a time.
BATCH_ROWS = 50_000
#: Control characters a text value may not hold: those the prompt check refuses (spec/prompts.py).
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


@dataclass(frozen=True)
class FastRead:
    """DuckDB's read of the files in one go: the table expression over ``getvariable('sb_files')``,
    the columns that give the input's row order, and (CSV) the delimiter it was read with."""

    sql: str
    order: str
    delimiter: str | None = None


@dataclass
class Staged:
    """The view ``src`` exists; ``columns`` are the input's column names (for messages)."""

    columns: list[str]
    bad_rows: int = 0
    order: str = "_sb_file, _sb_line"
    delimiter: str | None = None  # CSV: the delimiter the files were read with


class RowWriter:
    """Rows -> one Parquet file, in batches."""

    def __init__(self, path: Path, schema: Any) -> None:
        import pyarrow.parquet as pq

        self.schema = schema
        self.rows: list[dict[str, Any]] = []
        self.writer = pq.ParquetWriter(path, schema)

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if len(self.rows) >= BATCH_ROWS:
            self.flush()

    def flush(self) -> None:
        import pyarrow as pa

        if self.rows:
            self.writer.write_table(pa.Table.from_pylist(self.rows, schema=self.schema))
            self.rows = []

    def close(self) -> None:
        self.flush()
        self.writer.close()


class Tally:
    """Good and bad rows of one file; a file without a single good row cannot be read."""

    def __init__(self, f: str) -> None:
        self.f, self.good, self.bad = f, 0, 0
        self.first: tuple[int, str] | None = None

    def count(self, line: int, error: str | None) -> None:
        if error is None:
            self.good += 1
            return
        self.bad += 1
        self.first = self.first or (line, error)

    def check(self) -> int:
        if self.bad and not self.good:
            raise no_good_rows(self.f, self.bad, self.first or (0, ""))
        if self.bad:
            log.warning("%s: %d of %d rows unreadable (first: %s); they become error rows",
                        self.f, self.bad, self.good + self.bad, self.first[1] if self.first else "")
        return self.bad


def staged_schema(fields: list[Any]) -> Any:
    """A staged file's pyarrow schema: ``fields`` (pyarrow fields or ``(name, type)`` pairs), then
    :data:`STAGED_COLUMNS` (the file's index, the row's line, its error)."""
    import pyarrow as pa

    return pa.schema([*fields, ("_sb_file", pa.int32()), ("_sb_line", pa.int64()), ("_sb_error", pa.string())])


def wanted_columns(spec: Any) -> list[str]:
    """The columns a job reads (id, text, gold), each once, in that order."""
    return list(dict.fromkeys(c for c in [spec.id_column, *spec.text_columns, spec.gold_column] if c))


def check_values(values: dict[str, Any], line: int, spec: Any) -> str | None:
    """Blame bytes that are not UTF-8 on the first wanted column holding them, else a control
    byte (a NUL...) on the first text column holding one; the text columns become NULL (the id
    stays when it is clean: the error row keeps it)."""
    error = None
    for col in sorted(values, key=lambda c: c not in spec.text_columns):
        v = values[col]
        bad = bad_utf8(v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)) if v is not None else None
        if bad:
            error = error or f"invalid_text: line {line}: column {col!r} is not valid UTF-8 ({bad})"
            values[col] = None
    for col in spec.text_columns if error is None else ():
        v = values.get(col)
        found = _CONTROL.search(v) if isinstance(v, str) else None
        if found:  # a NUL or another control byte: as the prompt check would say, with the line
            error = (f"invalid_text: line {line}: column {col!r} has control character 0x{ord(found.group()):02X} "
                     f"at character {found.start() + 1}")
    if error:
        for col in spec.text_columns:
            values[col] = None
    return error
