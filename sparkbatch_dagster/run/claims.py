"""Which shards a run may label: locked on this box, leased with a bucket home, not committed since.

A run takes what it can at once and leaves shards another box holds for after its own: it then
waits for them one at a time, holding no lease, so two boxes can never wait on each other.
"""

from __future__ import annotations

from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor

from ..errors import SparkbatchError
from ..home import JobHome
from ..home.partition_lock import PartitionLock


class Claims:
    """The partition locks of one run. Example::

        claims = Claims(home, version, keys, optional=set())
        mine, leased = claims.take()        # label ``mine`` now; ``leased`` after, via wait_for(key)
        ...
        claims.release(key)                 # as each shard commits
        claims.release_all()                # whatever the run's end
    """

    def __init__(self, home: JobHome, version: str, keys: list[str], optional: Collection[str] = ()) -> None:
        self.home, self.version, self.optional = home, version, optional
        self.locks: dict[str, PartitionLock] = {k: home.partition_lock(version, k) for k in keys}
        # A bucket home's box lease, shared by every claim; the identity the claims were taken under.
        self._box = next((lock.lease.box for lock in self.locks.values() if lock.lease is not None), None)
        self._owner = self._box.owner if self._box is not None else None
        #: Keys committed by another run (another box, with a bucket home) by the time they were locked.
        self.committed_elsewhere: list[str] = []

    def take(self) -> tuple[list[str], list[str]]:
        """Lock what can be locked now: the keys to label, and those another box holds the lease of
        (for later). A key another run of this box writes stops the run, unless it is optional."""
        taken, leased = [], []
        got_all = self._acquire_all()
        self._owner = self._box.owner if self._box is not None else None
        for (key, lock), got in zip(self.locks.items(), got_all, strict=True):
            if not got:
                if key in self.optional:
                    continue
                if lock.refused_by == "lease":
                    leased.append(key)
                    continue
                raise SparkbatchError(
                    f"partition {key} is being written by another run (pid {lock.holder()}): "
                    "wait for that run to finish, or run the other partitions"
                )
            self.home.set_aside_broken(self.version, key)  # ours now: a broken commit is redone
            taken.append(key)
        self.home.pull_for_run(self.version, taken)  # bucket home: commits made since, earlier attempts' parts
        return [k for k in taken if self._needed(k)], leased

    def _acquire_all(self) -> list[bool]:
        """Every lock tried without waiting, in key order. A bucket home's claims are requests:
        up to 32 at once, so 2,000 shards take seconds, not minutes."""
        def one(lock: PartitionLock) -> bool:
            return lock.acquire(wait=False, lease_wait=False)

        locks = list(self.locks.values())
        if self.home.remote is None or len(locks) < 2:
            return [one(lock) for lock in locks]
        with ThreadPoolExecutor(max_workers=min(32, len(locks)), thread_name_prefix="sparkbatch-claims") as pool:
            return list(pool.map(one, locks))

    def wait_for(self, key: str) -> bool:
        """Lock a key another box held (waiting for its lease, and saying so): True when it still
        needs labeling."""
        if not self.locks[key].acquire(wait=False, lease_wait=True):
            return False
        self._owner = self._box.owner if self._box is not None else None  # a new life after a fence
        self.home.set_aside_broken(self.version, key)
        self.home.pull_for_run(self.version, [key])
        return self._needed(key)

    def _needed(self, key: str) -> bool:
        """A key now locked: True when it needs labeling; False (and unlocked) when it was committed
        since, by its own run or another box (then it is ``committed_elsewhere``)."""
        if not self.home.is_done(self.version, key):
            return True
        self.locks[key].release()
        if key not in self.optional:
            self.committed_elsewhere.append(key)
        return False

    def release(self, key: str) -> None:
        self.locks[key].release()

    def intact(self) -> bool:
        """False once this box's lease was fenced: another box may own every claim it held. Asked
        after every answer: one comparison unless the last renewal is half a lease old (then it
        renews), never a walk over the shards."""
        return self._box is None or (self._box.confirm() and self._box.owner == self._owner)

    def still_mine(self, key: str) -> bool:
        """Asked right before a shard's commit: False when another box took it over."""
        return self.locks[key].confirm()

    def release_all(self) -> None:
        held = [lock for lock in self.locks.values() if lock.held_remotely]
        if len(held) > 1:  # a bucket home's claims: one DELETE each, many at once
            with ThreadPoolExecutor(max_workers=min(32, len(held)), thread_name_prefix="sparkbatch-claims") as pool:
                list(pool.map(PartitionLock.release, held))
        for lock in self.locks.values():
            lock.release()
