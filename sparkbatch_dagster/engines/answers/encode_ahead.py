"""Prompts encoded on a thread of their own, a chunk or two ahead of the engine's loop.

The offline engine's loop runs on the step's thread, which also processes every engine step's
outputs (vLLM's output processor is Python): on a fast GPU that thread is what the engine waits
for, and each chunk it spends in the tokenizer delays the steps behind it. The fast tokenizer's
Rust part releases the GIL, so encoding on another thread overlaps most of it with the steps.

Requests are still pulled from the caller's iterable on the caller's thread (a run's feed opens
shards as it goes, which is not thread-safe): only the encoding moves. Chunks come back in the
order they were submitted. Without the thread (``threaded=False``) a chunk is encoded when it
is submitted, as the loop did before (``benchmarks/lib/switches.py``'s ``inline_encoding``, to measure it).
What it changed on the H200: ``docs/performance.md``, the labeling step's A-B.

Server mode pulls one request at a time, as a server has room: :class:`Prepared` wraps the
same thread for it, chunks of request bodies built (and, with ``server_token_ids``, tokenized
in one call) ahead of the sends.
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

from ..base import EngineRequest

T = TypeVar("T")
#: A chunk of requests to what goes to the engine: their token ids, or (server mode) their bodies.
Encode = Callable[[list[EngineRequest]], list[T]]


class EncodeAhead(Generic[T]):
    """Chunks of requests encoded in order, at most ``depth`` of them waiting to be taken.

    Example::

        ahead = EncodeAhead(engine.encode)
        ahead.submit(requests[:512])
        for req, ids in ahead.take(wait=True):
            ...  # add the request to the engine
        ahead.close()
    """

    def __init__(self, encode: Encode[T], threaded: bool = True, depth: int = 2) -> None:
        self._encode = encode
        self._pool = cf.ThreadPoolExecutor(1, thread_name_prefix="sparkbatch-encode") if threaded else None
        self._queued: deque[tuple[list[EngineRequest], cf.Future[list[T]]]] = deque()
        self.depth = depth if threaded else 1  # without the thread: one chunk a step, as before
        #: Requests submitted and not yet taken: the loop counts them against its window.
        self.rows = 0

    def room(self) -> bool:
        """Whether another chunk may be submitted."""
        return len(self._queued) < self.depth

    def submit(self, batch: list[EngineRequest]) -> None:
        """Encode ``batch``: on the thread, or here and now without one."""
        future: cf.Future[list[T]]
        if self._pool is not None:
            future = self._pool.submit(self._encode, batch)
        else:
            future = cf.Future()
            try:
                future.set_result(self._encode(batch))
            except Exception as exc:  # raised where it is taken, as the thread's would be
                future.set_exception(exc)
        self._queued.append((batch, future))
        self.rows += len(batch)

    def take(self, wait: bool) -> Iterator[tuple[EngineRequest, T]]:
        """The requests of every chunk encoded so far, in order, with their token ids; ``wait``:
        wait for the next chunk if none is done (the engine has nothing else to do)."""
        while self._queued and (self._queued[0][1].done() or wait):
            batch, future = self._queued.popleft()
            self.rows -= len(batch)
            encoded = future.result()  # an encoding error is raised here, on the caller's thread
            wait = False
            yield from zip(batch, encoded, strict=True)

    def ready(self) -> bool:
        """Whether the next chunk is encoded (:meth:`take` would not wait)."""
        return bool(self._queued) and self._queued[0][1].done()

    def drop(self) -> list[EngineRequest]:
        """The requests submitted and not taken, unencoded; nothing is left queued."""
        dropped = [req for batch, _ in self._queued for req in batch]
        self._queued.clear()
        self.rows = 0
        return dropped

    def close(self) -> None:
        """Drop what was not taken (the caller stopped early) and let the thread go."""
        self.drop()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


class Prepared(Generic[T]):
    """Requests one at a time, each with what ``encode`` made of it, chunks encoded ahead on
    :class:`EncodeAhead`'s thread. ``source`` is read on the caller's thread, a chunk at a time.

    Example::

        prepared = Prepared(requests, engine.bodies, chunk=256)
        while (item := prepared.next()) is not None:
            req, body = item
            ...  # send it
        prepared.close()
    """

    def __init__(self, source: Iterable[EngineRequest], encode: Encode[T], chunk: int = 256,
                 threaded: bool = True) -> None:
        self._source = iter(source)
        self._ahead: EncodeAhead[T] = EncodeAhead(encode, threaded)
        self._chunk = chunk
        self._ready: deque[tuple[EngineRequest, T]] = deque()
        self._read_all = False

    def next(self) -> tuple[EngineRequest, T] | None:
        """The next request and its encoding, waiting for it if need be; None after the last."""
        self._top_up()
        if not self._ready:
            self._ready.extend(self._ahead.take(wait=True))
            self._top_up()  # the chunk just taken made room: the thread goes on while these are sent
        return self._ready.popleft() if self._ready else None

    def ready(self) -> bool:
        """Whether :meth:`next` answers without waiting for a chunk to be encoded."""
        return bool(self._ready) or self._ahead.ready()

    def rest(self) -> Iterator[EngineRequest]:
        """The requests not handed out yet, unencoded (the run gives up on them)."""
        yield from (req for req, _ in self._ready)
        self._ready.clear()
        yield from self._ahead.drop()
        yield from self._source

    def close(self) -> None:
        self._ahead.close()

    def _top_up(self) -> None:
        while not self._read_all and self._ahead.room():
            batch = list(itertools.islice(self._source, self._chunk))
            self._read_all = not batch
            if batch:
                self._ahead.submit(batch)
