"""One ``FileLock`` used by two threads of one process at once, as a result store's lookups (the
run's thread) and merges (the upload thread) use theirs: each ``held()`` releases its own hold.
Before, the second thread's hold replaced the first's handle, which was dropped (its lock with
it) while the first still held it, or a release closed the other's ("'NoneType' object has no
attribute 'close'", harness seed 30926)"""

from __future__ import annotations

import threading
from pathlib import Path

from sparkbatch_dagster.home.locks import FileLock


def test_two_threads_hold_one_lock_object_and_each_lets_go_of_its_own(tmp_path: Path) -> None:
    lock = FileLock(tmp_path / ".lock")
    inside, leave = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            with lock.held(shared=True):
                inside.set()
                assert leave.wait(30)
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
            errors.append(exc)

    first = threading.Thread(target=reader)
    first.start()
    assert inside.wait(30)
    with lock.held(shared=True):  # a second reader on this thread, while the first holds
        pass
    writer = FileLock(tmp_path / ".lock")
    assert not writer.acquire(wait=False)  # the first reader still holds its lock
    leave.set()
    first.join(30)
    assert errors == [] and not first.is_alive()
    other = FileLock(tmp_path / ".lock")  # nothing left held: a writer takes it at once
    assert other.acquire(wait=False)
    other.release()
