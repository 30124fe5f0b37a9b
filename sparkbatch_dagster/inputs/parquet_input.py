"""Parquet: :func:`stage_parquet`, string values that are not UTF-8 become error rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import InputError
from .files import diagnose, open_binary
from .staging import _BATCH, Staged, _Tally, _wanted


def stage_parquet(con: Any, spec: Any, files: list[str], scratch: Path) -> Staged:
    """Copy the wanted columns; a string value that is not UTF-8 becomes NULL and its row an
    ``invalid_text: row N`` error row (DuckDB refuses the whole file otherwise)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    wanted = _wanted(spec)
    columns: list[str] = []
    staged: list[str] = []
    bad_rows = 0
    for i, f in enumerate(files):
        diagnose(f, "parquet")
        tally = _Tally(f)
        out = scratch / f"parquet-{i:06d}.parquet"
        try:
            with open_binary(f) as fh:
                pf = pq.ParquetFile(fh)
                names = pf.schema_arrow.names
                columns += [c for c in names if c not in columns]
                present = [c for c in wanted if c in names]
                base = pa.schema([pf.schema_arrow.field(c) for c in present])
                schema = base.append(pa.field("_sb_file", pa.int32())).append(pa.field("_sb_line", pa.int64())) \
                    .append(pa.field("_sb_error", pa.string()))
                with pq.ParquetWriter(out, schema) as writer:
                    offset = 0
                    for batch in pf.iter_batches(columns=present, batch_size=_BATCH):
                        writer.write_batch(_fix_batch(batch, present, spec, i, offset, tally, schema))
                        offset += batch.num_rows
        except (pa.ArrowException, OSError) as exc:
            raise InputError(f"cannot read input file {f} as Parquet ({str(exc).splitlines()[0]}): "
                             "re-export it") from None
        bad_rows += tally.check()
        staged.append(str(out))
    con.execute("SET VARIABLE sb_staged = ?", [staged])
    con.execute("CREATE OR REPLACE TEMP VIEW src AS SELECT * FROM read_parquet(getvariable('sb_staged'), "
                "union_by_name = true)")
    return Staged(columns=columns, bad_rows=bad_rows)


def _fix_batch(batch: Any, present: list[str], spec: Any, file_idx: int, offset: int, tally: _Tally,
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
