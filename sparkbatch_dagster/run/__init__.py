"""Running shards: from a shard's rows to its committed labeled file and its numbers.

Owns the runner (:mod:`.runner`: drop duplicates, answer what the result store holds, stream
the rest through one engine, commit each shard; :mod:`.open_shard`: one shard in flight;
:mod:`.finish`: a shard's end up to its commit on the box; :mod:`.feed`: the engine's requests,
the next shards opened while the engine starts), which shards a run may take (:mod:`.claims`:
locks, and a bucket home's claims), one row's way (:mod:`.rows`: checked and rendered, its
answer parsed, truncation, the output row), the row-level checkpoints, the flush
timer and the every-row-exactly-once finalize (:mod:`.checkpoint`), every attempt's bill
(:mod:`.attempts`), the brake that stops a run over its max cost or at its deadline
(:mod:`.brake`), the result store that pays once per answer (:mod:`.result_store`), each
shard's statistics and the run's progress reports (:mod:`.shard_stats`, :mod:`.progress`, the
pace behind their ETA: :mod:`.pace`), and
the run metrics and analytics views in the job's DuckDB file (:mod:`.metrics`, :mod:`.views`), the
locked in-memory database ``sparkbatch sql`` reads (:mod:`.query`), and the confidence buckets
they and the estimate share (:mod:`.reliability`). Knows nothing of Dagster.

May import: ``errors``, ``spec``, ``home``, ``inputs``, ``engines``.
"""
