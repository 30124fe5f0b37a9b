"""Input -> shards. DuckDB reads the input once, gives each row a stable id, assigns it to a
shard by a hash of that id, and writes one Parquet file per shard.

Bad values stay in the shard and become error rows later; only a missing column, or input
that cannot be read at all, stops the job here. Bad bytes are a row's problem: when DuckDB
cannot read a CSV/JSONL/Parquet input in one go (bytes that are not UTF-8, a broken line, a
ragged row, a stray quote), ``inputs`` re-reads it line by line and every line it cannot use
becomes an error row (``invalid_text: line N``, ``unparsable_row: line N``); a clean input
never pays for that.
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
from ..spec import BATCH_INPUTS, JobSpec, fingerprint
from .batch_input import stage_batch
from .csv_input import stage_csv
from .files import csv_options, delimiter_hint, empty_files, sniff
from .ids import quote_ident, shard_sql  # noqa: F401 - quote_ident: imported from here by run/, estimate/
from .json_input import json_reader, stage_json
from .parquet_input import stage_parquet
from .shard_files import damaged_shards
from .staging import STAGED_COLUMNS, Staged

log = logging.getLogger("sparkbatch")


def _format(spec: JobSpec) -> str:
    if spec.input_format != "auto":
        return spec.input_format
    name = spec.input.lower().split("?")[0]
    for suffix, fmt in ((".parquet", "parquet"), (".csv", "csv"), (".tsv", "csv"), (".jsonl", "json"),
                        (".ndjson", "json"), (".json", "json")):
        if name.endswith(suffix) or name.endswith(suffix + ".gz"):
            return fmt
    raise InputError(f"cannot tell the format of input={spec.input!r}: set input_format to parquet, csv or json")


def connect(memory_limit: str = "1GB") -> Any:
    """A DuckDB connection with bounded memory (large sorts spill to disk instead)."""
    import duckdb

    con = duckdb.connect()
    con.execute(f"SET memory_limit = '{memory_limit}'")
    con.execute("SET preserve_insertion_order = true")
    return con


def _register_fsspec(con: Any, url: str) -> None:
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme and scheme not in ("file", "http", "https", "s3", "gs", "gcs", "az", "hf"):
        import fsspec

        con.register_filesystem(fsspec.filesystem(scheme))


def source_files(con: Any, spec: JobSpec) -> list[str]:
    _register_fsspec(con, spec.input)
    files = [r[0] for r in con.execute("SELECT file FROM glob(?) ORDER BY file", [spec.input]).fetchall()]
    if not files:
        raise InputError(f"input={spec.input!r} matches no files: check the path or glob")
    return files


def input_signature(spec: JobSpec) -> str:
    """The signature a sharding of the input as it is now would carry (its files' digests and
    the sharding settings), without sharding it: to tell whether a manifest is current."""
    return _signature(spec, source_files(connect(), spec))


def _signature(spec: JobSpec, files: list[str]) -> str:
    """Fingerprint of the input's CONTENT and how it is sharded. A touched file keeps it (no
    re-run, no paying twice for the same answers); changed bytes change it. File names stay in,
    in order: generated row ids follow the file order."""
    parquet = _format(spec) == "parquet"
    digests = [[f, _remote_digest(f) if _is_remote(f) else _local_digest(f, parquet)] for f in files]
    payload = {"files": digests, "id": spec.id_column, "text": spec.text_columns, "gold": spec.gold_column,
               "shards": (spec.shard_count, spec.shard_size)}
    if spec.csv_delimiter:  # only when set, so the signatures of existing jobs stay as they are
        payload["csv_delimiter"] = spec.csv_delimiter
    if spec.input_format in BATCH_INPUTS:  # the same file read as requests is another input
        payload["format"] = spec.input_format
    return fingerprint(payload)


def _is_remote(f: str) -> bool:
    return "://" in f and not f.startswith("file://")


def _local_digest(f: str, parquet: bool) -> str | None:
    from ..home.digests import file_digest, parquet_footer_digest

    path = Path(f.removeprefix("file://"))
    if not path.exists():  # gone since the glob: DuckDB's read reports it properly
        return None
    # Parquet: the footer is enough and costs one seek on a huge file; CSV/JSONL: every byte (cached).
    return parquet_footer_digest(path) if parquet else file_digest(path)


def _remote_digest(url: str) -> str | None:
    from ..home.digests import info_checksum, object_info

    try:
        info = object_info(url)
    except (ImportError, OSError, ValueError) as exc:
        # DuckDB can read it but fsspec cannot stat it (e.g. s3fs not installed): only the name
        # is left, so a changed object goes unnoticed. Say so rather than fail a readable input.
        log.warning("cannot stat %s (%s): changes to it will not start a new output version", url, exc)
        return None
    checksum = info_checksum(info)
    if checksum is not None:
        return checksum
    # FALLBACK, NOT CONTENT: this store gives no checksum, so size + modification time stand in.
    # A touched object starts a new version here; a same-size rewrite with the same time is missed.
    stamps = ("mtime", "LastModified", "last_modified", "updated", "modified", "created")
    mtime = next((info[k] for k in stamps if info.get(k)), None)
    return f"size:{info.get('size')}:mtime:{mtime}"


def _reader(con: Any, spec: JobSpec, fmt: str, csv_options: str = "") -> str:
    if fmt == "json":  # the id column read as text, whatever its values' JSON types
        return json_reader(con, "sb_files", spec, filename=True) + " WITH ORDINALITY"
    return {
        "parquet": "read_parquet(getvariable('sb_files'), union_by_name = true, filename = true, "
        "file_row_number = true)",
        "csv": f"read_csv(getvariable('sb_files'), union_by_name = true, filename = true{csv_options}) "
        "WITH ORDINALITY",
    }[fmt]


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
    signature = _signature(spec, files)
    old = home.read_manifest()
    if old and old.get("signature") == signature:
        damaged = damaged_shards(home, old["keys"], old.get("rows"))
        if not damaged:
            return {**old, "reused": True}
        # Shard files are derived from the input: made again, the same rows in the same shards.
        log.warning("%s: the input is sharded again (the same input: nothing done is labeled again)",
                    "; ".join(damaged[:3]))

    started = time.perf_counter()
    fmt = _format(spec)
    con.execute("SET VARIABLE sb_files = ?", [files])  # file names stay parameters, never SQL text
    tmp = home.shards_dir.with_name(f".shards-tmp-{os.getpid()}")
    scratch = home.shards_dir.with_name(f".input-tmp-{os.getpid()}")
    try:
        try:
            if fmt in BATCH_INPUTS:  # a provider batch file: always line by line, each line checked
                scratch.mkdir(parents=True, exist_ok=True)
                staged = stage_batch(con, spec, files, scratch)
                rows, k, sql = _write_tmp(con, spec, fmt, files, tmp, staged.order, staged, None)
            else:
                rows, k, sql = _read_in_one_go(con, spec, fmt, files, tmp)
        except Exception as exc:
            if fmt in BATCH_INPUTS or not _input_problem(exc):
                raise
            # Bad bytes, a broken line, a ragged row, a stray quote: re-read line by line.
            log.warning("DuckDB cannot read %s in one go (%s): reading it line by line", spec.input,
                        str(exc).splitlines()[0][:300])
            shutil.rmtree(scratch, ignore_errors=True)
            scratch.mkdir(parents=True)
            staged = _stage(con, spec, fmt, files, scratch)
            rows, k, sql = _write_tmp(con, spec, fmt, files, tmp, staged.order, staged, staged.delimiter)
        keys = [shard_key(i) for i in range(k)]
        _move_shards(con, tmp, home, keys, sql)
    finally:  # on any failure too (a full disk mid-COPY): no half-written folder stays in the home
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
    manifest = {
        "signature": signature, "input": spec.input, "files": files, "format": fmt, "rows": rows,
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


def _read_in_one_go(con: Any, spec: JobSpec, fmt: str, files: list[str], tmp: Path) -> tuple[int, int, str]:
    """The fast path: DuckDB reads the input once, as it is."""
    options, delimiter = "", spec.csv_delimiter
    if fmt == "csv":
        dialect = sniff(con, files[0], delimiter)
        if dialect is None:
            import duckdb

            raise duckdb.InvalidInputException("the CSV sniffer cannot read the first file")
        options = csv_options(dialect, delimiter)
        delimiter = delimiter or dialect.delimiter
    con.execute(f"CREATE OR REPLACE TEMP VIEW src AS SELECT * FROM {_reader(con, spec, fmt, options)}")
    # Parquet gives exact (file, row) positions; for CSV/JSON the reader's ordinality is the row order.
    order = "filename, file_row_number" if fmt == "parquet" else "ordinality"
    return _write_tmp(con, spec, fmt, files, tmp, order, None, delimiter)


def _stage(con: Any, spec: JobSpec, fmt: str, files: list[str], scratch: Path) -> Staged:
    if fmt == "csv":
        return stage_csv(con, spec, files, scratch, spec.csv_delimiter)
    if fmt == "json":
        return stage_json(con, spec, files, scratch)
    return stage_parquet(con, spec, files, scratch)


def _write_tmp(con: Any, spec: JobSpec, fmt: str, files: list[str], tmp: Path, order: str,
               staged: Staged | None, delimiter: str | None) -> tuple[int, int, str]:
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
        fix = delimiter_hint(shown, missing, delimiter) if fmt == "csv" and delimiter else \
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
