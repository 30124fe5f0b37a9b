"""The offline backend: ``vllm.LLM`` in this process, or one per data-parallel GPU group.

Modules: :mod:`.vllm_offline` (the engine), :mod:`.llm_start` (starting ``vllm.LLM`` with its
processes owned), :mod:`.reasoning_offline` (two-phase thinking then answering),
:mod:`.data_parallel` (one engine per GPU group, each in a worker process) and
:mod:`.worker_process` (the worker side).

May import: ``errors``, ``spec``, ``home``; ``engines`` base modules, :mod:`..platform`,
:mod:`..answers`. Not :mod:`..server`.
"""
