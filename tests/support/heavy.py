"""One heavy engine start at a time on this machine, across test sessions.

A test marked ``heavy`` starts more than one engine process (data-parallel engines, a model split
over two nodes, a server with several engine cores and frontends) or an engine beside ``dagster
dev`` and a browser. Two such at once, from two ``make test`` runs on one 2-core box with 24 GB,
put ten torch processes on two cores and ran past the start's own limit (a 900 s server start at
load average 70), or ran the box out of memory (the OOM killer took a session engine's worker,
and every later test on it failed). So a heavy test first takes an
exclusive ``flock`` on one file per machine (``$SPARKBATCH_TEST_HEAVY_LOCK``, default
``<tmp>/sparkbatch-tests-heavy.lock``), held for the test and released by the OS if the session
dies. The test's own clocks start after the slot is taken; the wait is reported, never timed out:
the holder is a test with limits of its own.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


def lock_path() -> Path:
    given = os.environ.get("SPARKBATCH_TEST_HEAVY_LOCK")
    return Path(given) if given else Path(tempfile.gettempdir()) / "sparkbatch-tests-heavy.lock"


@contextmanager
def heavy_slot(path: Path, say: Callable[[str], None] = print) -> Iterator[float]:
    """Hold the machine's heavy-test slot; yields the seconds waited for it."""
    with open(path, "a+") as f:
        t0 = time.monotonic()
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            say(f"waiting for the machine's heavy-test slot ({path}), held by: {f.read().strip() or '?'}")
            fcntl.flock(f, fcntl.LOCK_EX)
        waited = time.monotonic() - t0
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} in {os.getcwd()}\n")
        f.flush()
        try:
            yield waited
        finally:
            f.truncate(0)
            fcntl.flock(f, fcntl.LOCK_UN)
