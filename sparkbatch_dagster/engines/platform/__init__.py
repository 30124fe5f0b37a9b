"""The machine under an engine: what it has and what an engine start needs from it, knowing nothing of engines.

Modules: :mod:`.memory` (host and GPU memory; unified-memory sizing for the DGX Spark's GB10),
:mod:`.cpu` (the CPU's model name and feature flags), :mod:`.spans` (where a labeling step's time
goes), :mod:`.heap` (Python's heap frozen while the engine generates), :mod:`.orphans` (child
processes that die with their parent), :mod:`.processes` (children started in their own process
group, signalled when this process dies, stopped group and all), :mod:`.model` (embedded models,
identity, weight sizes),
:mod:`.vllm_cli` (the ``vllm`` command line, its environment and version) and
:mod:`.compile_cache` (the compile cache's folder, key and archive on this machine).

May import: ``errors``, ``spec``, ``home``; nothing else of ``engines``.
"""
