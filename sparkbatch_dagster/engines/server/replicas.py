"""Several servers behind one client: which replica gets the next request, and which are dead.

Each replica has its own in-flight bound; a request goes to the live replica with the fewest in
flight (ties: the one sent fewer this run), so a slow replica gets fewer rows and a fast one more.
A replica whose request failed with connection errors or 5xx through every retry, with no answer
from it since that request first failed, is dead for the rest of the run (``generate`` call):
its rows in flight return as "moved" and the client re-sends them to the live replicas.

The counters (``in_flight``, ``sent``, ``moved``) belong to the caller's thread, ``last_answer``
and ``dead`` are written on the client's event loop; plain values, read across threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

log = logging.getLogger("sparkbatch")


@dataclass(eq=False)
class Replica:
    url: str
    in_flight: int = 0
    sent: int = 0
    moved: int = 0
    dead: str | None = None  # why it died; None while it lives
    reported: bool = False  # its death logged
    last_answer: float = 0.0  # time.monotonic() of its last answer (any HTTP answer that is not a retry)
    _died: asyncio.Event | None = field(default=None, repr=False)  # made on the event loop, when first needed

    def answered(self) -> None:
        self.last_answer = time.monotonic()

    def die(self, why: str) -> None:
        self.dead = why
        if self._died is not None:
            self._died.set()

    async def pause(self, seconds: float) -> None:
        """A backoff sleep that ends early when the replica dies (its rows then move at once)."""
        if self._died is None:
            self._died = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._died.wait(), seconds)


class Pool:
    """The replicas of one client, each with ``max_in_flight`` requests at most."""

    def __init__(self, urls: Sequence[str], max_in_flight: int) -> None:
        self.replicas = [Replica(url) for url in urls]
        self.max_in_flight = max_in_flight

    def __len__(self) -> int:
        return len(self.replicas)

    def reset(self) -> None:
        """A new run: every replica lives again, with nothing in flight."""
        for rep in self.replicas:
            rep.in_flight = rep.sent = rep.moved = 0
            rep.dead, rep.reported, rep._died = None, False, None

    def live(self) -> list[Replica]:
        return [rep for rep in self.replicas if rep.dead is None]

    def pick(self, exclude: Collection[Replica] = ()) -> Replica | None:
        """The live replica with the fewest requests in flight and room for one more, or None."""
        free = [rep for rep in self.replicas
                if rep.dead is None and rep.in_flight < self.max_in_flight and rep not in exclude]
        return min(free, key=lambda rep: (rep.in_flight, rep.sent), default=None)

    def declare_dead(self, rep: Replica, why: str, failing_since: float) -> bool:
        """After a request's last retry failed on ``rep``: dead if it answered nothing since that
        request first failed (a replica that answers others only failed this row). With one
        replica, never: the single-server behaviour stays as it was."""
        if rep.dead is None and len(self.replicas) > 1 and rep.last_answer < failing_since:
            rep.die(why)
        return rep.dead is not None

    def report(self, rep: Replica) -> None:
        """Log a replica's death once, in the caller's thread, when its first row comes back moved."""
        if rep.reported:
            return
        rep.reported = True
        live = self.live()
        if live:
            log.warning("server at %s is dead (%s): its %d row(s) in flight go to the %d live server(s) %s",
                        rep.url, rep.dead, rep.in_flight + 1, len(live), [r.url for r in live])
        else:
            log.error("server at %s is dead (%s) and so is every other server in server_urls: the rows left stay "
                      "pending (nothing is committed for them): run again to retry them", rep.url, rep.dead)

    def summary(self) -> None:
        moved = {rep.url: rep.moved for rep in self.replicas if rep.moved}
        if moved:
            log.warning("rows moved off dead servers to live ones: %s", moved)

    def all_dead_reason(self) -> str:
        return "every server is dead: " + "; ".join(f"{rep.url}: {rep.dead}" for rep in self.replicas)
