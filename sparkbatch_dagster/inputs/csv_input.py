"""CSV: records (quoted multi-line values included) from lines, the dialect guess, and
:func:`stage_csv`."""

from __future__ import annotations

import csv
import dataclasses
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import InputError
from .files import DELIMITERS, Dialect, bad_utf8, csv_options, open_binary, physical_lines, sniff
from .staging import FastRead, RowWriter, Staged, Tally, check_values, staged_schema, wanted_columns

_MAX_RECORD_LINES = 10_000  # a quoted field spanning more lines than this is a stray quote
_MAX_RECORD_CHARS = 8 << 20


class _Pushback:
    def __init__(self, it: Iterator[tuple[int, str]]) -> None:
        self._it, self._back = it, list[tuple[int, str]]()

    def next(self) -> tuple[int, str] | None:
        if self._back:
            return self._back.pop()
        return next(self._it, None)

    def push(self, items: list[tuple[int, str]]) -> None:
        self._back.extend(reversed(items))


class _CsvParser:
    def __init__(self, d: Dialect) -> None:
        self.d = d
        esc = d.escape if d.escape and d.escape != d.quote else None
        self.kw: dict[str, Any] = dict(delimiter=d.delimiter, quotechar=d.quote or '"', strict=True,
                                       doublequote=esc is None, escapechar=esc)

    def open_quote(self, text: str) -> bool:
        q = self.d.quote or '"'
        esc = self.kw["escapechar"]
        if esc:
            text = text.replace(esc + esc, "").replace(esc + q, "")
        return text.count(q) % 2 == 1

    def parse(self, text: str) -> tuple[list[str] | None, str]:
        try:
            rows = list(csv.reader([text], **self.kw))
        except csv.Error as exc:
            return None, str(exc)
        if len(rows) != 1:
            return None, "a line break outside quotes"
        return rows[0], ""

    def records(self, src: _Pushback, ncols: int | None) -> Iterator[tuple[int, list[str] | None, str]]:
        """(first line, fields or None, why not) per record; blank, skipped and comment lines
        are not records. A record whose quote stays open is joined with the next lines only if
        the joined text is one well-formed record of ``ncols`` fields; otherwise the line
        stands alone (a stray quote costs one row, not the rest of the file)."""
        while (item := src.next()) is not None:
            n, raw = item
            text = raw.rstrip("\r\n")
            if n <= self.d.skip or not text.strip() or (self.d.comment and text.startswith(self.d.comment)):
                continue
            if self.open_quote(text):
                joined = self._join(src, raw, ncols)
                if joined is not None:
                    yield n, joined, ""
                    continue
            fields, why = self.parse(text)
            if fields is None and self.open_quote(text):
                why = "a quote opened on this line is never closed"
            yield n, fields, why

    def _join(self, src: _Pushback, raw: str, ncols: int | None) -> list[str] | None:
        taken: list[tuple[int, str]] = []
        record = raw  # line ends inside a quoted value stay as they are in the file
        while self.open_quote(record) and len(taken) < _MAX_RECORD_LINES and len(record) < _MAX_RECORD_CHARS:
            nxt = src.next()
            if nxt is None:
                break
            taken.append(nxt)
            record += nxt[1]
        if not self.open_quote(record):
            fields, _ = self.parse(record.rstrip("\r\n"))
            if fields is not None and (ncols is None or len(fields) == ncols):
                return fields
        src.push(taken)
        return None


def _names(header: list[str]) -> list[str]:
    out: list[str] = []
    for i, name in enumerate(header):
        name = name or f"column{i}"
        base, k = name, 1
        while name in out:
            name, k = f"{base}_{k}", k + 1
        out.append(name)
    return out


def _guess(con: Any, f: str, delimiter: str | None) -> Dialect:
    found = sniff(con, f, delimiter)
    if found is not None:
        return Dialect(delimiter=delimiter or found.delimiter, quote=found.quote or '"',
                       escape=found.escape if found.quote else '"', header=found.header, skip=found.skip,
                       comment=found.comment, columns=found.columns)
    if delimiter:
        return Dialect(delimiter=delimiter)
    with open_binary(f) as fh:
        sample = [s for s in fh.read(65536).decode("utf-8", "replace").splitlines()[:50] if s.strip()]

    def score(c: str) -> tuple[int, int]:
        h = sample[0].count(c) if sample else 0
        return (sum(1 for s in sample if s.count(c) == h) if h else -1, -DELIMITERS.index(c))

    return Dialect(delimiter=max(DELIMITERS, key=score))


