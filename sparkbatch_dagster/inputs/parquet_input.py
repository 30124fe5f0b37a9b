"""Parquet: DuckDB's one-go read (:func:`parquet_reader`) and :func:`stage_parquet`, where string
values that are not UTF-8 become error rows; :func:`stage_columnar` is that row-by-row read for any
columnar file pyarrow reads in batches (Arrow IPC too: ``arrow_input.py``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from ..errors import InputError
from .files import open_binary
from .staging import BATCH_ROWS, FastRead, Staged, Tally, staged_schema, wanted_columns

#: ``open(fh)``: a columnar file's schema and a function giving its batches of the named columns.
Opener = Callable[[IO[bytes]], tuple[Any, Callable[[list[str]], Iterator[Any]]]]


def parquet_reader(con: Any, spec: Any, files: list[str]) -> FastRead:
    """DuckDB's read of Parquet files: exact (file, row) positions give the row order."""
    return FastRead("read_parquet(getvariable('sb_files'), union_by_name = true, filename = true, "
                    "file_row_number = true)", "filename, file_row_number")


def _open_parquet(fh: IO[bytes]) -> tuple[Any, Callable[[list[str]], Iterator[Any]]]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(fh)
    return pf.schema_arrow, lambda present: pf.iter_batches(columns=present, batch_size=BATCH_ROWS)


def stage_parquet(con: Any, spec: Any, files: list[str], scratch: Path) -> Staged:
    """Copy the wanted columns; a string value that is not UTF-8 becomes NULL and its row an
    ``invalid_text: row N`` error row (DuckDB refuses the whole file otherwise)."""
    return stage_columnar(con, spec, files, scratch, "Parquet", _open_parquet)


def stage_columnar(con: Any, spec: Any, files: list[str], scratch: Path, kind: str, open_file: Opener) -> Staged:
    """The wanted columns of columnar files (``open_file`` reads one, ``kind`` names the format in
    errors) staged batch by batch, each string value checked: not UTF-8, it becomes NULL and its
    row an ``invalid_text: row N`` error row."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    wanted = wanted_columns(spec)
    columns: list[str] = []
    staged: list[str] = []
    bad_rows = 0
    for i, f in enumerate(files):
        tally = Tally(f)
        out = scratch / f"columnar-{i:06d}.parquet"
        try:
            with open_binary(f) as fh:
                schema_in, batches = open_file(fh)
                names = schema_in.names
                columns += [c for c in names if c not in columns]
                present = [c for c in wanted if c in names]
                schema = staged_schema([schema_in.field(c) for c in present])
                with pq.ParquetWriter(out, schema) as writer:
                    offset = 0
                    for batch in batches(present):
                        writer.write_batch(_fix_batch(batch, present, spec, i, offset, tally, schema))
                        offset += batch.num_rows
        except (pa.ArrowException, OSError) as exc:
            raise InputError(f"cannot read input file {f} as {kind} ({str(exc).splitlines()[0]}): "
                             "re-export it") from None
        bad_rows += tally.check()
        staged.append(str(out))
    con.execute("SET VARIABLE sb_staged = ?", [staged])
    con.execute("CREATE OR REPLACE TEMP VIEW src AS SELECT * FROM read_parquet(getvariable('sb_staged'), "
                "union_by_name = true)")
    return Staged(columns=columns, bad_rows=bad_rows)


def _fix_batch(batch: Any, present: list[str], spec: Any, file_idx: int, offset: int, tally: Tally,
               schema: Any) -> Any:
    import pyarrow as pa

    n = batch.num_rows
    errors: list[str | None] = [None] * n
    arrays = []
    for col in present:
        arr = batch.column(col)
        if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
            try:
                arr.validate(full=True)
            except pa.ArrowInvalid:
                binary = pa.large_binary() if pa.types.is_large_string(arr.type) else pa.binary()
                values = []
                for j, raw in enumerate(arr.view(binary).to_pylist()):
                    try:
                        values.append(None if raw is None else raw.decode("utf-8"))
                    except UnicodeDecodeError as exc:
                        values.append(None)
                        errors[j] = errors[j] or (f"invalid_text: row {offset + j + 1}: column {col!r} is not "
                                                  f"valid UTF-8 (byte 0x{raw[exc.start]:02X} at byte {exc.start + 1})")
                arr = pa.array(values, arr.type)
        arrays.append(arr)
    if any(errors):
        keep = [e is None for e in errors]
        for k, col in enumerate(present):
            if col in spec.text_columns:  # an error row carries no text
                arrays[k] = pa.array([v if ok else None for v, ok in zip(arrays[k].to_pylist(), keep, strict=True)],
                                     arrays[k].type)
    for j, e in enumerate(errors):
        if e:
            tally.count(offset + j + 1, e)
    tally.good += n - sum(1 for e in errors if e)
    arrays += [pa.array([file_idx] * n, pa.int32()), pa.array(range(offset + 1, offset + n + 1), pa.int64()),
               pa.array(errors, pa.string())]
    return pa.record_batch(arrays, schema=schema)
