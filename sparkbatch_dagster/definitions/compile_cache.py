"""The engine's compile cache travels with the job's home: paid once per kind of machine, not per rental.

When a run's engine starts cold (``VLLMResource.get_engine``, ``compile_cache=True``, a home given
by the run with ``use_home``), :meth:`CompileCacheRun.starting` wraps the start:

1. before it, a machine with nothing under the key (``engines/platform/compile_cache.py``) restores the
   home's archive of the key (``home/compile_store.py``), if the home has one;
2. the start runs with ``VLLM_CACHE_ROOT`` / ``TORCHINDUCTOR_CACHE_DIR`` / ``TRITON_CACHE_DIR``
   pointing at the key's folder, which its processes inherit (engine core, ``vllm serve``);
3. after it (the compiling is done), the folder is saved to the home, in a thread while the engine
   works, unless the home holds it as it is; at the run's end (:meth:`CompileCacheRun.finish`),
   once that save is done, again, only if it changed.

A warm engine (``keep_warm``) and servers someone else runs (``server_url``) do none of this. A
failure here (a broken archive, a store that says no) is a warning: the engine compiles as on a
new machine and the run goes on.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from ..engines import settings
from ..engines.platform import compile_cache as cc
from ..home import compile_store
from ..home.layout import JobHome
from ..run.progress import tell


class Log(Protocol):
    """What a run's log offers (``context.log``, a ``logging.Logger``)."""

    def info(self, msg: str) -> Any: ...
    def warning(self, msg: str) -> Any: ...


class CompileCacheRun:
    """One cold engine start's compile cache: restored before it, saved after it and at the run's end.

    Example::

        run = CompileCacheRun(home, *cache_key("SmolLM2@3f2a", "auto", 1, {}), log=context.log)
        with run.starting():
            engine = start(settings)
        ...
        run.finish()
    """

    def __init__(self, home: JobHome, key: str, covers: dict[str, Any], log: Log) -> None:
        self.home, self.key, self.covers, self.log = home, key, covers, log
        self.folder = cc.key_dir(key)
        #: The folder's files as the home's archive holds them, when known (None: the home has none).
        self._home_state: dict[str, int] | None = None
        #: What happened, for a benchmark or a test: bytes moved and seconds spent.
        self.restored_bytes = self.saved_bytes = 0
        self.restore_s = self.save_s = 0.0
        self._saving: threading.Thread | None = None  # the save begun after the start (starting)

    @contextlib.contextmanager
    def starting(self, ready: Callable[[], object] | None = None) -> Iterator[None]:
        """Around the engine's start: restore, the environment, then save what it compiled.
        ``ready``, called after the restore, waits for what else the start needs (`sparkbatch run`'s
        ``import vllm`` in the caller's thread: the restore, a download from a bucket on a new
        machine, runs beside it instead of after it)."""
        self._guarded("restore", self.restore)
        if ready is not None:
            ready()
        with settings.environment(cc.cache_env(self.folder)):
            yield
        # Saved while the engine works, not before it answers: packing the folder took seconds of
        # every start in a new home, on the run's critical path (issue 61). What the start wrote is
        # listed here, packed in the thread; finish() waits for it, then saves what came later.
        files = cc.snapshot(self.folder)
        self._saving = threading.Thread(target=self._guarded, args=("save", lambda: self.save(files)),
                                        name="sparkbatch-compile-cache-save")
        self._saving.start()

    def finish(self) -> None:
        """The run's end: the save begun after the start waited for, then a save again only if the
        compilers wrote more since (never raises)."""
        if self._saving is not None:
            self._saving.join()
            self._saving = None
        self._guarded("save", self.save)

    def restore(self) -> None:
        """Fill this machine's empty key folder from the home's archive, if it has one."""
        began = time.perf_counter()
        what = cc.describe(self.key, self.covers)
        local = cc.snapshot(self.folder)
        if local:
            if compile_store.stored_size(self.home, self.key) is not None:
                self._home_state = local  # the home has one: uploaded again only if this machine's grows
            self._say(f"compile cache: {cc.size_mb(sum(local.values()))} already on this machine in {self.folder} "
                      f"({what})")
            return
        into = cc.cache_root() / f".{self.key}.download-{os.getpid()}.tar.gz"
        try:
            archive = compile_store.fetch(self.home, self.key, into)
            if archive is None:
                self._say(f"compile cache: none in {self.home.location} for {what}; this start compiles and saves it")
                return
            if cc.unpack(archive, self.folder):
                self._home_state = cc.snapshot(self.folder)
                self.restored_bytes = archive.stat().st_size
                self.restore_s = time.perf_counter() - began
                self._say(f"compile cache: restored {cc.size_mb(self.restored_bytes)} "
                          f"({cc.size_mb(sum(self._home_state.values()))} unpacked) from {self.home.location} in "
                          f"{self.restore_s:.1f} s ({what})")
        finally:
            into.unlink(missing_ok=True)

    def save(self, files: dict[str, int] | None = None) -> None:
        """Pack the key folder into the home (``files``: as a snapshot listed them; default, as it
        is now), unless it is empty or the home holds it as it is."""
        local = cc.snapshot(self.folder) if files is None else files
        if not local or local == self._home_state:
            return
        began = time.perf_counter()
        packed = cc.cache_root() / f".{self.key}.upload-{os.getpid()}.tar.gz"
        try:
            size = cc.pack(self.folder, packed, local)
            compile_store.store(self.home, self.key, packed)
        finally:
            packed.unlink(missing_ok=True)
        self._home_state = local
        self.saved_bytes, self.save_s = size, time.perf_counter() - began
        self._say(f"compile cache: saved {cc.size_mb(size)} to {compile_store.location(self.home, self.key)} in "
                  f"{self.save_s:.1f} s (key {self.key})")

    def _say(self, line: str) -> None:
        self.log.info(line)
        tell(line)  # above `sparkbatch run`'s progress bar: it explains the start's length

    def _guarded(self, what: str, step: Any) -> None:
        try:
            step()
        except Exception as exc:  # a cache: never the reason a run fails
            self.log.warning(f"compile cache: {what} failed ({type(exc).__name__}: {exc}); the run goes on "
                             f"(key {self.key})")


def for_resource(resource: Any, home: JobHome, log: Log) -> CompileCacheRun | None:
    """The compile cache of ``resource``'s (a ``VLLMResource``, resolved) next cold start, or None
    when it has none: turned off (``compile_cache=False``) or servers someone else runs (``server_url(s)``)."""
    if not resource.compile_cache or resource._endpoints():
        return None
    try:
        # What shapes the compiled graphs, from the fields: no platform to ask, no vllm to import.
        shaping = {"max_num_seqs": resource.resolved_max_num_seqs(), "max_model_len": resource.max_model_len,
                   **resource.engine_kwargs}
        key, covers = cc.cache_key(resource.model_identity(), resource.dtype_choice()[0], resource.tensor_parallel_size,
                                    shaping)
    except Exception as exc:  # a model that cannot be read: the start says so, in its own words
        log.warning(f"compile cache: no key for this engine ({type(exc).__name__}: {exc}); it starts with this "
                    "machine's own caches")
        return None
    return CompileCacheRun(home, key, covers, log)
