"""What the GPU and a `vllm serve` were doing during one arm (``throughput.py --sample``).

Two samplers, each a context manager that yields a dict filled when the block ends:

- :func:`gpu_samples`: ``nvidia-smi`` every 200 ms: the SM clock, GPU utilization, power and
  temperature over the arm (mean, and the lowest clock). Two rounds of the same arm that differ by
  a quarter in time while the GPU's clock or power differ too point at the machine, not the code.
- :func:`server_samples`: the server's ``/metrics`` every 250 ms: requests running and waiting,
  KV-cache use, per second of the arm, and the preemptions and tokens over it. A batch below
  ``max_num_seqs`` with nothing waiting means the client did not keep the server full; a full
  batch that is slow means the server's side (its engine, its frontend, the GPU).

Sampling runs in threads of this process and costs it almost nothing (a few requests a second).

Two more for ``throughput.py --profile DIR``, to tell where the first seconds of an arm go:

- :func:`gc_pauses`: this process's garbage collections over the block (count and seconds by
  generation, when each full one began and whether the run had the heap frozen then), from
  ``gc.callbacks``.
- :func:`py_spy`: ``py-spy record`` (when on PATH) of a process for the block's first seconds, as
  collapsed stacks per thread, without pausing it; for a server, its engine core too.

:func:`profiled` runs both for an arm as ``--profile`` asks, and :class:`LabelRoutes` keeps what
the engines logged of each arm's label rows (``label_tokens.Tally.report``).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import re
import shutil
import statistics
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from sparkbatch_dagster.engines.platform import heap

GPU_FIELDS = ("clocks.sm", "utilization.gpu", "power.draw", "temperature.gpu")
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
COUNTERS = ("vllm:num_preemptions_total", "vllm:generation_tokens_total", "vllm:prompt_tokens_total")
_LINE = re.compile(r"^(vllm:[a-z_]+)(?:\{[^}]*\})? ([0-9.eE+-]+)$")


@contextmanager
def gpu_samples() -> Iterator[dict[str, Any]]:
    """The GPU's clock, utilization, power and temperature while the block runs (empty without nvidia-smi)."""
    summary: dict[str, Any] = {}
    if shutil.which("nvidia-smi") is None:
        yield summary
        return
    proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader,nounits",
                             "-lms", "200"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        yield summary
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
        rows = []
        for line in out.splitlines():
            try:
                rows.append([float(x) for x in line.split(",")][: len(GPU_FIELDS)])
            except ValueError:  # "[N/A]" or a cut line
                continue
        if rows:
            cols = list(zip(*rows, strict=False))
            summary.update({f"mean_{name.replace('.', '_')}": round(statistics.fmean(col), 1)
                            for name, col in zip(GPU_FIELDS, cols, strict=False)})
            summary.update(min_clocks_sm=min(cols[0]), samples=len(rows))


def _scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=2) as r:  # noqa: S310 - loopback
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m and (m.group(1) in GAUGES or m.group(1) in COUNTERS):
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


@contextmanager
def server_samples(url: str) -> Iterator[dict[str, Any]]:
    """The server's batch while the block runs: per second, mean requests running and waiting
    and KV-cache use; over the block, the counters' deltas."""
    summary: dict[str, Any] = {}
    samples: list[tuple[float, dict[str, float]]] = []
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            with suppress(OSError):
                samples.append((time.perf_counter(), _scrape(url)))
            stop.wait(0.25)

    began = time.perf_counter()
    thread = threading.Thread(target=loop, name="bench-server-samples", daemon=True)
    thread.start()
    try:
        yield summary
    finally:
        stop.set()
        thread.join(5)
        if samples:
            summary.update(_summarize(samples, began))


