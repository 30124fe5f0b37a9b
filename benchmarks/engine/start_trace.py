"""``sparkbatch`` with the engine start's own steps timed: where a run's engine start goes (issue 61).

    SPARKBATCH_START_TRACE=/tmp/trace.json python -m benchmarks.engine.start_trace run -f defs.py

Runs the CLI in this process with timing wrappers around the steps of an engine start (the
settings probe, the memory checks, the model identity, the compile cache's key, restore and save,
the GPU locks, ``import vllm``, ``vllm.LLM(...)``) and writes, at exit, every call as
``[name, began_s, seconds, thread]`` (``began_s`` from the process's start) to the file the
variable names, with the vLLM import's and ``LLM(...)``'s spans among them. A name missing from
the code under test is skipped, so one tracer times the code before a change and after it.
"""

from __future__ import annotations

import atexit
import builtins
import functools
import importlib
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

BORN = psutil.Process().create_time()
EVENTS: list[list[Any]] = []
#: (module, attribute) wrapped when present; "Class.method" for a method.
TARGETS = [
    ("sparkbatch_dagster.engines.settings", "_platform_hint"),
    ("sparkbatch_dagster.engines.settings", "visible_gpus"),
    ("sparkbatch_dagster.engines.settings", "check_memory"),
    ("sparkbatch_dagster.engines.platform.memory", "device"),
    ("sparkbatch_dagster.engines.platform.compile_cache", "cache_key"),
    ("sparkbatch_dagster.engines.platform.compile_cache", "pack"),
    ("sparkbatch_dagster.engines.platform.compile_cache", "unpack"),
    ("sparkbatch_dagster.engines.platform.compile_cache", "snapshot"),
    ("sparkbatch_dagster.engines.platform.model", "model_identity"),
    ("sparkbatch_dagster.engines.start", "sized_memory"),
    ("sparkbatch_dagster.engines.start", "start"),
    ("sparkbatch_dagster.engines.offline.llm_start", "start_llm"),
    ("sparkbatch_dagster.definitions.compile_cache", "CompileCacheRun.restore"),
    ("sparkbatch_dagster.definitions.compile_cache", "CompileCacheRun.save"),
    ("sparkbatch_dagster.definitions.compile_cache", "CompileCacheRun.finish"),
    ("sparkbatch_dagster.definitions.compile_cache", "for_resource"),
    ("sparkbatch_dagster.engines.gpu_lock", "HeldEngine.start"),
    ("sparkbatch_dagster.definitions.resource", "VLLMResource.get_engine"),
    ("sparkbatch_dagster.definitions.resource", "VLLMResource.close"),
    ("sparkbatch_dagster.engines.base", "LazyEngine._start_meanwhile"),
    ("sparkbatch_dagster.run.feed", "Feed.meanwhile"),
    ("sparkbatch_dagster.cli.commands", "shard"),
]


def record(name: str, began: float, seconds: float) -> None:
    EVENTS.append([name, round(began - BORN, 3), round(seconds, 3), threading.current_thread().name])


def timed(name: str, fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        began, t = time.time(), time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            record(name, began, time.perf_counter() - t)
    wrapper.__wrapped_by_trace__ = True  # type: ignore[attr-defined]
    return wrapper


def patch_all() -> None:
    for module_name, attr in TARGETS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        owner_name, _, method = attr.rpartition(".")
        owner = getattr(module, owner_name, None) if owner_name else module
        fn = getattr(owner, method, None) if owner is not None else None
        if fn is None or getattr(fn, "__wrapped_by_trace__", False):
            continue
        raw = owner.__dict__.get(method) if owner_name else None
        if isinstance(raw, staticmethod):
            setattr(owner, method, staticmethod(timed(attr, raw.__func__)))
        elif isinstance(raw, classmethod):
            setattr(owner, method, classmethod(timed(attr, raw.__func__)))
        else:
            wrapped = timed(attr, fn)
            setattr(owner, method, wrapped)
        # Names bound with ``from x import f`` elsewhere: rebind them too.
        if not owner_name:
            for mod in list(sys.modules.values()):
                if mod is not None and mod is not module and getattr(mod, method, None) is fn \
                        and (getattr(mod, "__name__", "") or "").startswith("sparkbatch_dagster"):
                    setattr(mod, method, wrapped)


_real_import = builtins.__import__
_vllm_done = threading.Event()


def tracing_import(name: str, *args: Any, **kwargs: Any) -> Any:
    """The first ``import vllm`` timed whole (its outermost call), then ``LLM.__init__`` wrapped."""
    if _vllm_done.is_set() or not name.startswith("vllm") or "vllm" in sys.modules:
        return _real_import(name, *args, **kwargs)
    began, t = time.time(), time.perf_counter()
    module = _real_import(name, *args, **kwargs)
    record("import vllm", began, time.perf_counter() - t)
    _vllm_done.set()
    try:
        from vllm.entrypoints import llm as llm_module

        llm_module.LLM.__init__ = timed("vllm.LLM(...)", llm_module.LLM.__init__)
    except Exception:  # noqa: BLE001 - a tracer never breaks the run
        pass
    return module


def main() -> int:
    out = os.environ.get("SPARKBATCH_START_TRACE")
    if out:
        atexit.register(lambda: Path(out).write_text(json.dumps({"events": EVENTS})))
    import sparkbatch_dagster.cli.entry as entry
    import sparkbatch_dagster.definitions.resource  # noqa: F401 - loaded so its names can be wrapped

    patch_all()
    builtins.__import__ = tracing_import
    record("cli main", time.time(), 0.0)
    return int(entry.main(sys.argv[1:]))


if __name__ == "__main__":
    raise SystemExit(main())
