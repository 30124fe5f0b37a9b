"""The prompts of a run's shards in the order they go to the engine, and the work done ahead of
them while the engine starts.

A :class:`Feed` is the request iterable a :class:`~.runner.ShardRun` hands its engine: shard by
shard, each opened (read, checked, rendered, deduplicated, looked up in the result store) when
its turn comes, its prompts yielded in their sorted order. While a
:class:`~sparkbatch_dagster.engines.base.LazyEngine` starts its engine in another thread it calls
:meth:`Feed.meanwhile`, which opens the next shards ahead, up to ``ahead_rows`` rows: their
prompts are ready when the engine is. Opening ahead commits nothing (a shard with nothing to
generate is finalized when its turn comes, as it always was), and a shard that fails to open
ahead is opened again when its turn comes, after the shards before it: where it always failed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Protocol

from ..engines.base import Engine, EngineRequest, request_of
from .open_shard import OpenShard
from .result_store import ResultStore

log = logging.getLogger("sparkbatch")


class Run(Protocol):
    """What a feed uses of its :class:`~.runner.ShardRun`."""

    engine: Engine
    store: ResultStore
    shards: list[OpenShard]
    rechecked: bool

    def open(self, key: str) -> int: ...

    def finish(self, shard: OpenShard) -> None: ...

    def count_free(self, rows: int) -> None: ...


class Feed:
    """The engine's requests for ``keys`` (request ids ``"<shard index>:<n>"``), opened in order."""

    def __init__(self, run: Run, keys: list[str], ahead_rows: int) -> None:
        self.run, self.keys, self.ahead_rows = run, list(keys), ahead_rows
        self._ahead: dict[str, int] = {}  # key -> its index in run.shards: opened ahead, not yet fed
        self._next = 0  # position in keys of the next shard to open
        self._failed = False  # a shard failed to open ahead: no more are (its turn opens it again)

    def __iter__(self) -> Iterator[EngineRequest]:
        run = self.run
        for pos, key in enumerate(self.keys):
            idx = self._ahead.pop(key, None)
            if idx is None:
                idx = run.open(key)
            self._next = max(self._next, pos + 1)
            shard = run.shards[idx]
            if shard.outstanding == 0:  # nothing to generate (all resumed, reused or error rows)
                run.finish(shard)
            n = 0
            while n < len(shard.order):  # the order may shrink (below): not a for loop
                if n and self._waited_for_gpu():
                    self._reuse_after_wait(shard, n)
                    if shard.outstanding == 0 and shard.pending == 0:
                        run.finish(shard)  # every answer in: the rest came from the store
                    if n == len(shard.order):
                        break
                shard.first_sent = shard.first_sent or time.perf_counter()
                group = shard.order[n]
                yield request_of(f"{idx}:{n}", shard.groups[group][0], shard.keys[group])
                n += 1

    def meanwhile(self) -> bool:
        """Open the next shard ahead (one a call, while the engine starts); False once every
        shard is open, one failed, or ``ahead_rows`` rows wait."""
        if self._failed or self._next >= len(self.keys):
            return False
        if sum(len(self.run.shards[i].rows) for i in self._ahead.values()) >= self.ahead_rows:
            return False
        key = self.keys[self._next]
        try:
            self._ahead[key] = self.run.open(key)
        except Exception:  # noqa: BLE001 - its turn opens it again, and fails there if it still does
            log.debug("%s: could not be opened ahead; opened again when its turn comes", key, exc_info=True)
            self._failed = True
            return False
        self._next += 1
        return True

    def _waited_for_gpu(self) -> bool:
        """True once a run, after an engine start that waited for another run's engine to free the GPU."""
        run = self.run
        if run.rechecked:
            return False
        started = getattr(run.engine, "started", None)
        if started is None:
            return False
        run.rechecked = True
        return getattr(started, "gpu_wait_s", 0.0) > 0

    def _reuse_after_wait(self, shard: OpenShard, sent: int) -> None:
        """The shards were looked up in the result store before the engine waited for the GPU; the
        run that held it stored answers meanwhile: the prompts not yet sent are looked up again,
        those of the shards opened ahead too."""
        shards = [(shard, sent)] + [(self.run.shards[i], 0) for i in self._ahead.values()]
        for each, first in shards:
            written = each.reuse_unsent(self.run.store, first)
            self.run.count_free(written)
            if written:
                log.info("%s: %d rows answered by the run this one waited for (result store): not generated again",
                         each.key, written)
