"""Prompts encoded on a thread of their own, a chunk or two ahead of the engine's loop.

The offline engine's loop runs on the step's thread, which also processes every engine step's
outputs (vLLM's output processor is Python): on a fast GPU that thread is what the engine waits
for, and each chunk it spends in the tokenizer delays the steps behind it. The fast tokenizer's
Rust part releases the GIL, so encoding on another thread overlaps most of it with the steps.

Requests are still pulled from the caller's iterable on the caller's thread (a run's feed opens
shards as it goes, which is not thread-safe): only the encoding moves. Chunks come back in the
order they were submitted. Without the thread (``threaded=False``) a chunk is encoded when it
is submitted, as the loop did before (``VLLMOfflineEngine.encode_ahead = False``, to measure it).
What it changed on the H200: ``docs/performance.md``, the labeling step's A-B.
"""

from __future__ import annotations

import concurrent.futures as cf
from collections import deque
from collections.abc import Callable, Iterator

from .base import EngineRequest

Encode = Callable[[list[EngineRequest]], list[list[int]]]


class EncodeAhead:
    """Chunks of requests encoded in order, at most ``depth`` of them waiting to be taken.

    Example::

        ahead = EncodeAhead(engine.encode)
        ahead.submit(requests[:512])
        for req, ids in ahead.take(wait=True):
            ...  # add the request to the engine
        ahead.close()
    """

    def __init__(self, encode: Encode, threaded: bool = True, depth: int = 2) -> None:
        self._encode = encode
        self._pool = cf.ThreadPoolExecutor(1, thread_name_prefix="sparkbatch-encode") if threaded else None
        self._queued: deque[tuple[list[EngineRequest], cf.Future[list[list[int]]]]] = deque()
        self.depth = depth if threaded else 1  # without the thread: one chunk a step, as before
        #: Requests submitted and not yet taken: the loop counts them against its window.
        self.rows = 0

    def room(self) -> bool:
        """Whether another chunk may be submitted."""
        return len(self._queued) < self.depth

    def submit(self, batch: list[EngineRequest]) -> None:
        """Encode ``batch``: on the thread, or here and now without one."""
        future: cf.Future[list[list[int]]]
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

    def take(self, wait: bool) -> Iterator[tuple[EngineRequest, list[int]]]:
        """The requests of every chunk encoded so far, in order, with their token ids; ``wait``:
        wait for the next chunk if none is done (the engine has nothing else to do)."""
        while self._queued and (self._queued[0][1].done() or wait):
            batch, future = self._queued.popleft()
            self.rows -= len(batch)
            encoded = future.result()  # an encoding error is raised here, on the caller's thread
            wait = False
            yield from zip(batch, encoded, strict=True)

    def close(self) -> None:
        """Drop what was not taken (the caller stopped early) and let the thread go."""
        self._queued.clear()
        self.rows = 0
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
