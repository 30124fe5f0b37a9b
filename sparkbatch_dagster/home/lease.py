"""Leases: the lock between machines that share a job home in an object store.

A ``flock`` only works inside one machine. Between machines (docs/protocol.md has the whole
protocol on one page):

- **One box lease per process**, ``leases/boxes/<owner>.json``: its owner and expiry, renewed
  every third of its length by one thread (:class:`.keeper.LeaseKeeper`). Renewal traffic is one
  conditional PUT a third of a lease, whatever the number of shards the box holds.
- **One claim per shard**, ``leases/<version>/shard-NNNNN.json``: created once (create-if-absent),
  naming the box lease it lives by. A claim is live while its box lease is live; it is never
  renewed itself.
- **Taking over** a claim whose box lease expired is two conditional writes: first the dead box
  lease is *fenced* (replaced, if unchanged since read, by a tombstone naming the taker), then
  the claim is replaced (if unchanged since read). A fenced box learns it at its next renewal
  (its If-Match fails) and every claim it held is lost at once: it stops generating them, never
  commits them, and bills their work as waste. A box that renewed in between makes the fence
  fail: then it is alive and keeps its shards.
- Every run thread asks :meth:`BoxLease.confirm` after each answer: cheap while the last
  renewal is recent, a renewal on the spot when it is not (the process was paused, or starved),
  so a box that comes back from a pause past its lease stops within one answer.

Clocks: an expiry is the holder's clock plus the lease length, judged by the reader's clock.
A live lease has at least two thirds of its length left, so clocks may differ by up to a third
of ``lease_seconds`` (20 s for the default 60) minus a renewal's latency. ``SPARKBATCH_CLOCK_SKEW_S``
shifts this process's lease clock (the fault harness's clock skew).
"""

from __future__ import annotations

import contextlib
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
from .keeper import KEEPER

log = logging.getLogger("sparkbatch")