def _summarize(samples: list[tuple[float, dict[str, float]]], began: float) -> dict[str, Any]:
    first, last = samples[0][1], samples[-1][1]
    out: dict[str, Any] = {"samples": len(samples)}
    out.update({name.split(":")[1]: round(last.get(name, 0) - first.get(name, 0)) for name in COUNTERS})
    busy = [s for _, s in samples if s.get("vllm:num_requests_running", 0) > 0]
    for name in GAUGES:
        values = [s.get(name, 0.0) for s in busy]
        out["mean_" + name.split(":")[1] + "_while_busy"] = round(statistics.fmean(values), 3) if values else None
    by_second: dict[int, list[dict[str, float]]] = {}
    for t, s in samples:
        by_second.setdefault(int(t - began), []).append(s)
    out["by_second"] = [[second] + [round(statistics.fmean(s.get(name, 0.0) for s in group), 2) for name in GAUGES]
                        for second, group in sorted(by_second.items())]
    out["by_second_columns"] = ["second", *(name.split(":")[1] for name in GAUGES)]
    return out


@contextmanager
def gc_pauses() -> Iterator[dict[str, Any]]:
    """This process's garbage collections while the block runs: per generation, how many and how long."""
    summary: dict[str, Any] = {}
    started: list[float] = []
    spent: dict[int, list[float]] = {}
    full_at: list[float] = []  # when each full (generation 2) collection began, from the block's start
    full_state: list[list[Any]] = []
    began = time.perf_counter()

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(time.perf_counter())
            if info["generation"] == 2:
                full_at.append(round(started[-1] - began, 2))
                # Whether the run had the heap frozen then (engines/platform/heap.py), and how much was.
                full_state.append([heap.is_frozen(), gc.get_freeze_count(), gc.isenabled()])
        elif started:
            spent.setdefault(info["generation"], []).append(time.perf_counter() - started.pop())

    gc.callbacks.append(callback)
    try:
        yield summary
    finally:
        gc.callbacks.remove(callback)
        summary.update({f"gen{g}": {"collections": len(xs), "s": round(sum(xs), 3), "max_s": round(max(xs), 3)}
                        for g, xs in sorted(spent.items())})
        summary.update(gen2_at_s=full_at, frozen_objects=gc.get_freeze_count(), gen2_state=full_state,
                       gen2_state_columns=["run_froze", "frozen_objects", "gc_enabled"])


@contextmanager
def py_spy(pid: int, seconds: float, path: str, subprocesses: bool = False) -> Iterator[None]:
    """``py-spy record`` of ``pid`` for the block's first ``seconds`` into ``path`` (collapsed
    stacks, one line per stack and thread); nothing without py-spy on PATH."""
    exe = shutil.which("py-spy")
    if exe is None:
        yield
        return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    cmd = [exe, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "100", "--format", "raw",
           "--threads", "--nonblocking", "--output", path, *(["--subprocesses"] if subprocesses else [])]
    log = open(path + ".log", "w")  # noqa: SIM115 - closed below, after py-spy ends
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield
    finally:
        try:
            proc.wait(timeout=seconds + 30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


class LabelRoutes(logging.Handler):
    """The label rows' routes as the engines log them (``label_tokens.Tally.report``): how many
    one-step answers were asked again with the grammar, and where the rest went."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.said: list[str] = []
        self.arm = ""  # the arm whose round is running

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("labels in one step"):
            self.said.append(f"{self.arm}: {record.getMessage()}")


@contextlib.contextmanager
def profiled(args: argparse.Namespace, arm: str, n: int, server: Any) -> Iterator[dict[str, Any]]:
    """--profile: the arm's garbage collections here, and py-spy of its first seconds, of this
    process and, for the server arm, of the server's (frontend and engine core)."""
    if not args.profile or arm.removesuffix("_thawed") not in ("pipeline", "server", "server_b"):
        yield {}
        return
    seconds, base = args.profile_seconds, os.path.join(args.profile, f"{arm}-r{n}")
    with contextlib.ExitStack() as stack:
        stack.enter_context(py_spy(os.getpid(), seconds, base + "-client.txt"))
        if arm.startswith("server"):
            stack.enter_context(py_spy(server.pid, seconds, base + "-server.txt", subprocesses=True))
        yield stack.enter_context(gc_pauses())
