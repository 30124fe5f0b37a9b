"""An engine started ahead of the run that uses it, so a command's own preparation runs while vLLM loads.

``sparkbatch run`` knows at its first line that it will label (:func:`..cli.commands.run`), yet the
engine used to start only at the labeling step's first prompt: after the definitions loaded, the
input was sharded, the Dagster run was set up and the first shard was read and rendered. Those
seconds (4 to 8 on a GPU box, issue 61) now run while the engine starts in a thread of its own,
and the engine core's heavy work (weights, compiling, CUDA graphs, the KV cache's profile) runs
in vLLM's own process, where it takes nothing from this one.

:meth:`VLLMResource.prestart` begins a start here, under the key of its settings; the run's
``get_engine`` with the same settings takes it (:func:`take`) and waits for its end instead of
starting another. A start nobody takes (the run found nothing to label) is stopped at the
command's end (:func:`close_untaken`), or at the process's exit.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

#: Starts begun and not yet taken, by the settings' key (``VLLMResource._warm_key``).
_PENDING: dict[str, Prestart] = {}
_GUARD = threading.Lock()
log = logging.getLogger("sparkbatch")


class Prestart:
    """One engine start running in its own thread; ``start`` returns what the taker gets, ``stop``
    stops that when nobody takes it."""

    def __init__(self, start: Callable[[], Any], stop: Callable[[Any], None]) -> None:
        self.began = time.perf_counter()
        self.ended: float | None = None
        self._start, self.stop = start, stop
        self._done = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None
        threading.Thread(target=self._run, name="sparkbatch-engine-prestart", daemon=True).start()

    def _run(self) -> None:
        try:
            self._result = self._start()
        except BaseException as exc:  # noqa: BLE001 - raised again in the taker's thread
            self._error = exc
        finally:
            self.ended = time.perf_counter()
            self._done.set()

    @property
    def in_flight(self) -> bool:
        """True while the start runs."""
        return not self._done.is_set()

    @property
    def seconds(self) -> float:
        """How long the start took (so far, while it runs)."""
        return (self.ended if self.ended is not None else time.perf_counter()) - self.began

    def wait(self) -> Any:
        """What the start returned, once it has; its error, raised here, if it failed."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._result


def begin(key: str, start: Callable[[], Any], stop: Callable[[Any], None]) -> Prestart | None:
    """Start ``start`` now for the next :func:`take` of ``key``; None when one is already pending."""
    with _GUARD:
        if key in _PENDING:
            return None
        _PENDING[key] = found = Prestart(start, stop)
    return found


def take(key: str) -> Prestart | None:
    """The pending start of ``key``, handed over once (None when there is none)."""
    with _GUARD:
        return _PENDING.pop(key, None)


def pending(key: str) -> bool:
    """Whether a start of ``key`` waits to be taken."""
    with _GUARD:
        return key in _PENDING


@atexit.register
def close_untaken() -> int:
    """Stop every start nobody took (each waited for first: a start cannot be cut short without
    leaving vLLM's processes behind); returns how many there were."""
    with _GUARD:
        left = list(_PENDING.values())
        _PENDING.clear()
    for start in left:
        try:
            got = start.wait()
        except Exception as exc:  # noqa: BLE001 - nobody asked for it: its failure is nobody's either
            log.info("an engine started ahead and never used failed to start: %s", exc)
        else:
            start.stop(got)
    return len(left)
