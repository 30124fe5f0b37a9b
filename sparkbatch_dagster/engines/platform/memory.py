"""Memory an engine may take, read right before it loads: the device's facts, the host's free
memory, and on a unified-memory GPU (the DGX Spark's GB10, or any GPU that reports itself
integrated) the KV cache sized in bytes from what is really free.

Why bytes, not a fraction, on unified memory: CPU and GPU share one pool there, so
``gpu_memory_utilization`` (a fraction of the device total) does not bound vLLM's startup
profiling, which has wedged whole hosts (vllm #46307, #56824), and CUDA's free memory tracks
MemFree, so the page cache counts as used (#48140). ``MemAvailable`` counts reclaimable cache
as free; the KV cache is what it leaves after a reserve, the weights and a headroom
(:func:`size_unified`), passed as ``kv_cache_memory_bytes``.

Tests simulate a GB10 by replacing :func:`device` and :func:`host` (monkeypatch). Nothing here
imports torch or vllm: the device probe runs in a child process (:func:`device`).

Example::

    plan = size_unified(Device("NVIDIA GB10", True, int(121.7 * GIB)), host(), weight_bytes=16 * GIB)
    plan.kwargs({"gpu_memory_utilization": 0.9})  # -> kv_cache_memory_bytes=..., a matching fraction
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...errors import ConfigError

GIB = 2**30
#: What ``memory_reserve_gb=None`` keeps out of an engine's reach on unified memory: the OS,
#: Dagster (webserver, daemon, code server) and this run's process. Measured here (see
#: docs/engine.md, benchmarks/results/cpu-memory-reserve.json): a run process peaks near
#: 0.3 GiB and `dagster dev` holds about 0.7 GiB; DGX OS's own share (a desktop Ubuntu) is not
#: measurable here, so the default keeps a wide margin over those figures.
DEFAULT_RESERVE_GB = 8.0
#: Fixed part of the activation headroom (:func:`headroom_bytes`).
HEADROOM_FIXED = 4 * GIB
#: Share of the weights added to the headroom.
HEADROOM_WEIGHT_SHARE = 0.10


@dataclass(frozen=True)
class Device:
    """GPU 0 of this process, as CUDA reports it. ``integrated``: it shares the host's memory."""

    name: str
    integrated: bool
    total_bytes: int


@dataclass(frozen=True)
class Host:
    """The host's memory (``/proc/meminfo``): MemTotal, MemAvailable, MemFree, in bytes."""

    total: int
    available: int
    free: int


def gib(n: float) -> str:
    """``n`` bytes as GiB with one decimal, for messages."""
    return f"{n / GIB:.1f}"


def host() -> Host:
    """This host's memory now (psutil reads ``/proc/meminfo`` on Linux: ``available`` is
    MemAvailable, which counts reclaimable page cache as free)."""
    import psutil

    mem = psutil.virtual_memory()
    return Host(total=int(mem.total), available=int(mem.available), free=int(mem.free))


_PROBE = (
    "import json, torch\n"
    "if not torch.cuda.is_available(): print('null')\n"
    "else:\n"
    "    p = torch.cuda.get_device_properties(0)\n"
    "    print(json.dumps([p.name, bool(getattr(p, 'is_integrated', False)), int(p.total_memory)]))\n"
)


@functools.lru_cache(maxsize=1)
def device() -> Device | None:
    """GPU 0's name, whether it is integrated, and its total memory; None without a CUDA GPU.

    A discrete GPU is read from NVML (:func:`discrete_from_nvml`: milliseconds, no torch). Any
    other is asked in a child process that imports torch (seconds): CUDA initialized in this
    one would make vLLM spawn its engine core instead of forking it, importing vllm again
    (about 20 s on an H200). Asked once per process. A name with "GB10" counts as integrated
    even where torch does not report the attribute."""
    found = discrete_from_nvml()
    if found is not None:
        return found
    try:
        out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120,
                             check=True).stdout.strip().splitlines()
        facts = json.loads(out[-1]) if out else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None  # no torch or no driver: vLLM will say what is missing when it starts
    return device_from(*facts) if facts else None


