"""Running shards: from a shard's rows to its committed labeled file and its numbers.

Modules:

- :mod:`.runner`: drop duplicates, answer what the result store holds, stream the rest through one engine;
- :mod:`.open_shard`: one shard in flight, its answers written as rows;
- :mod:`.finish`: a shard's end up to its commit on the box, and its share of the run's time;
- :mod:`.feed`: the engine's requests in order, the next shards opened while the engine starts;
- :mod:`.claims`: which shards a run may take: locks, and a bucket home's claims;
- :mod:`.rows`: one row's way: checked, rendered, its answer parsed, the output row;
- :mod:`.records`: typed records that cross rooms: output rows, shard statistics, progress reports, attempts;
- :mod:`.totals`: typed records of a version's totals: the bill, the analytics' headline, status, the run summary;
- :mod:`.checkpoint`: part files, the flush timer and the every-row-exactly-once finalize;
- :mod:`.attempts`: every attempt's bill, failed and killed ones included;
- :mod:`.brake`: the brake that stops a run over its max cost or at its deadline;
- :mod:`.pace`: rows done and the rate behind the ETA and the brake's forecast;
- :mod:`.result_store`: the result store that pays once per answer;
- :mod:`.shard_stats`: each shard's statistics;
- :mod:`.progress`: the run's progress reports;
- :mod:`.metrics`: ``run_metrics`` in the job's DuckDB file, lock-safe across processes;
- :mod:`.views`: the analytics views and tables, on any connection;
- :mod:`.query`: the locked in-memory database ``sparkbatch sql`` reads;
- :mod:`.reliability`: confidence buckets, shared with the estimate;
- :mod:`.truth`: what counts as a row's truth (a gold value that says something), in Python and SQL;
- :mod:`.calibration_map`: a fitted confidence calibration, applied to rows and in the views' SQL;
- :mod:`.human_labels`: the reviewers' labels imported from an annotation tool, append-only in the home;
- :mod:`.review_marks`: a row's calibrated confidence and a reviewer's label over the model's, as a run writes it;
- :mod:`.review_queue`: the review cut: ``review_below``, or the share of rows a review budget queues;
- :mod:`.review_members`: the rows ever queued for review and those dismissed, append-only;
- :mod:`.review_store`: a writer's repair of damaged calibration, threshold and label files;
- :mod:`.cascade`: a cascade of models as one engine;
- :mod:`.table_sink`: the committed rows as a Delta Lake table, synced from the commits;
- :mod:`.batch_export`: a batch-file job's rows as the provider's result and error files;
- :mod:`.batch_lines`: those files' lines (OpenAI Batch, Anthropic Message Batches) as typed records;
- :mod:`.batch_errors`: a request's error as each provider words it (OpenAI's codes and params).

Knows nothing of Dagster.

May import: ``errors``, ``spec``, ``home``, ``inputs``, ``engines``.
"""
