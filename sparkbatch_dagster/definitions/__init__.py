"""The Dagster surface: what a job looks like to Dagster and ``dg``.

Owns the asset factory (:mod:`.factory`: :func:`build_batch_assets`, the five assets and their
checks), what one ``labeled_outputs`` run does, its backfill's other gaps included
(:mod:`.labeling`), :class:`BatchJob` (:mod:`.job`: output version, estimate, done partitions,
``read_outputs``, ``read_run_metrics``, ``duckdb_path``), the IO manager that lets downstream assets
take the outputs as inputs (:mod:`.outputs_io`), the estimate's metadata in the UI
(:mod:`.metadata`), the per-partition materializations and checks (:mod:`.events`), the engine
resource (:mod:`.resource`: :class:`VLLMResource`, the engine's settings and lifecycle; its
compile cache restored from and saved to the job's home, :mod:`.compile_cache`), the
``defs.yaml`` component and its scaffold (:mod:`.component`, :mod:`.scaffold`) and the run-pod
config for dagster-k8s (:mod:`.deploy`).

May import: every room below it (``errors``, ``spec``, ``home``, ``inputs``, ``engines``,
``run``, ``estimate``); only ``cli`` and ``testing`` build on it.
"""