def discrete_from_nvml() -> Device | None:
    """GPU 0 of this process as NVML sees it, when NVML can tell it is a discrete GPU: it reports
    memory of its own, its name is no GB10, and this process's GPU 0 is known to be that device
    (``CUDA_VISIBLE_DEVICES`` unset or naming an index or a ``GPU-`` UUID; one model of GPU on the
    box, so CUDA's order and NVML's agree). None otherwise (no NVML, no GPU, a unified-memory GPU
    whose memory NVML reports as not supported, a MIG slice): then the torch probe decides.

    Why not always the probe: it imports torch in a child process, 3 to 5 s of every engine start
    on a GPU box, to learn what NVML says in milliseconds (issue 61)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver
        return None
    try:
        return _first_discrete(pynvml)
    except Exception:  # an NVML without these calls, or one that refuses them: the probe decides
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _first_discrete(nvml: Any) -> Device | None:
    count = int(nvml.nvmlDeviceGetCount())
    if count == 0:
        return None
    names = {_text(nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(i))) for i in range(count)}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    first = visible.split(",")[0].strip() if visible is not None else "0"
    if first.isdigit():
        handle = nvml.nvmlDeviceGetHandleByIndex(int(first))
    elif first.startswith("GPU-"):
        handle = nvml.nvmlDeviceGetHandleByUUID(first)
    else:  # empty (no GPU visible), a MIG slice: not for this shortcut
        return None
    name = _text(nvml.nvmlDeviceGetName(handle))
    if len(names) > 1 or "GB10" in name.upper():
        return None
    total = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)  # raises on unified memory (not supported)
    return Device(name, False, total) if total > 0 else None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def device_from(name: str, integrated: bool, total_bytes: int) -> Device:
    """The facts CUDA reports, with a GB10 counted as integrated whatever the attribute says."""
    return Device(str(name), bool(integrated) or "GB10" in str(name).upper(), int(total_bytes))


def headroom_bytes(weight_bytes: int) -> int:
    """Memory an engine takes besides its weights and KV cache: the CUDA context and cuBLAS
    workspaces, CUDA graphs, the profile run's activations (``max_num_batched_tokens``) and the
    sampler's logits (``max_num_seqs`` x vocabulary): a fixed 4 GiB plus 10% of the weights,
    which covers those terms for models up to 70B at vLLM's default batch sizes. Not measured
    on a GB10 (none is lent here)."""
    return HEADROOM_FIXED + int(HEADROOM_WEIGHT_SHARE * weight_bytes)


def refuse_unless_free(setting: str, need: int, free: int, free_what: str, fix: str) -> None:
    """The one refusal of memory a machine cannot give (CPU backend and unified memory alike):
    a ConfigError naming the setting's value, what it needs, what is free, and the fix."""
    if need > free:
        raise ConfigError(f"{setting} needs {gib(need)} GiB but {gib(free)} GiB {free_what}: {fix}")


