"""Coroutines handed from the caller's thread to an event loop running in another thread, a
batch at a time, and back as each one finishes.

Server mode's client sends from the caller's thread (which also reads every answer) through an
asyncio loop on a thread of its own. ``asyncio.run_coroutine_threadsafe`` for each request cost
both threads a ``concurrent.futures.Future`` (with its lock and condition), a wake-up of the
loop and a chained callback. Here up to :data:`BATCH` requests go in one wake-up, and finished
ones come back on one queue: on the 2-core CPU 1.22 against 1.33 ms of the client's CPU a request
(``benchmarks/server/server_client.py``, arm ``one_handoff_each``; ``cpu-server-client-handoff.json``).

    handoff = Handoff(loop)
    token = handoff.add(send(row))      # a coroutine; started at the next flush
    handoff.flush()                     # before waiting: everything added is on its way
    token, task = handoff.next_done(1.0) or (None, None)
    task.result()                       # its answer, or what it raised
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import queue
from collections.abc import Coroutine
from typing import Any

__all__ = ["BATCH", "Handoff"]

#: Coroutines handed to the loop at once, at most.
BATCH = 64


class Handoff:
    """Coroutines started on ``loop`` (running in another thread) a batch at a time.
    ``batched=False`` hands each one over alone, as before (to measure the difference)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, batched: bool = True) -> None:
        self.loop, self.batched = loop, batched
        self._tokens = itertools.count()
        self._starts: list[tuple[int, Coroutine[Any, Any, Any]]] = []
        self._running: dict[int, Any] = {}  # token -> its task (or future), until taken back
        self._done: queue.Queue[tuple[int, Any]] = queue.Queue()

    def add(self, coro: Coroutine[Any, Any, Any]) -> int:
        """Queue ``coro`` to start (at the next :meth:`flush`, or now if the batch is full); its token."""
        token = next(self._tokens)
        self._starts.append((token, coro))
        if len(self._starts) >= BATCH:
            self.flush()
        return token

    def flush(self) -> None:
        """Start everything added so far."""
        if not self._starts:
            return
        starts, self._starts = self._starts, []
        if self.batched:
            self.loop.call_soon_threadsafe(self._start, starts)
            return
        for token, coro in starts:
            fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
            self._running[token] = fut
            fut.add_done_callback(functools.partial(self._finished, token))

    def next_done(self, timeout: float) -> tuple[int, Any] | None:
        """``(token, its task)`` of the next one to finish, or None after ``timeout`` seconds."""
        try:
            token, task = self._done.get(timeout=timeout)
        except queue.Empty:
            return None
        self._running.pop(token, None)
        return token, task

    def cancel(self) -> None:
        """Stop everything not taken back yet (the caller gives up on them)."""
        for _, coro in self._starts:
            coro.close()  # never started: no "was never awaited" warning
        self._starts = []
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing runs on it any more
            # After every hand-off before it (the loop runs its callbacks in order).
            self.loop.call_soon_threadsafe(self._cancel_running)

    def _start(self, starts: list[tuple[int, Coroutine[Any, Any, Any]]]) -> None:  # on the loop
        for token, coro in starts:
            task = self.loop.create_task(coro)
            self._running[token] = task
            task.add_done_callback(functools.partial(self._finished, token))

    def _cancel_running(self) -> None:  # on the loop
        for task in list(self._running.values()):
            task.cancel()

    def _finished(self, token: int, task: Any) -> None:
        self._done.put((token, task))
