"""The machine a result file names (its ``"machine"``): one description for every script here.

    NVIDIA H100 80GB HBM3 x1, 16 cores      the GPUs the run sees (nvidia-smi's names), and the host's cores
    2-core AMD EPYC                         a run on the CPU: its cores and its model (/proc/cpuinfo)

``machine()`` says the first where a GPU is visible, the second otherwise; ``machine(cpu_only=True)``
the second always, for what runs on the CPU whatever the host has (a fake engine, the store, a
test run). Files written before this module hold the forms the scripts wrote on their own
('NVIDIA H200 x1', 'NVIDIA H200', 'x86_64 CPU, 2 cores', '2-core CPU', '2-core x86_64 CPU',
'x86_64, 2 cores'); they stay as they are, and ``tools/doc_tables.py`` reads every form.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path


def cpu() -> str:
    """'2-core AMD EPYC': the cores this process may count and the CPU's model name (the
    architecture, 'x86_64', where /proc/cpuinfo does not name it)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    name = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    return f"{os.cpu_count()}-core {name or platform.machine()}"


def gpus() -> list[str]:
    """The names of the GPUs this process sees (``CUDA_VISIBLE_DEVICES`` by index or UUID where
    it is set), as nvidia-smi gives them; none without nvidia-smi (nothing started then)."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    cards = [[part.strip() for part in line.split(",", 2)] for line in out.splitlines() if line.count(",") >= 2]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        wanted = [v.strip() for v in visible.split(",") if v.strip()]
        cards = [c for c in cards if c[0] in wanted or c[1] in wanted]
    return [c[2] for c in cards]


def machine(cpu_only: bool = False) -> str:
    """'NVIDIA H100 80GB HBM3 x1, 16 cores' where the run sees a GPU (the first one's name, how
    many), else (or with ``cpu_only``) :func:`cpu`'s '2-core AMD EPYC'."""
    names = [] if cpu_only else gpus()
    return f"{names[0]} x{len(names)}, {os.cpu_count()} cores" if names else cpu()
