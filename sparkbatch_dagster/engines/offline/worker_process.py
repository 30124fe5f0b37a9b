"""The worker side of :class:`~sparkbatch_dagster.engines.offline.data_parallel.DataParallelEngine`:
what runs in each engine's own process.

The parent's messages arrive on a pipe (a thread puts them on a local queue), the engine pulls
its requests from that queue, and a sender thread ships results back, those that queued up
meanwhile as one message: the engine never waits for the pipe. Messages, parent to worker:
``("begin", gen, sampling, output)``, ``("reqs", gen, [(id, messages, key, sampling, output), ...])``, ``("end", gen)``,
``("abort", gen)``, ``("reset_prefix_cache",)``, ``("stop",)``; worker to parent: ``("ready", pid, start_seconds)``,
``("results", gen, [fields, ...])``, ``("done", gen)``, ``("failed", message)``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import signal
import threading
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

from ...spec import OutputSpec, SamplingSpec
from ..base import Engine, EngineRequest
from ..config import EngineSettings
from ..platform.heap import frozen_heap

#: Builds a worker's engine from its settings, in the worker: a module-level function (it is
#: pickled by name), e.g. :func:`offline_worker` (settings: an ``EngineSettings``) or
#: ``sparkbatch_dagster.testing.fake_worker`` (a ``FakeEngine``'s).
WorkerFactory = Callable[[Any], Engine]


def offline_worker(cfg: EngineSettings) -> Engine:
    """The engine the single-GPU path builds: ``VLLMOfflineEngine`` of the same settings."""
    from .vllm_offline import VLLMOfflineEngine

    return VLLMOfflineEngine(cfg)


def worker_main(factory: WorkerFactory, settings: Any, env: dict[str, str], inbox: Connection,
                 outbox: Connection) -> None:
    os.environ.update(env)  # first: nothing has imported torch or vLLM yet (the parent set it too)
    os.setpgrp()  # its engine's processes join this group: the parent stops them all at once
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the parent stops the workers, in order
    signal.signal(signal.SIGTERM, _exit_on_signal)
    local: queue.Queue[tuple[Any, ...]] = queue.Queue()
    stopping: set[Any] = set()  # generations aborted, and "stop"
    threading.Thread(target=_receive, args=(inbox, local, stopping), daemon=True).start()
    out = _Sender(outbox)
    engine = None
    try:
        engine = factory(settings)
        out.put(("ready", os.getpid(), engine.start_seconds))
        while (msg := local.get())[0] != "stop":
            if msg[0] == "begin":
                _serve(engine, msg[1], msg[2], msg[3], local, stopping, out)
            elif msg[0] == "reset_prefix_cache" and (llm := getattr(engine, "_llm", None)) is not None:
                llm.reset_prefix_cache()  # between runs (benchmarks): the next one starts cold
    except Exception as exc:
        out.put(("failed", f"{type(exc).__name__}: {exc}"))
    finally:
        if engine is not None:
            with contextlib.suppress(Exception):
                engine.close()
        out.close()


def _exit_on_signal(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through ``finally``: the engine is closed


def _receive(inbox: Connection, local: queue.Queue[tuple[Any, ...]], stopping: set[Any]) -> None:
    """The parent's messages into the worker's queue; "abort" and "stop" also flag the running
    generation at once. End of file: the parent is gone, so the worker stops too."""
    while True:
        try:
            msg = inbox.recv()
        except (EOFError, OSError):
            local.put(("stop",))
            os.kill(os.getpid(), signal.SIGTERM)  # also interrupts an engine still loading
            return
        if msg[0] in ("abort", "stop"):
            stopping.add(msg[1] if msg[0] == "abort" else "stop")
        local.put(msg)
        if msg[0] == "stop":
            return


def _serve(engine: Engine, gen: int, sampling: SamplingSpec, output: OutputSpec,
           local: queue.Queue[tuple[Any, ...]], stopping: set[Any], out: _Sender) -> None:
    """One ``generate`` of the parent's: its requests as they arrive, its results as they finish."""

    def source() -> Iterator[EngineRequest]:
        while True:
            msg = local.get()
            if msg[0] == "reqs" and msg[1] == gen:
                yield from (EngineRequest(*fields) for fields in msg[2])
            elif msg[0] == "stop":
                local.put(msg)  # for the main loop, once this generation has stopped
                return
            elif msg[0] in ("end", "abort") and msg[1] == gen:
                return

    results = engine.generate(source(), sampling, output)
    try:
        with frozen_heap():  # no full collection walks this worker's heap while its engine works
            for r in results:
                out.put(("result", gen, dataclasses.astuple(r)))  # every field: EngineResult(*fields) on the other side
                if gen in stopping or "stop" in stopping:
                    break
    finally:
        getattr(results, "close", lambda: None)()  # the engine aborts what it still had
    out.put(("done", gen))


class _Sender:
    """Sends a worker's messages from a thread of its own, the results that queued up meanwhile
    as one message: the engine never waits for the pipe, and the parent reads batches."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._queue: queue.Queue[tuple[Any, ...] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="sparkbatch-dp-sender", daemon=True)
        self._thread.start()

    def put(self, msg: tuple[Any, ...]) -> None:
        self._queue.put(msg)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            items = [self._queue.get()]
            with contextlib.suppress(queue.Empty):
                while len(items) < 4096:
                    items.append(self._queue.get_nowait())
            try:
                for msg in _coalesce(items):
                    if msg is None:
                        return
                    self._conn.send(msg)
            except OSError:  # the parent is gone
                return


def _coalesce(items: list[tuple[Any, ...] | None]) -> Iterator[tuple[Any, ...] | None]:
    """Consecutive ``("result", gen, fields)`` as one ``("results", gen, [fields, ...])``."""
    batch: list[tuple[Any, ...]] = []
    for msg in items:
        if msg is not None and msg[0] == "result" and (not batch or batch[0][1] == msg[1]):
            batch.append(msg)
            continue
        if batch:
            yield ("results", batch[0][1], [m[2] for m in batch])
            batch = []
        if msg is not None and msg[0] == "result":
            batch = [msg]
        else:
            yield msg
    if batch:
        yield ("results", batch[0][1], [m[2] for m in batch])
