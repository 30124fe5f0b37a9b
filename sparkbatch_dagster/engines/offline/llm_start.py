"""``vllm.LLM`` started for the offline engine: within a deadline, and killed whole when it fails.

A start that fails says why in one line with the fix (memory settings, a model that cannot be
loaded, a worker node that never joined), and leaves no engine core or worker running; and the
one place a vLLM failure while generating becomes an :class:`EngineError` (:func:`engine_failure`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from ...errors import EngineError


def start_llm(model: str, llm_kwargs: dict[str, Any], timeout_s: float | None) -> Any:
    """``vllm.LLM(model, **llm_kwargs)``, stopped after ``timeout_s``.

    vLLM waits without limit for an engine core that never gets ready (a worker node that never
    joins, a communicator that never forms): on a rented box that is hours billed for nothing.
    At the deadline the engine core this start created is killed, which makes vLLM's own
    startup wait fail, and the start fails with what to check. A start that fails for any reason
    kills what it started: an engine core that dies (an OOM kill) leaves its worker running.
    """
    import psutil
    from vllm import LLM

    from ..platform.heap import frozen_heap
    from ..platform.orphans import watch_descendants

    watch_descendants()  # before `before`: the watchdog is no child of this start's to kill
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    lock, done, expired = threading.Lock(), threading.Event(), threading.Event()

    def kill_started() -> None:
        # This start's engine core and every worker under it, listed before any is killed: a
        # worker outlives its engine core (blocked in a collective, or warming up when the core
        # died) and would keep its CPU busy and its GPU memory held.
        for proc in [p for p in me.children(recursive=True) if p.pid not in before]:
            with contextlib.suppress(psutil.Error):
                proc.kill()

    def stop_at_deadline(timeout_s: float) -> None:
        if done.wait(timeout_s):
            return
        with lock:
            if done.is_set():
                return
            expired.set()
        kill_started()

    if timeout_s is not None:
        threading.Thread(target=stop_at_deadline, args=(timeout_s,), name="sparkbatch-start-deadline",
                         daemon=True).start()
    try:
        # vLLM forks its engine core, which inherits this process's heap (Dagster, DuckDB, the
        # run's objects) and collects garbage through its whole start (weights, compile, CUDA
        # graphs) before it freezes its own: every full pass walked the inherited objects and
        # copied their pages. Frozen before the fork, they stay out of the child's passes
        # (Python's gc.freeze advice for fork; docs/performance.md, "The engine core forks from a frozen heap").
        with frozen_heap():
            llm = LLM(model=model, **llm_kwargs)
    except Exception as exc:  # vLLM raises many types; all mean "could not start"
        kill_started()  # an engine core that died leaves its workers running: the next start needs the memory
        why = _explain_start_timeout(model, llm_kwargs, timeout_s) if expired.is_set() else None
        raise EngineError(why or _explain_start_failure(model, llm_kwargs, exc)) from exc
    finally:
        with lock:
            done.set()
    if expired.is_set():  # the deadline came as the start ended: its engine core is gone
        raise EngineError(_explain_start_timeout(model, llm_kwargs, timeout_s))
    return llm


def _explain_start_timeout(model: str, kwargs: dict[str, Any], timeout_s: float | None) -> str:
    text = f"vLLM did not start model {model!r} within {timeout_s:g}s (engine_start_timeout_s) and was stopped. Fix: "
    nnodes = int(kwargs.get("nnodes") or 1)
    if nnodes > 1:
        where = f"{kwargs.get('master_addr')}:{kwargs.get('master_port') or 'its default port'}"
        return text + (f"the engine spans nnodes={nnodes} machines and waits for every one: check that "
                       f"`sparkbatch worker-node --node-rank K` (K = 1 to {nnodes - 1}) runs on each other machine, "
                       f"reaches {where}, and that its log shows its GPU workers loading the model; raise "
                       "engine_start_timeout_s if the model needs longer to load")
    return text + ("vLLM's log above shows the step it stopped at; raise engine_start_timeout_s if the model "
                   "needs longer to load and compile")


def _explain_start_failure(model: str, kwargs: dict[str, Any], exc: Exception) -> str:
    text = str(exc)
    hint = "check the model and engine settings of VLLMResource"
    low = text.lower()
    if "memory" in low or "kv cache" in low or "cache blocks" in low:
        hint = (
            f"gpu_memory_utilization={kwargs.get('gpu_memory_utilization')} / "
            f"kv_cache_memory_bytes={kwargs.get('kv_cache_memory_bytes')} cannot be met on this machine: "
            "lower gpu_memory_utilization (or kv_cache_memory_gb), or lower max_model_len / max_num_seqs (on a "
            "unified-memory GPU such as the DGX Spark: raise memory_reserve_gb)"
        )
    elif "does not exist" in low or "not found" in low or "no such file" in low or "repo" in low:
        hint = f"model={model!r} cannot be loaded: give a local Hugging Face folder or leave model unset"
    return f"vLLM could not start model {model!r}: {text.splitlines()[0] if text else type(exc).__name__}. Fix: {hint}"


@contextlib.contextmanager
def engine_failure() -> Iterator[None]:
    """Any failure inside vLLM while generating is the engine's: an EngineError, which fails the
    run with every finished row on disk (never a vLLM exception type leaking to the caller)."""
    try:
        yield
    except Exception as exc:
        raise EngineError(f"vLLM engine failed while generating: {exc!r}") from exc
