"""Where the input is and what it is now: a DuckDB connection that can read it, its files, and the
input's signature (its files' digests and the sharding settings), which tells a manifest still
current from one the input has outgrown."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..spec import JobSpec, fingerprint
from .formats import format_of

log = logging.getLogger("sparkbatch")


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
    return signature(spec, source_files(connect(), spec))


def signature(spec: JobSpec, files: list[str]) -> str:
    """Fingerprint of the input's CONTENT and how it is sharded. A touched file keeps it (no
    re-run, no paying twice for the same answers); changed bytes change it. File names stay in,
    in order: generated row ids follow the file order."""
    footer = format_of(spec).digest == "footer"
    digests = [[f, _remote_digest(f) if _is_remote(f) else _local_digest(f, footer)] for f in files]
    payload = {"files": digests, "id": spec.id_column, "text": spec.text_columns, "gold": spec.gold_column,
               "shards": (spec.shard_count, spec.shard_size)}
    if spec.csv_delimiter:  # only when set, so the signatures of existing jobs stay as they are
        payload["csv_delimiter"] = spec.csv_delimiter
    if format_of(spec).in_signature:  # the same file read as requests is another input
        payload["format"] = spec.input_format
    return fingerprint(payload)


def _is_remote(f: str) -> bool:
    return "://" in f and not f.startswith("file://")


def _local_digest(f: str, footer: bool) -> str | None:
    from ..home.digests import file_digest, parquet_footer_digest

    path = Path(f.removeprefix("file://"))
    if not path.exists():  # gone since the glob: DuckDB's read reports it properly
        return None
    # Parquet: the footer is enough and costs one seek on a huge file; other formats: every byte (cached).
    return parquet_footer_digest(path) if footer else file_digest(path)


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
