"""The bucket's writes of one process, from one thread, in order (a shard's parts and answer
segment before its commit), while the run goes on generating."""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from .bucket import Bucket


class Uploader:
    """The bucket's writes, from one thread, in the order given: files (the same name queued twice
    goes once, as the file is when its turn comes: an attempt's record, rewritten at each beat)
    and tasks (a shard's commit, a merge of the answer store). In order matters: a shard's parts
    and answer segments are in the bucket before its commit. ``flush()`` waits until everything
    queued is done; ``check()`` re-raises, in the caller's thread, a write that failed here."""

    def __init__(self, bucket: Bucket) -> None:
        self.bucket = bucket
        self._queue: OrderedDict[str, Callable[[], None]] = OrderedDict()
        self._cond = threading.Condition()
        self._busy = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._tasks = itertools.count()

    def put(self, path: Path, rel: str) -> None:
        def upload() -> None:
            if path.exists():  # a part of a shard committed meanwhile is gone, and not needed
                self.bucket.put_file(path, rel)
        self._add(f"put:{rel}", upload)

    def do(self, task: Callable[[], None]) -> None:
        self._add(f"task:{next(self._tasks)}", task)

    def _add(self, key: str, call: Callable[[], None]) -> None:
        with self._cond:
            self._queue[key] = call
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="sparkbatch-upload", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                _, call = self._queue.popitem(last=False)
                self._busy = True
            try:
                call()
            except BaseException as exc:  # retried already (bucket.py): the run must hear of it
                self._error = self._error or exc
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def flush(self) -> None:
        with self._cond:
            while self._queue or self._busy:
                self._cond.wait()
        self.check()

    def check(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error
