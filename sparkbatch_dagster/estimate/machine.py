"""Which kind of machine the sample runs on, and which candidates this platform can run at all.

``sample_machine`` names the kind (``dgx-spark``, ``h200``, ``cpu``, or ``gpu`` for a GPU with
no preset) and describes it in words ("2-core x86_64 CPU", "NVIDIA H200"): a node option on that
kind is priced as measured, any other only as a projection. Asked when an estimate runs (the GPU
name from ``nvidia-smi``, else torch), never at import.
"""

from __future__ import annotations

import platform
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..engines.settings import usable_cores
from ..spec.hardware import PRESET_NAMES

#: GPU name fragments -> hardware preset.
GPU_KINDS = {"GB10": "dgx-spark", "H200": "h200"}
#: Quantizations vLLM's CPU backend runs (its docs: AWQ, GPTQ, compressed-tensors int8/int4); fp8
#: and the 4-bit GPU kernels need a GPU.
CPU_QUANTIZATIONS = frozenset({"awq", "gptq", "compressed-tensors"})


@dataclass(frozen=True)
class Machine:
    """The machine a sample ran on: its kind (a preset name, ``cpu`` or ``gpu``) and a description."""

    kind: str
    description: str


def kind_of_gpu(name: str) -> str:
    """A GPU's name ("NVIDIA GB10", "NVIDIA H200") -> its preset, or ``gpu`` when none matches."""
    return next((kind for part, kind in GPU_KINDS.items() if part in name.upper()), "gpu")


def _gpu_name() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=60, check=True).stdout.strip().splitlines()
        return out[0].strip() if out else None
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        import torch

        return str(torch.cuda.get_device_name(0)) if torch.cuda.is_available() else None
    except Exception:  # no torch, no driver: no GPU
        return None


def cpu_description() -> str:
    return f"{usable_cores()}-core {platform.machine()} CPU"


def sample_machine(declared: str | None, on_cpu: bool, remote: bool = False) -> Machine:
    """The machine the sample runs on: ``declared`` (``EstimateSpec.sample_hardware``) when set;
    else the CPU when vLLM's platform here is the CPU; else this machine's GPU. A sample timed
    on someone else's server (``remote``) with nothing declared is of an unknown kind."""
    if declared:
        return Machine(declared, PRESET_NAMES.get(declared, cpu_description() if declared == "cpu" else declared))
    if remote:
        return Machine("unknown", "the server's machine (set estimate.sample_hardware to name it)")
    if on_cpu:
        return Machine("cpu", cpu_description())
    name = _gpu_name() or "an unnamed GPU"
    return Machine(kind_of_gpu(name), name)


def cannot_run(engine_kwargs: Mapping[str, Any], on_cpu: bool) -> str | None:
    """Why this platform cannot run a candidate with these engine settings (None: it can)."""
    quant = engine_kwargs.get("quantization")
    if on_cpu and quant is not None and quant not in CPU_QUANTIZATIONS:
        return (f"cannot run on this platform: quantization={quant!r} needs a GPU (vLLM's CPU backend runs "
                f"{', '.join(sorted(CPU_QUANTIZATIONS))}); estimate it on a GPU machine")
    return None


__all__ = ["CPU_QUANTIZATIONS", "GPU_KINDS", "Machine", "cannot_run", "kind_of_gpu", "sample_machine"]