def owner_id() -> str:
    """This process, as a lease names it: host, pid and a random token (pids repeat across boxes)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def lease_clock() -> float:
    """Wall time for expiries, shifted by ``SPARKBATCH_CLOCK_SKEW_S`` (tests of clock skew)."""
    return time.time() + float(os.environ.get("SPARKBATCH_CLOCK_SKEW_S") or 0.0)


def _safe(owner: str) -> str:
    return "".join(c if c.isalnum() or c in "-._" else "_" for c in owner)


class LeaseLost(Exception):
    """Raised where a lost lease must stop work (the run catches it for the shards concerned)."""


class BoxLease:
    """This process's lease in a bucket; its claims live while it does. Example::

        box = BoxLease(bucket, seconds=60)
        box.ensure()            # created (and renewed by KEEPER) while claims hold it
        box.confirm()           # False once another box fenced it: every claim is lost
    """

    def __init__(self, bucket: Bucket, seconds: float = 60.0, say: Callable[[str], None] = log.warning) -> None:
        self.bucket, self.seconds, self.say = bucket, seconds, say
        self.clock: Callable[[], float] = lease_clock
        self.owner = owner_id()
        self.held = False
        #: Set when another box fenced this one: every claim made under ``owner`` is lost.
        self.fenced = False
        self.claims = 0
        #: Box leases of other boxes found dead and fenced (or gone): their claims are taken
        #: without reading them again (a takeover of a dead box's many shards).
        self.dead: set[str] = set()
        self.buried: set[str] = set()  # their tombstones, deleted once
        self._etag: str | None = None
        self._ok_at = 0.0  # monotonic time a renewal that succeeded was sent
        self._mutex = threading.RLock()

    @property
    def rel(self) -> str:
        return f"leases/boxes/{_safe(self.owner)}.json"

    def _body(self) -> bytes:
        now = self.clock()
        return json.dumps({"owner": self.owner, "renewed": now, "expires": now + self.seconds,
                           "seconds": self.seconds}).encode()

    def ensure(self) -> str:
        """Hold a live box lease (a new incarnation after a fence); returns its owner id."""
        with self._mutex:
            if self.held:
                return self.owner
            if self.fenced:  # a new life: claims of the old owner stay lost
                self.owner, self.fenced = owner_id(), False
            sent = time.monotonic()
            try:
                self._etag = self.bucket.put_tagged(self.rel, self._body(), create=True)
            except FileExistsError:  # our own create, its reply lost and retried (the owner is unique)
                self._etag = read_json(self.bucket, self.rel)[1]
            self.held, self._ok_at = True, sent
            KEEPER.add(self)
            return self.owner

    def renew(self) -> bool:
        """Push the expiry forward; False (and ``fenced``) when another box fenced this one."""
        with self._mutex:
            if not self.held:
                return not self.fenced
            sent = time.monotonic()
            try:
                if not self.bucket.conditional:  # read, then write: the best a store without If-Match allows
                    current = read_json(self.bucket, self.rel)[0]
                    if not self._ours(current):
                        raise FileNotFoundError(self.rel)
                self._etag = self.bucket.put_tagged(self.rel, self._body(), if_match=self._etag)
            except OSError as exc:
                # Refused (fenced: replaced by a tombstone) or absent (the tombstone already gone).
                if not (precondition_failed(exc) or isinstance(exc, FileNotFoundError)):
                    raise
                current = read_json(self.bucket, self.rel)[0]
                if self.bucket.conditional and self._ours(current):
                    self._etag = self.bucket.etag(self.rel)  # our own write, its reply lost and retried
                    self._ok_at = sent
                    return True
                self._lose(current)
                return False
            self._ok_at = sent
            return True

    def _ours(self, current: dict[str, Any] | None) -> bool:
        return current is not None and current.get("owner") == self.owner and not current.get("fenced_by")

    def _lose(self, current: dict[str, Any] | None) -> None:
        self.held, self.fenced = False, True
        KEEPER.remove(self)
        by = current.get("fenced_by") if current else None
        if current is not None and current.get("owner") == self.owner:  # our own tombstone: it did its job
            with contextlib.suppress(OSError):  # whoever took our shards over removes it too
                self.bucket.delete([self.rel])
        self.say(f"{self.rel}: this box's lease expired and {by or 'another box'} took over its shards (it was "
                 f"paused or cut off from the store for over {self.seconds:g} s): their work stops here, is billed "
                 "as waste and is never committed by this box")

    def confirm(self) -> bool:
        """True while this box's claims are its own: free when a renewal succeeded within half a
        lease, else a renewal now (the process was paused or starved past its renewals)."""
        if self.fenced:
            return False
        if not self.held or time.monotonic() - self._ok_at < self.seconds / 2:
            return True
        return self.renew()

    def claimed(self) -> None:
        with self._mutex:
            self.claims += 1

    def unclaimed(self) -> None:
        """A claim released: with none left, the box lease goes (nothing lives by it)."""
        with self._mutex:
            self.claims = max(self.claims - 1, 0)
            self.idle()

    def idle(self) -> None:
        """Delete the box lease when no claim lives by it (none taken, or all released)."""
        with self._mutex:
            if self.claims or not self.held:
                return
            self.held = False
            KEEPER.remove(self)
            try:
                if self._ours(read_json(self.bucket, self.rel)[0]):
                    self.bucket.delete([self.rel])
            except OSError as exc:  # it expires by itself; nothing lives by it any more
                log.warning("could not delete %s (%s): it expires in %.0f s", self.rel, exc, self.seconds)


def read_json(bucket: Bucket, rel: str) -> tuple[dict[str, Any] | None, str | None]:
    """An object's JSON and version tag (None, None when absent). The tag is read first: content
    newer than its tag only makes a conditional write on it fail, never succeed wrongly."""
    tag = bucket.etag(rel)
    raw = bucket.get_bytes(rel)
    if raw is None:
        return None, None
    try:
        return dict(json.loads(raw)), tag
    except ValueError:  # not ours to parse: treated as dead
        return {"owner": "?", "expires": 0.0}, tag


class Claim:
    """A shard's claim, living by a :class:`BoxLease`. ``acquire(wait=True)`` waits while a live
    box holds it; ``lost`` once this box was fenced after taking it. Example::

        claim = Claim(bucket, "leases/0123456789abcdef/shard-00003.json", box)
        if claim.acquire(wait=False):
            ...  # box.confirm() / claim.lost while working
            claim.release()
    """

    def __init__(self, bucket: Bucket, rel: str, box: BoxLease) -> None:
        self.bucket, self.rel, self.box = bucket, rel, box
        self.held = False
        self.owner: str | None = None  # the box incarnation it was taken under

    @property
    def lost(self) -> bool:
        return self.held and (self.box.fenced or self.box.owner != self.owner)

    def _body(self) -> bytes:
        return json.dumps({"owner": self.box.owner, "box": self.box.rel, "taken": self.box.clock()}).encode()

    def acquire(self, wait: bool, poll_s: float | None = None) -> bool:
        """Take the claim; ``wait``: while a live box holds it, poll until it is free or dead."""
        self.box.claimed()  # counted while it tries: the box lease is not dropped under it
        got = False
        try:
            got = self._acquire(wait, poll_s)
            return got
        finally:
            if not got:
                self.box.unclaimed()  # no claim taken: no box lease left behind for nothing

    def _acquire(self, wait: bool, poll_s: float | None) -> bool:
        said = False
        while True:
            owner = self.box.ensure()
            if self.bucket.put_bytes(self.rel, self._body(), create=True):
                return self._mine(owner)
            current, tag = read_json(self.bucket, self.rel)
            if current is None:
                continue  # released between our create and our read: try again
            if current.get("owner") == owner:  # our own create, its reply lost and retried
                return self._mine(owner)
            left = self._life_left(current)
            if left is None:
                continue  # its box changed under us: look again
            if left <= 0:
                if self._take_over(current, tag):
                    self._bury(current)
                    return self._mine(owner)
                continue
            if not wait:
                return False
            if not said:
                self.box.say(f"{self.rel}: leased by {current.get('owner')} for {left:.0f} s more (renewed while it "
                             "works): waiting for it to finish, or for the lease to expire")
                said = True
            time.sleep(min(max(left, 0.05), poll_s or max(self.box.seconds / 6, 0.2)))

    def _life_left(self, claim: dict[str, Any]) -> float | None:
        """Seconds the claim's box lease has left (<= 0: dead); fences a dead box on the way."""
        box_rel = claim.get("box")
        if not box_rel:  # an old-style lease with its own expiry
            return float(claim.get("expires", 0.0)) - self.box.clock()
        if box_rel in self.box.dead:
            return 0.0
        lease, tag = read_json(self.bucket, str(box_rel))
        if lease is None or lease.get("fenced_by") or lease.get("owner") != claim.get("owner"):
            self.box.dead.add(str(box_rel))
            return 0.0  # its box is gone, fenced, or another life: the claim is dead
        left = float(lease.get("expires", 0.0)) - self.box.clock()
        if left > 0:
            return left
        fence = json.dumps({"owner": lease.get("owner"), "fenced_by": self.box.owner, "expires": 0.0}).encode()
        if not self._replace(str(box_rel), fence, tag):
            return None
        self.box.dead.add(str(box_rel))
        return 0.0

    def _bury(self, claim: dict[str, Any]) -> None:
        """Delete the dead box's tombstone once one of its claims is ours (once per dead box):
        its claims stay dead without it (a claim whose box lease is absent is dead), and a
        renewal it tries later finds nothing, which it takes as the loss it is."""
        rel = str(claim.get("box") or "")
        if not rel or rel in self.box.buried:
            return
        self.box.buried.add(rel)
        current = read_json(self.bucket, rel)[0]
        if current is not None and current.get("fenced_by"):
            self.bucket.delete([rel])

    def _take_over(self, current: dict[str, Any], tag: str | None) -> bool:
        if not self._replace(self.rel, self._body(), tag):
            return False
        self.box.say(f"{self.rel}: took over the lease of {current.get('owner')} (that box stopped renewing it: "
                     "it died, was paused, or lost the store)")
        return True

    def _replace(self, rel: str, body: bytes, tag: str | None) -> bool:
        """Replace ``rel`` if it is still the version read; False when someone changed it first."""
        try:
            if self.bucket.conditional:
                self.bucket.put_bytes(rel, body, if_match=tag)
                return True
            # No conditional writes here: write, wait a moment, and keep it only if it is still ours.
            self.bucket.put_bytes(rel, body)
            time.sleep(0.5)
            return self.bucket.get_bytes(rel) == body
        except OSError as exc:
            # Changed, or deleted since read (its box released it): either way not ours to replace.
            if precondition_failed(exc) or isinstance(exc, FileNotFoundError):
                return False
            raise

    def _mine(self, owner: str) -> bool:
        self.held, self.owner = True, owner
        return True

    def holder(self) -> str:
        current, _ = read_json(self.bucket, self.rel)
        return str(current.get("owner")) if current else "?"

    def release(self) -> None:
        """Delete the claim if it is still ours (a taken-over one belongs to its new owner). No
        read first: while this box's lease is confirmed (renewed within half a lease), nobody
        can have taken the claim over, so one DELETE does it."""
        if not self.held:
            return
        try:
            if not self.lost and self.box.confirm() and not self.lost:
                self.bucket.delete([self.rel])
        finally:
            self.held = False
            self.box.unclaimed()
