"""The thread that renews this process's box leases (:mod:`.lease`), every third of their length."""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

log = logging.getLogger("sparkbatch")


class BoxLease(Protocol):
    """What the keeper needs of a box lease (:class:`.lease.BoxLease`, which imports this module)."""

    seconds: float
    _ok_at: float  # monotonic time of its last renewal that succeeded

    @property
    def rel(self) -> str: ...

    def renew(self) -> bool: ...


class LeaseKeeper:
    """Renews every held box lease every third of its length, from one thread."""

    def __init__(self) -> None:
        self.boxes: list[BoxLease] = []
        self._mutex = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, box: BoxLease) -> None:
        with self._mutex:
            if box not in self.boxes:
                self.boxes.append(box)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="sparkbatch-leases", daemon=True)
                self._thread.start()
        self._wake.set()

    def remove(self, box: BoxLease) -> None:
        with self._mutex:
            if box in self.boxes:
                self.boxes.remove(box)

    def _loop(self) -> None:
        while True:
            with self._mutex:
                boxes = list(self.boxes)
            every = min((b.seconds for b in boxes), default=30.0) / 3
            self._wake.wait(every)
            self._wake.clear()
            for box in boxes:
                if time.monotonic() - box._ok_at < every * 0.9:
                    continue  # renewed since (by confirm, or it was just made)
                try:
                    box.renew()
                except Exception as exc:  # the store away for a moment: the next tick tries again
                    log.warning("renewing %s failed (%s): trying again in %.0f s", box.rel, exc, every)


#: One keeper per process: every box lease this process holds is renewed by the same thread.
KEEPER = LeaseKeeper()
