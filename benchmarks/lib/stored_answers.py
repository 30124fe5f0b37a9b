"""A result store as big as a long job leaves it, written straight to its segments (random 128-bit
keys, laid out as the runner's shard commits and merges leave them): ``store/store_lookup`` times
lookups against one, ``throughput.py --prefill-store`` runs every pipeline round against one."""

from __future__ import annotations

from sparkbatch_dagster.inputs.shards import connect
from sparkbatch_dagster.run import result_store as results
from sparkbatch_dagster.run.result_store import ResultStore


def segment_sizes(stored: int, shard_rows: int) -> list[tuple[int, int]]:
    """(level, rows) of each segment after ``stored / shard_rows`` shard commits and merges."""
    shards, sizes, level = stored // shard_rows, [], 0
    while shards:
        shards, here = divmod(shards, results.FAN_IN)
        sizes += [(level, shard_rows * results.FAN_IN**level)] * here
        level += 1
    return sizes


def _int64(expr: str) -> str:
    """A uniformly spread UBIGINT hash shifted into BIGINT's range, like the store's key halves."""
    return f"CAST(CAST({expr} AS HUGEINT) - 9223372036854775808 AS BIGINT)"


def build(store: ResultStore, stored: int, shard_rows: int, hits: list[str]) -> float:
    """Write synthetic answers (random 128-bit keys) plus ``hits``; return the store's MB on disk."""
    store.dir.mkdir(parents=True)
    con = connect("2GB")
    offset = 0
    for n, (level, rows) in enumerate(segment_sizes(stored, shard_rows)):
        con.execute(
            f"COPY (SELECT {_int64('hash(i)')} AS k1, {_int64('hash(i + 1e12)')} AS k2, "
            f"'label-' || (i % 40) AS output, "
            f"NULL :: VARCHAR AS error, 120 :: BIGINT AS prompt_tokens, 2 :: BIGINT AS output_tokens, "
            f"'llama-1b@0123456789ab' AS model, '2026-11-30T00:00:00+00:00' AS created_at "
            f"FROM range({offset}, {offset + rows}) t(i)) "
            f"TO '{store.dir}/seg-L{level}-{n:08x}.parquet' (FORMAT parquet)")
        offset += rows
    store.add([{"prompt_key": k, "output": "label-hit", "error": None, "prompt_tokens": 120, "output_tokens": 2,
                "model": "llama-1b@0123456789ab"} for k in hits])
    return sum(f.stat().st_size for f in store.dir.glob("*.parquet")) / 1e6
