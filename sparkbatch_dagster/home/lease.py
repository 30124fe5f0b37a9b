"""Leases: the lock between machines that share a job home in an object store.

A ``flock`` only works inside one machine. A lease is an object in the store, ``leases/<version>/
shard-NNNNN.json``, holding its owner and its expiry; the holder renews it while it works
(:class:`LeaseKeeper`, every third of its length) and deletes it when done. A second machine that
finds a live lease waits for it (and says whose it is, until when); one that finds it expired
takes it over (and says so): the holder died, or lost the store for longer than the lease. The
writes are conditional (create-if-absent, replace-if-unchanged), so two machines that both see
an expired lease cannot both win it.

Clocks: an expiry is the holder's clock plus the lease length; machines are assumed to keep NTP
time (seconds apart, against leases of a minute). The shard's commit is conditional too, so even
a holder that lost its lease unnoticed cannot commit a shard twice.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from .bucket import Bucket, precondition_failed

log = logging.getLogger("sparkbatch")


def owner_id() -> str:
    """This process, as a lease names it: host, pid and a random token (pids repeat across boxes)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Lease:
    """One lease object. ``acquire(wait=True)`` waits while another live owner holds it.

    Example::

        lease = Lease(bucket, "leases/0123456789abcdef/shard-00003.json", owner_id(), seconds=60)
        if lease.acquire(wait=False):
            ...  # renewed by a LeaseKeeper while the work goes on
            lease.release()
    """

    def __init__(self, bucket: Bucket, rel: str, owner: str, seconds: float = 60.0,
                 say: Callable[[str], None] = log.warning) -> None:
        self.bucket, self.rel, self.owner, self.seconds = bucket, rel, owner, seconds
        self.say = say
        self.held = False
        self.lost = False  # renewal found someone else's lease: they took it over
        self._etag: str | None = None
        self.clock: Callable[[], float] = time.time

    def _body(self) -> bytes:
        now = self.clock()
        return json.dumps({"owner": self.owner, "renewed": now, "expires": now + self.seconds,
                           "seconds": self.seconds}).encode()

    def read(self) -> tuple[dict[str, Any] | None, str | None]:
        """The lease's content and version tag (None, None when there is none)."""
        tag = self.bucket.etag(self.rel)
        raw = self.bucket.get_bytes(self.rel)
        if raw is None:
            return None, None
        try:
            return dict(json.loads(raw)), tag
        except ValueError:  # not ours to parse: treat as expired
            return {"owner": "?", "expires": 0.0}, tag

    def acquire(self, wait: bool, poll_s: float | None = None) -> bool:
        """Take the lease; ``wait``: while a live owner holds it, poll until it is released or expires."""
        said = False
        while True:
            if self.bucket.put_bytes(self.rel, self._body(), create=True):
                return self._mine()
            current, tag = self.read()
            if current is None:
                continue  # released between our create and our read: try again
            if current.get("owner") == self.owner:  # our own create, its reply lost and retried
                return self._mine()
            left = float(current.get("expires", 0.0)) - self.clock()
            if left <= 0:
                if self._take_over(tag):
                    self.say(f"{self.rel}: took over the lease of {current.get('owner')}, expired "
                             f"{-left:.0f} s ago (that run stopped renewing it: it died or lost the store)")
                    return self._mine()
                continue
            if not wait:
                return False
            if not said:
                self.say(f"{self.rel}: leased by {current.get('owner')} for {left:.0f} s more (renewed while it "
                         "works): waiting for it to finish, or for the lease to expire")
                said = True
            time.sleep(min(max(left, 0.05), poll_s or max(self.seconds / 6, 0.2)))

    def _take_over(self, tag: str | None) -> bool:
        try:
            if self.bucket.conditional:
                self.bucket.put_bytes(self.rel, self._body(), if_match=tag)
                return True
            # No conditional writes here: write, wait a moment, and keep it only if it is still ours.
            self.bucket.put_bytes(self.rel, self._body())
            time.sleep(0.5)
            current, _ = self.read()
            return current is not None and current.get("owner") == self.owner
        except OSError as exc:
            if precondition_failed(exc):
                return False  # another machine took it over first
            raise

    def _mine(self) -> bool:
        self.held, self.lost = True, False
        self._etag = None  # asked at the first renewal, from the keeper's thread, not the run's
        return True

    def renew(self) -> None:
        """Push the expiry forward; a lease someone else holds now is marked ``lost``, not overwritten."""
        if not self.held:
            return
        try:
            if self.bucket.conditional and self._etag is None:
                current, self._etag = self.read()
                if current is not None and current.get("owner") != self.owner:
                    raise OSError("At least one of the pre-conditions you specified did not hold")
            if self.bucket.conditional and self._etag is not None:
                self.bucket.put_bytes(self.rel, self._body(), if_match=self._etag)
            else:
                current, _ = self.read()
                if current is not None and current.get("owner") != self.owner:
                    raise OSError("At least one of the pre-conditions you specified did not hold")
                self.bucket.put_bytes(self.rel, self._body())
            self._etag = self.bucket.etag(self.rel)
        except OSError as exc:
            if not precondition_failed(exc):
                raise
            current, _ = self.read()
            if current is not None and current.get("owner") == self.owner:  # our own write, reply lost
                self._etag = self.bucket.etag(self.rel)
                return
            self.lost = True
            self.held = False
            self.say(f"{self.rel}: lost the lease to {current.get('owner') if current else 'nobody'} (it expired "
                     "before it was renewed); the shard's commit stays conditional, so nothing is committed twice")

    def holder(self) -> str:
        current, _ = self.read()
        return str(current.get("owner")) if current else "?"

    def release(self) -> None:
        """Delete the lease if it is still ours (a taken-over one belongs to its new owner)."""
        if not self.held:
            return
        self.held = False
        raw = self.bucket.get_bytes(self.rel)
        if raw is not None and json.loads(raw).get("owner") == self.owner:
            self.bucket.delete([self.rel])


