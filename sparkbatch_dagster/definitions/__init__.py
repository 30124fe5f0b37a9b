"""The Dagster surface: what a job looks like to Dagster and ``dg``.

Modules:

- :mod:`.factory`: :func:`build_batch_assets`, the seven assets and their checks;
- :mod:`.review_assets`: the review queue and the human labels as assets, and what analytics learns from gold rows;
- :mod:`.labeling`: what one ``labeled_outputs`` run does, its backfill's other gaps included;
- :mod:`.job`: :class:`BatchJob`: output version, estimate, done partitions, reading the outputs;
- :mod:`.estimating`: the estimate of a built job, as the asset and the CLI run it;
- :mod:`.outputs_io`: the IO manager downstream assets load the outputs through;
- :mod:`.metadata`: the estimate's metadata in the UI;
- :mod:`.events`: per-partition materializations and checks;
- :mod:`.resource`: :class:`VLLMResource`, the engine's settings and lifecycle;
- :mod:`.compile_cache`: the resource's compile cache restored from and saved to the job's home;
- :mod:`.prestart`: an engine started ahead of the run that takes it (``sparkbatch run``);
- :mod:`.cascade`: a job's cascade on its ``VLLMResource``: one resource per stage;
- :mod:`.component`: the ``defs.yaml`` component;
- :mod:`.scaffold`: its ``dg scaffold``;
- :mod:`.deploy`: run pods for dagster-k8s;
- :mod:`.batch_files`: a provider batch file as a job, and its rows as the provider's result files.

May import: every room below it (``errors``, ``spec``, ``home``, ``inputs``, ``engines``,
``run``, ``estimate``); only ``cli`` and ``testing`` build on it.
"""
