"""Measurement-only switches: what a benchmark turns off to measure what it saves, applied from
here, over the engine's modules, for the arm that measures it. The production objects carry no
switch of their own for it.

Each is a context manager (``unittest.mock`` patches), on for the ``with`` block::

    with switches.no_confidence():      # answers without log-probabilities (benchmarks/labels/confidence.py)
        list(engine.generate(requests, sampling, output))

A patch reaches only this process: an engine's data-parallel workers (processes of their own)
keep their defaults.
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Iterator, Mapping
from typing import Any
from unittest import mock

from sparkbatch_dagster.engines.answers import encode_ahead, label_tokens
from sparkbatch_dagster.engines.answers import plan as answer_plan
from sparkbatch_dagster.engines.config import EngineConfig
from sparkbatch_dagster.engines.offline import vllm_offline
from sparkbatch_dagster.engines.platform import heap
from sparkbatch_dagster.engines.server import handoff, vllm_server


def no_confidence() -> contextlib.AbstractContextManager[Any]:
    """No answer carries a confidence: no log-probabilities asked, none scored."""
    return mock.patch.object(answer_plan, "scorer", lambda *args, **kwargs: None)


@contextlib.contextmanager
def inline_encoding() -> Iterator[None]:
    """Prompts encoded (offline) and bodies built (server) on the engine loop's own thread, a
    chunk when it is submitted, as before ``encode_ahead.py``."""
    with mock.patch.object(vllm_offline, "EncodeAhead", functools.partial(encode_ahead.EncodeAhead, threaded=False)), \
            mock.patch.object(vllm_server, "Prepared", functools.partial(encode_ahead.Prepared, threaded=False)):
        yield


def unbatched_handoff() -> contextlib.AbstractContextManager[Any]:
    """Each server request handed to the client's loop alone, as before ``handoff.py``."""
    return mock.patch.object(vllm_server, "Handoff", functools.partial(handoff.Handoff, batched=False))


@contextlib.contextmanager
def label_routing(probe: int | None = None, bar: float | None = None) -> Iterator[None]:
    """The one-step labels' probe (rows sent before their answers decide) and bar (the share
    asked again up to which the rest go in one step) set for every platform."""
    with contextlib.ExitStack() as stack:
        if probe is not None:
            stack.enter_context(mock.patch.object(label_tokens, "PROBE", probe))
        if bar is not None:
            stack.enter_context(mock.patch.object(label_tokens, "max_asked_again", lambda cpu: bar))
        yield


def thawed() -> contextlib.AbstractContextManager[Any]:
    """The heap not frozen while generating (``engines/platform/heap.py`` finds the collector
    off, so it leaves the heap as it is); the collector itself keeps running."""
    collector = types.SimpleNamespace(**{name: getattr(heap.gc, name) for name in dir(heap.gc)
                                         if not name.startswith("__")})
    collector.isenabled = lambda: False
    return mock.patch.object(heap, "gc", collector)


@contextlib.contextmanager
def engine_switches(engine: Any, switches: Mapping[str, Any]) -> Iterator[None]:
    """``switches`` on for the block (``throughput.py --pipeline-b``): an engine setting
    (``{"label_decoding": "grammar"}``, a ``VLLMResource`` field), ``label_probe`` / ``label_bar``
    (:func:`label_routing`), ``confidence: false``, ``encode_ahead: false``, or another attribute
    of the engine (``native_budget``)."""
    known = {"label_probe", "label_bar", "confidence", "encode_ahead"}
    fields = {k: v for k, v in switches.items() if k in EngineConfig.model_fields}
    attrs = {k: v for k, v in switches.items() if k not in known and k not in fields}
    with contextlib.ExitStack() as stack:
        if fields:
            stack.enter_context(mock.patch.object(engine, "settings", engine.settings.model_copy(update=fields)))
        stack.enter_context(label_routing(switches.get("label_probe"), switches.get("label_bar")))
        if switches.get("confidence") is False:
            stack.enter_context(no_confidence())
        if switches.get("encode_ahead") is False:
            stack.enter_context(inline_encoding())
        if attrs:
            stack.enter_context(mock.patch.multiple(engine, **attrs))
        yield


def thawed_arms(spec: str) -> list[str]:
    """--thawed as arm names; only the pipeline and server arms generate through the runner."""
    arms = [a.strip() for a in spec.split(",") if a.strip()]
    wrong = [a for a in arms if a not in ("pipeline", "server")]
    if wrong:
        raise SystemExit(f"--thawed {spec!r}: {wrong} are not arms with a heap to freeze; give pipeline and/or server")
    return arms


def thaw(run: Any, inner: str, times: dict[str, list[float]]) -> Any:
    """A --thawed twin of a pipeline or server round (its own job home): engines/platform/heap.py off while it
    runs, its runner's own seconds in ``{inner}_thawed``."""
    return twin(run, inner, times, f"{inner}_thawed", thawed())


def twin(run: Any, inner: str, times: dict[str, list[float]], key: str, changed: Any) -> Any:
    """A twin of a pipeline or server round, run with ``changed`` (a context manager) in effect.
    Its runner's own seconds (``inner``) go to ``key``, not the default arm's."""
    def go() -> float:
        try:
            with changed:
                return float(run())
        finally:
            times.setdefault(key, []).append(times[inner].pop())
    return go
