"""Data parallel inside one run: one engine per GPU group, each in a process of its own.

:class:`DataParallelEngine` starts a worker process per engine ("spawn": none of this process's
CUDA or vLLM state comes along) whose ``CUDA_VISIBLE_DEVICES`` is its own GPU group before
anything in it imports torch or vLLM (in this process's environment while it starts, and again
first thing in the worker). Each builds what the single-GPU path builds (``offline_worker``:
``VLLMOfflineEngine``, same arguments); they start in parallel, so a run waits for one start.

``generate`` is one stream, as for one engine: requests go in batches to the worker with the
fewest in flight (each at most ``window`` deep), results come back in batches, in completion
order, so the runner's checkpoints, exactly-once, resume and per-partition metrics are those of
one engine.

A worker that dies (killed, its engine failed): what it had in flight is re-sent to the live
workers and the run completes; its results that arrive after that are dropped (never twice).
A request is re-sent once: if its second engine dies too (a request that kills engines), or no
engine is left, it comes back ``retryable`` (the runner writes nothing for it: pending, the
next run retries it); with none left the run fails with ``EngineError``, finished rows kept.
A worker leads its own process group: stopping it stops its vLLM processes too.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing
import multiprocessing.util
import os
import signal
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from multiprocessing.connection import Connection, wait
from typing import Any, cast

from ...errors import EngineError
from ...spec import OutputSpec, SamplingSpec
from ..base import Engine, EngineRequest, EngineResult
from ..settings import environment
from .worker_process import WorkerFactory, worker_main

__all__ = ["DataParallelEngine"]

_ENV_LOCK = threading.Lock()
log = logging.getLogger("sparkbatch")


# --- the parent ------------------------------------------------------------------------------

class _Worker:
    def __init__(self, index: int, process: Any, inbox: Connection, outbox: Connection, env: dict[str, str]) -> None:
        self.index, self.process, self.inbox, self.outbox, self.env = index, process, inbox, outbox, env
        self.pid: int = process.pid
        self.in_flight: dict[str, EngineRequest] = {}
        self.alive, self.ready = True, False
        self.reason = ""  # what the worker said went wrong, if it said

    def send(self, msg: tuple[Any, ...]) -> bool:
        try:
            self.inbox.send(msg)
            return True
        except (OSError, ValueError):  # a broken pipe, or closed already
            return False


class DataParallelEngine(Engine):
    """``len(envs)`` engines built by ``factory(settings)``, each in its own process with its
    environment ``envs[i]`` (``CUDA_VISIBLE_DEVICES``), driven as one :class:`Engine`.

    ``window``: requests in flight per worker at most; ``batch``: requests per message.
    ``start_seconds``: wall time until every worker was ready.
    """

    def __init__(self, factory: WorkerFactory, settings: Any, envs: list[dict[str, str]], *,
                 model_id: str = "", window: int = 4096, batch: int = 256) -> None:
        self.model_id = model_id
        self.window, self.batch = window, max(1, min(batch, window))
        self.workers: list[_Worker] = []
        self._lost: list[EngineResult] = []  # given up on: to yield as retryable
        self._resend: list[EngineRequest] = []  # a dead worker's, for the live ones
        self._moved: set[str] = set()  # re-sent once in this generate: never twice
        self._active: set[int] = set()  # this generate's generations (re-sends after its end get their own)
        self._spec: tuple[Any, ...] = ()  # this generate's (sampling, output)
        self._gens = itertools.count()
        self._next_check = 0.0
        self._last_death = ""
        # Runs at close() or, at the latest, before multiprocessing joins its children at exit.
        self._stop = multiprocessing.util.Finalize(self, _stop_workers, args=(self.workers,), exitpriority=100)
        ctx = multiprocessing.get_context("spawn")
        started = time.perf_counter()
        try:
            for i, env in enumerate(envs):
                their_in, inbox = ctx.Pipe(duplex=False)
                outbox, their_out = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=worker_main, args=(factory, settings, env, their_in, their_out),
                                   name=f"sparkbatch-engine-{i}")
                with _ENV_LOCK, environment(env):
                    proc.start()
                their_in.close()
                their_out.close()
                self.workers.append(_Worker(i, proc, inbox, outbox, env))
            self._wait_ready()
        except BaseException:
            self.close()
            raise
        self.start_seconds = time.perf_counter() - started

    @property
    def pids(self) -> list[int]:
        """The worker processes, in order."""
        return [w.pid for w in self.workers]

    def _wait_ready(self) -> None:
        waiting = {w.outbox: w for w in self.workers}
        while waiting:
            for conn in _ready(list(waiting), 1.0):
                w = waiting.pop(conn)
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    w.process.join(5)
                    msg = ("failed", f"it exited with code {w.process.exitcode}")
                if msg[0] != "ready":
                    raise EngineError(f"engine {w.index} of {len(self.workers)} ({_shown(w.env)}) could not start: "
                                      f"{msg[1]}")
                w.ready = True
            for w in [w for w in waiting.values() if not w.process.is_alive()]:
                raise EngineError(f"engine {w.index} of {len(self.workers)} ({_shown(w.env)}) exited while starting "
                                  f"(code {w.process.exitcode})")

    def generate(
        self, requests: Iterable[EngineRequest], sampling: SamplingSpec, output: OutputSpec
    ) -> Iterator[EngineResult]:
        gen = next(self._gens)
        self._spec, self._active, self._moved = (sampling, output), {gen}, set()
        for w in self._live():
            if not w.send(("begin", gen, sampling, output)):
                self._bury(w, "its pipe is closed")
        source, exhausted, finished = iter(requests), False, False
        try:
            while True:
                sent = False
                if not exhausted:
                    sent, exhausted = self._top_up(source, gen)
                elif self._resend and self._live():
                    sent = self._resend_after_end()
                yield from self._take_lost()
                if exhausted and not self._resend and not any(w.in_flight for w in self.workers):
                    finished = True
                    return
                if not self._live():  # nobody to send the rest to: it stays pending
                    self._lost += [_died(r.id, self._last_death) for r in self._resend]
                    self._resend.clear()
                    yield from self._take_lost()
                    if exhausted:
                        return
                    raise EngineError(f"every engine of this run has died (the last: {self._last_death}); "
                                      "finished rows are kept: run again")
                yield from self._collect(timeout=0.0 if sent else 1.0)
        finally:
            for w in self._live():
                for g in self._active if not finished else ():
                    w.send(("abort", g))  # the caller stopped early: the workers drop what is left
                w.in_flight.clear()
            self._lost.clear()
            self._resend.clear()

    def _live(self) -> list[_Worker]:
        return [w for w in self.workers if w.alive]

    def _top_up(self, source: Iterator[EngineRequest], gen: int) -> tuple[bool, bool]:
        """One batch (re-sent requests first) to the worker with the fewest in flight, if it has
        room: (sent, exhausted)."""
        live = self._live()
        if not live:
            return False, False
        w = min(live, key=lambda w: len(w.in_flight))
        if self.window - len(w.in_flight) < self.batch:
            return False, False
        batch, self._resend = self._resend[:self.batch], self._resend[self.batch:]
        batch += itertools.islice(source, self.batch - len(batch))
        if not batch:
            for other in live:
                other.send(("end", gen))
            return False, True
        self._send(w, gen, batch)
        return True, False

    def _resend_after_end(self) -> bool:
        """Re-sent requests once the workers were told the stream ended: a generation of their
        own on the worker with the fewest in flight (it starts when that worker's current one ends)."""
        w = min(self._live(), key=lambda w: len(w.in_flight))
        g = next(self._gens)
        self._active.add(g)
        batch, self._resend = self._resend[:self.batch], self._resend[self.batch:]
        if w.send(("begin", g, *self._spec)):
            self._send(w, g, batch, end=True)
        else:
            self._resend += batch
            self._bury(w, "its pipe is closed")
        return True

    def _send(self, w: _Worker, gen: int, batch: list[EngineRequest], end: bool = False) -> None:
        w.in_flight.update((r.id, r) for r in batch)
        reqs = [(r.id, r.messages, r.key, r.sampling, r.output, r.tools) for r in batch]
        if not (w.send(("reqs", gen, reqs)) and (not end or w.send(("end", gen)))):
            self._bury(w, "its pipe broke")

    def _collect(self, timeout: float) -> Iterator[EngineResult]:
        by_conn = {w.outbox: w for w in self._live()}
        for conn in _ready(list(by_conn), timeout):
            w = by_conn[conn]
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                self._bury(w, "its pipe closed")
                continue
            yield from self._handle(w, msg)
        if time.monotonic() >= self._next_check:  # a killed worker's pipe may stay open (its children)
            self._next_check = time.monotonic() + 0.5
            for w in self._live():
                if not w.process.is_alive():
                    with contextlib.suppress(EOFError, OSError):
                        while w.outbox.poll(0):  # what it sent before it died counts
                            yield from self._handle(w, w.outbox.recv())
                    self._bury(w, "exited")
        yield from self._take_lost()

    def _handle(self, w: _Worker, msg: tuple[Any, ...]) -> Iterator[EngineResult]:
        if msg[0] == "results" and msg[1] in self._active:
            for fields in msg[2]:
                if w.in_flight.pop(fields[0], None) is not None:  # not one given up on or re-sent: never twice
                    yield EngineResult(*fields)
        elif msg[0] == "failed":
            w.reason = msg[1]

    def _bury(self, w: _Worker, why: str) -> None:
        """A worker is gone: what it had in flight is re-sent to the others (once: a request
        whose second engine dies too, or with no engine left, comes back retryable)."""
        w.alive = False
        with contextlib.suppress(OSError):
            os.killpg(w.pid, signal.SIGKILL)  # what is left of it and of its engine
        w.process.join(5)
        code = w.process.exitcode
        self._last_death = (f"engine {w.index} of {len(self.workers)} (pid {w.pid}, {_shown(w.env)}) "
                            + (f"exited with code {code}" if code is not None else why)
                            + (f": {w.reason}" if w.reason else ""))
        again = [r for rid, r in w.in_flight.items() if rid not in self._moved] if self._live() else []
        self._moved.update(r.id for r in again)
        self._resend += again
        pending = [_died(rid, self._last_death) for rid in w.in_flight if rid not in self._moved]
        self._lost += pending
        w.in_flight.clear()
        log.warning("%s: %d requests it had in flight re-sent to the other engines, %d left pending",
                    self._last_death, len(again), len(pending))

    def _take_lost(self) -> Iterator[EngineResult]:
        while self._lost:
            yield self._lost.pop(0)

    def reset_prefix_cache(self) -> None:
        """Between ``generate`` calls: every worker's vLLM drops its prefix cache (benchmarks)."""
        for w in self._live():
            w.send(("reset_prefix_cache",))

    def close(self) -> None:
        """Stop every worker and its engine (also their vLLM processes); idempotent."""
        self._stop()


def _stop_workers(workers: list[_Worker], grace_s: float = 30.0) -> None:
    """Ask each worker to close its engine; what has not exited after ``grace_s`` (at once, for
    a worker still loading) is terminated, then killed, with its process group."""
    for w in workers:
        w.send(("stop",))
    deadline = time.monotonic() + grace_s
    for w in workers:
        if w.ready:
            w.process.join(max(0.0, deadline - time.monotonic()))
    for w in workers:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(OSError):
                os.killpg(w.pid, sig)  # the worker's group: its engine's processes too
            if w.process.is_alive():
                w.process.terminate() if sig == signal.SIGTERM else w.process.kill()
                w.process.join(10 if sig == signal.SIGTERM else 5)
        w.alive = False
        w.inbox.close()
        w.outbox.close()
    workers.clear()


def _died(rid: str, death: str) -> EngineResult:
    return EngineResult(rid, None, error=f"worker_died: {death}", retryable=True)


def _ready(conns: list[Connection], timeout: float) -> list[Connection]:
    return cast(list[Connection], wait(conns, timeout=timeout))


def _shown(env: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in env.items()) or "no device settings"
