"""A shard's lock for one run: this machine's ``flock``, and with a bucket home the shard's claim
between machines (:mod:`.lease`)."""

from __future__ import annotations

import logging
from typing import Any

from .lease import Claim

log = logging.getLogger("sparkbatch")


class PartitionLock:
    """This machine's ``flock`` on a shard, and with a bucket home the shard's claim too: the
    flock keeps two runs of one box apart, the claim two boxes. Example::

        lock = home.partition_lock(version, "shard-00003")
        if lock.acquire(wait=False):            # the claim is waited for (and said so) unless lease_wait=False
            try: ...
            finally: lock.release()
    """

    def __init__(self, local: Any, lease: Claim | None = None) -> None:
        self.local, self.lease = local, lease
        self.path = local.path
        #: Why the last acquire failed: "local" (a run of this box) or "lease" (another box).
        self.refused_by: str | None = None

    @property
    def lost(self) -> bool:
        """True once another box took this shard over (this box was fenced): stop, never commit."""
        return self.lease is not None and self.lease.lost

    @property
    def held_remotely(self) -> bool:
        """True while this lock holds the shard's claim in the bucket."""
        return self.lease is not None and self.lease.held

    def confirm(self) -> bool:
        """False when the shard is (now known to be) another box's; may renew the box lease."""
        if self.lease is None or not self.lease.held:
            return True
        return self.lease.box.confirm() and not self.lease.lost

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
        return True

    def holder(self) -> str:
        return self.lease.holder() if self.lease is not None and self.local.holder() == "?" else self.local.holder()

    def release(self) -> None:
        if self.lease is not None and self.lease.held:
            try:
                self.lease.release()
            except OSError as exc:  # its box lease goes or expires: another box waits a lease length, no more
                log.warning("could not release %s (%s): it lapses with this box's lease", self.lease.rel, exc)
        self.local.release()
