"""Input -> shards. DuckDB reads the input once, gives each row a stable id, assigns it to a
shard by a hash of that id, and writes one Parquet file per shard.

Bad values stay in the shard and become error rows later; only a missing column, or input
that cannot be read at all, stops the job here. Bad bytes are a row's problem: when DuckDB
cannot read an input in one go (bytes that are not UTF-8, a broken line, a ragged row, a stray
quote), ``inputs`` re-reads it row by row (the format's stager, ``formats.py``) and every row it
cannot use becomes an error row (``invalid_text: line N``, ``unparsable_row: line N``); a clean
input never pays for that. Where the input is and its signature: ``sources.py``.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from ..errors import InputError, storage_error, storage_errors
from ..home import JobHome, atomic_write_text, failpoint, shard_key
from ..spec import JobSpec
from .files import delimiter_hint, empty_files
from .formats import InputFormat, diagnose, format_of
from .ids import quote_ident, shard_sql  # noqa: F401 - quote_ident: imported from here by run/, estimate/
from .shard_files import damaged_shards
from .sources import connect, input_signature, signature, source_files  # noqa: F401 - imported from here too
from .staging import STAGED_COLUMNS, Staged

log = logging.getLogger("sparkbatch")


def build_shards(spec: JobSpec, home: JobHome) -> dict[str, Any]:
    """Shard the input unless the same input was already sharded the same way.

    Concurrent callers (two runs started at once) take turns: the second waits, then finds
    the shards done. Returns the manifest: ``keys``, ``rows``, ``signature``, ``reused``.
    """
    with storage_errors(home.root):  # a full or read-only disk: one line naming the home, not DuckDB's words
        lock = home.shards_lock()
        lock.acquire(wait=True)
        try:
            if home.remote is not None:  # a bucket home: its shards are the ones to reuse
                home.remote.check(write=True)
                home.remote.pull_shards(home)
            manifest = _build_shards(spec, home)
            if home.remote is not None:
                home.remote.publish_shards(home, manifest, lambda: input_signature(spec))
            return manifest
        finally:
            lock.release()


def _build_shards(spec: JobSpec, home: JobHome) -> dict[str, Any]:
    con = connect()
    files = source_files(con, spec)
    current = signature(spec, files)
    old = home.read_manifest()
    if old and old.get("signature") == current:
        damaged = damaged_shards(home, old["keys"], old.get("rows"))
        if not damaged:
            return {**old, "reused": True}
        # Shard files are derived from the input: made again, the same rows in the same shards.
        log.warning("%s: the input is sharded again (the same input: nothing done is labeled again)",
                    "; ".join(damaged[:3]))

    started = time.perf_counter()
    fmt = format_of(spec)
    con.execute("SET VARIABLE sb_files = ?", [files])  # file names stay parameters, never SQL text
    tmp = home.shards_dir.with_name(f".shards-tmp-{os.getpid()}")
    scratch = home.shards_dir.with_name(f".input-tmp-{os.getpid()}")
    try:
        try:
            if fmt.reader is None:  # DuckDB does not read it (a provider batch file, Arrow): row by row
                rows, k, sql = _read_row_by_row(con, spec, fmt, files, tmp, scratch)
            else:
                rows, k, sql = _read_in_one_go(con, spec, fmt, files, tmp)
        except Exception as exc:
            if fmt.reader is None or not _input_problem(exc):
                raise
            # Bad bytes, a broken line, a ragged row, a stray quote: re-read row by row.
            log.warning("DuckDB cannot read %s in one go (%s): reading it line by line", spec.input,
                        str(exc).splitlines()[0][:300])
            shutil.rmtree(scratch, ignore_errors=True)
            rows, k, sql = _read_row_by_row(con, spec, fmt, files, tmp, scratch)
        keys = [shard_key(i) for i in range(k)]
        _move_shards(con, tmp, home, keys, sql)
    finally:  # on any failure too (a full disk mid-COPY): no half-written folder stays in the home
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
    manifest = {
        "signature": current, "input": spec.input, "files": files, "format": fmt.name, "rows": rows,
        "shard_count": k, "keys": keys, "seconds": round(time.perf_counter() - started, 3),
    }
    atomic_write_text(home.manifest_path, _json(manifest), point="write:manifest")
    return {**manifest, "reused": False}


def _input_problem(exc: Exception) -> bool:
    """A DuckDB error about the data: not memory, not a network failure, not a bug."""
    import duckdb

    about_data = (duckdb.InvalidInputException, duckdb.ConversionException, duckdb.IOException)
    # A full or read-only home is an IOException too: reading the input again would not help.
    return (isinstance(exc, about_data) and not isinstance(exc, duckdb.HTTPException)
            and storage_error(exc, None) is None)


def _read_in_one_go(con: Any, spec: JobSpec, fmt: InputFormat, files: list[str], tmp: Path) -> tuple[int, int, str]:
    """The fast path: DuckDB reads the input once, as it is."""
    assert fmt.reader is not None
    read = fmt.reader(con, spec, files)
    con.execute(f"CREATE OR REPLACE TEMP VIEW src AS SELECT * FROM {read.sql}")
    return _write_tmp(con, spec, files, tmp, read.order, None, read.delimiter)


def _read_row_by_row(con: Any, spec: JobSpec, fmt: InputFormat, files: list[str], tmp: Path,
                     scratch: Path) -> tuple[int, int, str]:
    """The slow path (the only one for a format DuckDB does not read): each file checked for being
    of its format at all, then staged row by row, every row a row or an error row."""
    for f in files:
        diagnose(f, fmt)
    scratch.mkdir(parents=True, exist_ok=True)
    staged = _stage(con, spec, fmt, files, scratch)
    return _write_tmp(con, spec, files, tmp, staged.order, staged, staged.delimiter)


def _stage(con: Any, spec: JobSpec, fmt: InputFormat, files: list[str], scratch: Path) -> Staged:
    return fmt.stage(con, spec, files, scratch)


def _write_tmp(con: Any, spec: JobSpec, files: list[str], tmp: Path, order: str, staged: Staged | None,
               delimiter: str | None) -> tuple[int, int, str]:
    """Shard the view ``src`` into ``tmp``; return (rows, shard count, the query)."""
    types = {r[0]: r[1] for r in con.execute("DESCRIBE src").fetchall()}
    wanted = [c for c in [spec.id_column, *spec.text_columns, spec.gold_column] if c]
    missing = [c for c in wanted if c not in (staged.columns if staged else types)]
    if missing:
        hidden = ("filename", "file_row_number", "ordinality", *STAGED_COLUMNS)
        shown = sorted(c for c in (staged.columns if staged else types) if c not in hidden)
        empty = empty_files(files)
        if empty:
            raise InputError(f"input file {empty[0]} is empty (0 bytes): re-export it or remove it from input")
        fix = delimiter_hint(shown, missing, delimiter) if delimiter else \
            "fix id_column/text_columns/gold_column"
        raise InputError(f"input has no column(s) {missing}; it has {shown}: {fix}")

    rows = int(con.execute("SELECT count(*) FROM src").fetchone()[0])
    k = spec.shards_for(rows)
    _warn_empty(spec, rows, k)
    sql = shard_sql(spec, types, order, k, staged is not None, len(files) > 1)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    con.execute(f"COPY ({sql}) TO {_lit(tmp)} (FORMAT parquet, PARTITION_BY (_shard), WRITE_PARTITION_COLUMNS false)")
    return rows, k, sql


def _warn_empty(spec: JobSpec, rows: int, k: int) -> None:
    """Say so when shards must be empty. They are kept, not merged away: the partitions stay the
    ones configured (a partition set that shrank and grew with the row count would orphan done
    partitions), and an empty partition commits at once with 0 rows, costing nothing."""
    if rows == 0:
        log.warning("input %s has 0 rows (only a header, or only blank lines): its %d shard(s) commit empty",
                    spec.input, k)
    elif spec.shard_count is not None and k > rows:
        log.warning("shard_count=%d but the input has only %d rows: at least %d shards are empty (they commit "
                    "with 0 rows); set shard_count to at most %d, or use shard_size", k, rows, k - rows, rows)


def _move_shards(con: Any, tmp: Path, home: JobHome, keys: list[str], sql: str) -> None:
    home.shards_dir.mkdir(parents=True, exist_ok=True)
    home.manifest_path.unlink(missing_ok=True)  # no manifest until every shard is in place
    for old in home.shards_dir.glob("shard-*.parquet"):
        old.unlink()
    for i, key in enumerate(keys):
        parts = sorted((tmp / f"_shard={i}").glob("*.parquet"))
        dest = home.shard_path(key)
        if i == 1:
            failpoint("shards:moving")  # crash tests: half the shards moved, no manifest yet
        if len(parts) == 1:
            os.replace(parts[0], dest)
        elif parts:
            con.execute(f"COPY (SELECT * FROM read_parquet(?)) TO {_lit(dest)} (FORMAT parquet)",
                        [[str(p) for p in parts]])
        else:  # no row hashed here: an empty file with the right columns keeps the contract simple
            con.execute(f"COPY (SELECT * EXCLUDE (_shard) FROM ({sql}) LIMIT 0) TO {_lit(dest)} (FORMAT parquet)")
    shutil.rmtree(tmp, ignore_errors=True)


def _json(obj: Any) -> str:
    import json

    return json.dumps(obj, indent=2)


def _lit(path: object) -> str:
    """A path as a DuckDB string literal (COPY ... TO takes no parameter): a ``'`` in a folder name doubled."""
    return "'" + str(path).replace("'", "''") + "'"