@dataclass(frozen=True)
class Plan:
    """An engine's memory on unified memory: the KV cache per rank in bytes, the fraction of the
    device that weights, KV cache and headroom come to (vLLM still checks at start that CUDA's
    free memory covers ``total x gpu_memory_utilization``, its only use once the bytes are
    set), and a line for the log saying how the size was chosen."""

    kv_cache_bytes: int
    fraction: float
    note: str

    def kwargs(self, llm_kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """``llm_kwargs`` with this plan's KV cache size and fraction."""
        return {**llm_kwargs, "kv_cache_memory_bytes": self.kv_cache_bytes, "gpu_memory_utilization": self.fraction}


def size_unified(dev: Device, mem: Host, weight_bytes: int | None, *, reserve_gb: float | None = None,
                 fraction: float | None = None, kv_cache_gb: float | None = None, copies: int = 1,
                 ranks: int = 1) -> Plan:
    """The KV cache on a unified-memory GPU, from what is free now.

    The model: an engine takes weights + KV cache + :func:`headroom_bytes`, and ``copies``
    engines (``ranks`` tensor-parallel ranks each, one KV cache per rank) must fit in
    ``MemAvailable - reserve``. Left unset, each rank's KV cache is what that leaves; a
    configured ``kv_cache_gb`` (per rank) or ``fraction`` (x the device total per engine) is
    taken as asked, or refused when the free memory cannot give it. ``weight_bytes`` is this
    machine's share of the weights (None: unknown, refused unless ``kv_cache_gb`` is set).
    """
    reserve = int((DEFAULT_RESERVE_GB if reserve_gb is None else reserve_gb) * GIB)
    budget = mem.available - reserve
    free_what = (f"are free for it (MemAvailable {gib(mem.available)} GiB minus memory_reserve_gb="
                 f"{reserve / GIB:g}, on {dev.name}'s unified memory)")
    if weight_bytes is None and kv_cache_gb is None:
        raise ConfigError(f"{dev.name} shares its memory with the host, so the KV cache is sized from the weights' "
                          "size, and the model's weights are not on this machine to measure: point model at a local "
                          "folder (huggingface-cli download <name> --local-dir <folder>), or set kv_cache_memory_gb")
    weights = weight_bytes or 0
    extra = ranks * headroom_bytes(weights) + weights
    times = f" x {copies} engines" if copies > 1 else ""
    if kv_cache_gb is not None:
        kv = int(kv_cache_gb * GIB)
        refuse_unless_free(f"kv_cache_memory_gb={kv_cache_gb:g}{times} (with weights and headroom)",
                           copies * (ranks * kv + extra), budget, free_what,
                           f"lower VLLMResource.kv_cache_memory_gb to {_fit_gb(budget, copies, extra, ranks)} or "
                           "leave it unset (sized from the free memory)")
        why = f"kv_cache_memory_gb={kv_cache_gb:g} as configured"
    elif fraction is not None:
        asked = int(fraction * dev.total_bytes)
        refuse_unless_free(f"gpu_memory_utilization={fraction}{times} ({gib(asked)} GiB of {gib(dev.total_bytes)})",
                           copies * asked, budget, free_what,
                           f"lower VLLMResource.gpu_memory_utilization to "
                           f"{math.floor(budget / copies / dev.total_bytes * 100) / 100}, or leave it unset (sized "
                           "from the free memory)")
        kv = (asked - extra) // ranks
        if kv <= 0:
            raise ConfigError(f"gpu_memory_utilization={fraction} ({gib(asked)} GiB) does not hold the weights and "
                              f"headroom ({gib(extra)} GiB): raise it, or leave it unset (sized from the free memory)")
        why = f"gpu_memory_utilization={fraction} x {gib(dev.total_bytes)} GiB, less weights and headroom"
    else:
        kv = (budget // copies - extra) // ranks
        if kv <= 0:
            raise ConfigError(f"memory_reserve_gb={reserve / GIB:g} leaves {gib(budget)} GiB of MemAvailable "
                              f"{gib(mem.available)} GiB on {dev.name}, and the weights and headroom{times} need "
                              f"{gib(copies * extra)} GiB: lower VLLMResource.memory_reserve_gb, stop what else "
                              "holds memory, or use a smaller model")
        why = "MemAvailable - reserve - weights - headroom"
    used = ranks * kv + extra
    note = (f"unified memory ({dev.name}): KV cache {gib(kv)} GiB per rank (kv_cache_memory_bytes={kv}) = {why}; "
            f"MemAvailable {gib(mem.available)} GiB, reserve {reserve / GIB:g} GiB, weights {gib(weights)} GiB, "
            f"headroom {gib(extra - weights)} GiB")
    if mem.free < copies * used:  # what vLLM's own start check may see as free (#48140)
        note += (f"; MemFree is {gib(mem.free)} GiB (the rest is page cache): if vLLM says free memory is less than "
                 "desired, drop the cache (sync; echo 1 | sudo tee /proc/sys/vm/drop_caches)")
    return Plan(kv, min(0.98, math.ceil(used / dev.total_bytes * 1000) / 1000), note)


def _fit_gb(budget: int, copies: int, extra: int, ranks: int) -> str:
    return f"{max(0.0, math.floor((budget / copies - extra) / ranks / GIB * 10) / 10):g}"


def free_line(mem: Host | None = None) -> str:
    """``MemAvailable X of Y GiB`` for the engine's log lines."""
    mem = mem or host()
    return f"MemAvailable {gib(mem.available)} of {gib(mem.total)} GiB"
