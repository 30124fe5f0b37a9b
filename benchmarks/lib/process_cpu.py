"""CPU seconds of a `vllm serve` by process, read before and after an arm (``server/frontend_cpu``,
``server/server_stats``): what the frontend spends apart from the engine core and its workers."""

from __future__ import annotations

from typing import Any


def cpu_by_process(proc: Any) -> dict[str, float]:
    """CPU seconds by process: the frontend (the `vllm serve` process) and its children by name."""
    import psutil

    out: dict[str, float] = {}
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            name = "frontend" if p.pid == proc.pid else p.name()
            out[name] = out.get(name, 0.0) + t.user + t.system
        except psutil.Error:
            continue
    return out
