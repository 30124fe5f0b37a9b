"""Whether a home's shard files are whole: they are derived from the input, so one found missing,
truncated or holding other rows than the manifest counts is made again by the next sharding
(``shards.build_shards``), and a read names it with that fix rather than failing on it."""

from __future__ import annotations

from ..home import JobHome


def damaged_shards(home: JobHome, keys: list[str], rows: int | None = None) -> list[str]:
    """What is wrong with the home's shard files of ``keys``, one line each (empty: all whole):
    missing, unreadable (truncated), or, given the manifest's ``rows``, a different row count."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out, counted = [], 0
    for key in keys:
        path = home.shard_path(key)
        try:
            counted += pq.read_metadata(path).num_rows
        except FileNotFoundError:
            out.append(f"{path} is missing")
        except (OSError, pa.ArrowInvalid) as exc:
            out.append(f"{path} is damaged ({str(exc).splitlines()[0]})")
    if not out and rows is not None and counted != rows:
        out.append(f"the shard files in {home.shards_dir} hold {counted} rows, the manifest says {rows}")
    return out