class LeaseKeeper:
    """Renews held leases every third of their length, from a thread, while a run works."""

    def __init__(self) -> None:
        self.leases: list[Lease] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._mutex = threading.Lock()

    def add(self, lease: Lease) -> None:
        with self._mutex:
            self.leases.append(lease)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="sparkbatch-leases", daemon=True)
                self._thread.start()

    def remove(self, lease: Lease) -> None:
        with self._mutex:
            if lease in self.leases:
                self.leases.remove(lease)

    def _loop(self) -> None:
        while True:
            with self._mutex:
                leases = list(self.leases)
            every = min((le.seconds for le in leases), default=30.0) / 3
            if self._stop.wait(every):
                return
            for lease in leases:
                try:
                    lease.renew()
                except Exception as exc:  # the store away for a moment: the next tick tries again
                    log.warning("renewing %s failed (%s): trying again in %.0f s", lease.rel, exc, every)

    def stop(self) -> None:
        self._stop.set()


#: One keeper per process: every lease this process holds is renewed by the same thread.
KEEPER = LeaseKeeper()


class PartitionLock:
    """This machine's ``flock`` on a shard, and with a bucket home the shard's lease too: the
    flock keeps two runs of one box apart, the lease two boxes. Example::

        lock = home.partition_lock(version, "shard-00003")
        if lock.acquire(wait=False):            # the lease is waited for (and said so) unless lease_wait=False
            try: ...
            finally: lock.release()
    """

    def __init__(self, local: Any, lease: Lease | None = None) -> None:
        self.local, self.lease = local, lease
        self.path = local.path
        #: Why the last acquire failed: "local" (a run of this box) or "lease" (another box).
        self.refused_by: str | None = None

    def acquire(self, wait: bool, shared: bool = False, lease_wait: bool = True) -> bool:
        self.refused_by = None
        if not self.local.acquire(wait=wait, shared=shared):
            self.refused_by = "local"
            return False
        if self.lease is None or shared:
            return True
        try:
            got = self.lease.acquire(wait=lease_wait)
        except BaseException:
            self.local.release()
            raise
        if not got:
            self.local.release()
            self.refused_by = "lease"
            return False
        KEEPER.add(self.lease)
        return True

    def holder(self) -> str:
        return self.lease.holder() if self.lease is not None and self.local.holder() == "?" else self.local.holder()

    def release(self) -> None:
        if self.lease is not None and self.lease.held:
            KEEPER.remove(self.lease)
            try:
                self.lease.release()
            except OSError as exc:  # it expires by itself: another box waits a lease length, nothing more
                log.warning("could not release %s (%s): it expires in %.0f s", self.lease.rel, exc, self.lease.seconds)
        self.local.release()