def csv_reader(con: Any, spec: Any, files: list[str]) -> FastRead:
    """DuckDB's read of CSV files with the dialect its sniffer finds in the first (a DuckDB error
    when even the sniffer gives up: the files are then read line by line)."""
    dialect = sniff(con, files[0], spec.csv_delimiter)
    if dialect is None:
        import duckdb

        raise duckdb.InvalidInputException("the CSV sniffer cannot read the first file")
    options = csv_options(dialect, spec.csv_delimiter)
    return FastRead(f"read_csv(getvariable('sb_files'), union_by_name = true, filename = true{options}) "
                    "WITH ORDINALITY", "ordinality", spec.csv_delimiter or dialect.delimiter)


def stage_csv(con: Any, spec: Any, files: list[str], scratch: Path) -> Staged:
    delimiter = spec.csv_delimiter
    import pyarrow as pa

    wanted = wanted_columns(spec)
    first = _guess(con, files[0], delimiter)
    csv.field_size_limit(max(csv.field_size_limit(), _MAX_RECORD_CHARS))  # DuckDB's limit is larger than 128 KiB
    columns: list[str] = []
    staged: list[str] = []
    bad_rows = 0
    for i, f in enumerate(files):
        dialect = first if i == 0 else dataclasses.replace(first, columns=())
        parser, tally = _CsvParser(dialect), Tally(f)
        out = scratch / f"csv-{i:06d}.parquet"
        with open_binary(f) as fh:
            src = _Pushback(physical_lines(fh))
            head = next(parser.records(src, None), None)
            names = _csv_names(f, head, dialect)
            columns += [c for c in names if c not in columns]
            present = {c: names.index(c) for c in wanted if c in names}
            schema = staged_schema([(c, pa.string()) for c in present])
            writer = RowWriter(out, schema)
            data = parser.records(src, len(names))
            if head is not None and not dialect.header:  # no header: the first record is data
                data = itertools.chain([head], data)
            for n, fields, why in data:
                row: dict[str, Any] = {"_sb_file": i, "_sb_line": n, "_sb_error": None}
                if fields is None or len(fields) != len(names):
                    why = why or f"expected {len(names)} fields, found {len(fields or [])}"
                    row["_sb_error"] = f"unparsable_row: line {n}: {why}"
                else:
                    values = {c: (fields[j] if fields[j] != "" else None) for c, j in present.items()}
                    row["_sb_error"] = check_values(values, n, spec)
                    row.update(values)
                tally.count(n, row["_sb_error"])
                writer.add(row)
            writer.close()
        bad_rows += tally.check()
        staged.append(str(out))
    con.execute("SET VARIABLE sb_staged = ?", [staged])
    con.execute("CREATE OR REPLACE TEMP VIEW src AS SELECT * FROM read_parquet(getvariable('sb_staged'), "
                "union_by_name = true)")
    return Staged(columns=columns, bad_rows=bad_rows, delimiter=first.delimiter)


def _csv_names(f: str, head: tuple[int, list[str] | None, str] | None, d: Dialect) -> list[str]:
    """Column names from the header record, or generated (``column0`` ...) without a header."""
    if head is None:
        raise InputError(f"input file {f} has no rows (not even a header): re-export it or remove it from input")
    n, fields, why = head
    if fields is None:
        raise InputError(f"cannot read the header of input file {f} (line {n}: {why}): check the file and "
                         "its delimiter")
    if not d.header:
        return list(d.columns) if len(d.columns) == len(fields) else [f"column{i}" for i in range(len(fields))]
    bad = next((b for v in fields if (b := bad_utf8(v))), None)
    if bad:
        raise InputError(f"the header of input file {f} is not valid UTF-8 ({bad}): save the file as UTF-8")
    return _names([v.strip() for v in fields])
