"""This deployment's engine: one ``VLLMResource`` for the CPU demo box and a GPU box alike.

Memory and concurrency are not chosen here: left at None, they are resolved when the engine
starts (``gpu_memory_utilization`` 0.9 and ``max_num_seqs`` 1024 on a GPU, 0.3 and 256 on the
CPU backend). The model is config, ``EnvVar("SPARKBATCH_MODEL")`` (a local HF folder, a hub
name or an embedded model name), read by Dagster when a run starts; without that variable,
the embedded SmolLM2::

    SPARKBATCH_MODEL=/models/my-8b make demo     # a GPU box (install the [gpu] extra)
"""

from __future__ import annotations

import os

from dagster import EnvVar

from sparkbatch_dagster import VLLMResource

#: The context stays at 2,048 tokens on every platform: it is part of the model identity, so
#: the same model answers under the same output version on the CPU box and the GPU box.
vllm = VLLMResource(
    model=EnvVar("SPARKBATCH_MODEL") if os.environ.get("SPARKBATCH_MODEL") else None, max_model_len=2048
)


def vllm_resource() -> VLLMResource:
    """The deployment's resource (``definitions.py``, ``benchmarks/estimate_accuracy.py``)."""
    return vllm
