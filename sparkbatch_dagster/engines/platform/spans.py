"""Where a labeling step's time goes: wall seconds per named part of the step's own thread.

The step's thread opens a part when it starts one (``push`` / ``span``) and closes it when done
(``pop``); the time goes to the innermost open part, so a part inside another is never counted
twice, and to ``base`` while none is open. Calls from any other thread are ignored: the flush
timer's or an upload thread's work overlaps the step's and takes none of its time.

A part opened with ``cover=True`` (the engine start, which runs in a thread of its own) takes all
of the step's time until :meth:`Spans.cover_until` marks the start's end: what the step did
meanwhile (the next shards read, rendered, looked up) cost nothing, and is kept apart, by name,
in ``overlapped``. Each call is one ``perf_counter``: a few per shard, two per answer.

``sparkbatch run`` reads a step's parts through :func:`collecting` (its summary's ``timings_s``);
:func:`note` adds seconds measured outside a step (the engine's stop, at the run's teardown)::

    spans = Spans(collect=True)
    with spans.span("render"):
        ...
    spans.seconds   # {"prepare": 0.41, "render": 1.2}
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

#: Open :func:`collecting` blocks of this process: what each one has gathered.
_collectors: list[Collected] = []
#: Also count the thread's CPU seconds per part (``Spans.cpu``): a benchmark on a busy machine,
#: where wall seconds say more about the neighbours than about the code.
COUNT_CPU = False


class Collected:
    """The step :class:`Spans` made, and the seconds :func:`note`-d, while a block ran."""

    def __init__(self) -> None:
        self.spans: list[Spans] = []
        self.notes: dict[str, float] = {}


@contextmanager
def collecting() -> Iterator[Collected]:
    """Gather the parts of every step (``Spans(collect=True)``) run in this process meanwhile."""
    found = Collected()
    _collectors.append(found)
    try:
        yield found
    finally:
        _collectors.remove(found)


def note(name: str, seconds: float) -> None:
    """Seconds of a part measured outside a step (the engine's stop), for open collectors."""
    for found in list(_collectors):
        found.notes[name] = found.notes.get(name, 0.0) + seconds


class Spans:
    """Exclusive wall seconds per named part of one thread's work (the one that made it)."""

    def __init__(self, base: str = "prepare", collect: bool = False) -> None:
        self.seconds: dict[str, float] = {}
        #: Seconds of named parts done while a covering part (the engine start) held the clock.
        self.overlapped: dict[str, float] = {}
        self.base = base
        self._stack: list[str] = []
        self._cover: int | None = None  # index in _stack of the covering part
        self._until: float | None = None
        self._thread = threading.get_ident()
        #: CPU seconds of this thread per part (only with ``COUNT_CPU``; the covering part's own).
        self.cpu: dict[str, float] | None = {} if COUNT_CPU else None
        self._cpu_mark = time.thread_time() if COUNT_CPU else 0.0
        self.began = self._mark = time.perf_counter()
        if collect:
            for found in list(_collectors):
                found.spans.append(self)

    def _mine(self) -> bool:
        return threading.get_ident() == self._thread

    def _charge(self, now: float) -> None:
        elapsed, start = now - self._mark, self._mark
        self._mark = now
        top = self._stack[-1] if self._stack else self.base
        if self.cpu is not None:
            cpu, self._cpu_mark = self._cpu_mark, time.thread_time()
            self.cpu[top] = self.cpu.get(top, 0.0) + self._cpu_mark - cpu
        if self._cover is None:
            self.seconds[top] = self.seconds.get(top, 0.0) + elapsed
            return
        cover = self._stack[self._cover]
        covered = elapsed if self._until is None else min(elapsed, max(self._until - start, 0.0))
        self.seconds[cover] = self.seconds.get(cover, 0.0) + covered
        if top != cover:
            self.overlapped[top] = self.overlapped.get(top, 0.0) + covered
        if elapsed > covered:
            self.seconds[top] = self.seconds.get(top, 0.0) + elapsed - covered

    def push(self, name: str, cover: bool = False) -> None:
        """Open part ``name`` (inside whatever is open)."""
        if not self._mine():
            return
        self._charge(time.perf_counter())
        self._stack.append(name)
        if cover:
            self._cover, self._until = len(self._stack) - 1, None

    def pop(self) -> None:
        """Close the innermost open part."""
        if not self._mine() or not self._stack:
            return
        self._charge(time.perf_counter())
        self._stack.pop()
        if self._cover is not None and self._cover >= len(self._stack):
            self._cover = None

    def switch(self, name: str) -> None:
        """Close the innermost part and open ``name`` in its place (one clock read)."""
        if not self._mine():
            return
        self._charge(time.perf_counter())
        if self._stack:
            self._stack[-1] = name
        else:
            self._stack.append(name)

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        self.push(name)
        try:
            yield
        finally:
            self.pop()

    def cover_until(self, when: float) -> None:
        """The covering part's work ended at ``when`` (a ``perf_counter`` time; from any thread):
        the step's time after it goes to its own parts again."""
        self._until = when

    def move(self, source: str, target: str, seconds: float) -> None:
        """Count ``seconds`` of ``source`` as ``target`` instead (at most what ``source`` has)."""
        if not self._mine():
            return
        moved = min(max(seconds, 0.0), self.seconds.get(source, 0.0))
        if moved > 0:
            self.seconds[source] -= moved
            self.seconds[target] = self.seconds.get(target, 0.0) + moved

    def rounded(self, digits: int = 3) -> dict[str, float]:
        """The parts so far, rounded (safe to call from another thread: a heartbeat's write)."""
        return {k: round(v, digits) for k, v in dict(self.seconds).items()}

    @property
    def last(self) -> float:
        """When the step's thread last opened or closed a part (``perf_counter``)."""
        return self._mark
