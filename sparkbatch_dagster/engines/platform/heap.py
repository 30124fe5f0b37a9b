"""The process's heap frozen while it generates, so the collector's full passes skip it.

A process that drives an engine holds millions of long-lived objects (vLLM, torch, the tokenizer,
Dagster's instance). A full, oldest-generation garbage collection walks every one of them with the
GIL held: on the H200 machine's host, 0.52 to 0.91 s each, twice in a 20 s server-mode round
(``benchmarks/throughput.py --profile``). Meanwhile the client sends no request and reads no
answer, and the server's batch waits. ``gc.freeze()`` takes what exists when generation begins
out of the collector's sight, as vLLM does for its own server and engine processes and its
serving benchmark does for its client; what the run allocates is still collected, and
``gc.unfreeze()`` at the end hands the frozen objects back, so garbage among them is collected
after the run instead of never.

Freezing alone still left full passes over the run's own objects: the requests in flight, their
bodies and answers. With the old heap out of sight, Python's rule (a full pass once what survived
the young generations reaches a quarter of the oldest one) fires at every tenth middle-generation
pass: 4 and 1.1 s in each 20 s server-mode round on the H200 host. So while frozen, the oldest
generation's threshold is ``FULL_PASS_SPACING`` times Python's: none in a 6,000-row run, a tenth
as many in a 40,000-row one; cycles the young passes miss wait that much longer. Against a stub
server on the 2-core CPU (``benchmarks/server/server_client.py --arms token_ids,full_passes_unspaced``,
6,000 requests): 0 full passes instead of 5 (0.74 to 0.88 s), 0.89 of the client CPU per request.

    with frozen_heap():
        for result in engine.generate(requests, sampling, output): ...

The engine start holds it too (``engines/offline/llm_start.py``): vLLM forks its engine core inside
``LLM(...)``, and the core's collections skip what it inherits frozen until its own start is over.

Holders nest and overlap (a cascade's stages, data-parallel threads): the heap is frozen by the
first and handed back by the last. Whatever was frozen before the first (Python 3.12 starts with a
few hundred objects frozen; an application may have frozen its own) comes back unfrozen with the
rest, as it does when vLLM's engine core shuts down: the freeze count cannot tell whose objects
are whose, and an unfrozen object is only collected as any other is.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["frozen_heap", "is_frozen"]

#: How many times further apart full passes are while frozen (``gc.set_threshold``'s third value).
FULL_PASS_SPACING = 10

_lock = threading.Lock()
_holders = 0
_frozen = False  # whether the first holder froze (the last one unfreezes)
_thresholds: tuple[int, ...] = ()  # the collector's, handed back with the heap


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Freeze the heap (``gc.freeze``) and space full passes out for the block; the last holder to
    leave unfreezes it and restores the collector's thresholds."""
    global _holders, _frozen, _thresholds
    with _lock:
        if _holders == 0:
            _frozen = gc.isenabled()  # a process that turned the collector off has no pauses to cut
            if _frozen:
                gc.freeze()
                _thresholds = gc.get_threshold()
                young, middle, oldest = _thresholds
                gc.set_threshold(young, middle, oldest * FULL_PASS_SPACING)
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _frozen:
                gc.unfreeze()
                gc.set_threshold(*_thresholds)
                _frozen = False


def is_frozen() -> bool:
    """Whether a holder has the heap frozen now (``benchmarks/lib/arm_samples.py`` records it at each
    full collection: one that falls while generating should find it frozen)."""
    with _lock:
        return _frozen
