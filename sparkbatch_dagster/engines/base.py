"""The engine interface every backend implements."""

from __future__ import annotations

import abc
import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from ..errors import EngineError
from ..spec import OutputSpec, SamplingSpec
from ..spec.batch_tools import Tools
from .platform import memory
from .platform.spans import Spans


@dataclass(frozen=True)
class EngineRequest:
    """One prompt to generate; ``id`` comes back on its result. ``key``: the rendered prompt's
    name in the result store (``run.result_store.prompt_key``), when the caller has it.
    ``sampling`` / ``output``: this request's own settings, where they differ from the ones
    ``generate`` got (a batch file's line sets its own ``max_tokens`` or ``response_format``);
    None: those. ``tools``: a batch line's tools (given to the chat template; a forced call's
    answer becomes tool calls, :mod:`.answers.tools`)."""

    id: str
    messages: list[dict[str, str]]
    key: str | None = None
    sampling: SamplingSpec | None = None
    output: OutputSpec | None = None
    tools: Tools | None = None


def request_of(rid: str, prompt: Any, key: str | None = None) -> EngineRequest:
    """The request for a prompt (``RenderedPrompt``, or a batch file's ``RequestPrompt`` with
    its own sampling and output); ``key``: its name in the result store."""
    return EngineRequest(rid, prompt.messages(), key, getattr(prompt, "sampling", None),
                         getattr(prompt, "output", None), getattr(prompt, "tools", None))


def settings_key(sampling: SamplingSpec, output: OutputSpec) -> str:
    """One string per (sampling, output) pair: the key of per-request parameters built once."""
    return sampling.model_dump_json() + "\x1e" + output.model_dump_json()


@dataclass(frozen=True)
class EngineResult:
    """One finished request. ``error`` is set (and ``text`` None) when the row failed alone.

    ``retryable`` marks a transient failure (5xx, timeout, reset after every retry): it is not
    the row's fault, so nothing is written for it; the row stays pending and the next run
    retries it. ``finish_reason`` is the engine's own (``stop``, ``length`` when the answer hit
    ``max_tokens``); None when it gave none. ``confidence``: how sure the model was of the
    answer (:mod:`.confidence`: a label's probability among the labels; a JSON answer's least
    likely value token), None for free text and where the engine gave no log-probabilities.
    ``model``: the model that answered, when it is not the engine's own (a cascade's stage).
    ``reasoning``: a reasoning model's thinking (:mod:`.reasoning`), None when it did not think;
    ``text`` is then the answer after it, and ``reasoning_tokens`` the thinking's tokens (its
    markers included), which ``output_tokens`` counts too. ``extra``: what the request asked for
    beyond the text (:class:`.answers.extras.Extras`' JSON: stop string, choices, log-probabilities).
    """

    id: str
    text: str | None
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None
    retryable: bool = False
    finish_reason: str | None = None
    confidence: float | None = None
    model: str | None = None
    reasoning: str | None = None
    reasoning_tokens: int = 0
    extra: str | None = None


def structured_outputs(output: OutputSpec) -> dict[str, Any] | None:
    """vLLM's structured-outputs fields for an output kind (offline params and server body alike)."""
    if output.kind == "label":
        return {"choice": list(output.labels)}
    if output.kind == "json":
        return {"json": output.json_schema}
    if output.regex:
        return {"regex": output.regex}
    return None


class Engine(abc.ABC):
    """Generates results for a stream of requests, yielding each as soon as it finishes.

    Implementations keep the backend busy: they take new requests from the iterable while
    earlier ones run, so no batch drains between chunks. A failure of the whole engine
    raises :class:`~sparkbatch_dagster.errors.EngineError`; a failure of one request is an
    :class:`EngineResult` with ``error`` set.
    """

    #: Identifies the model in fingerprints and output rows.
    model_id: str = ""
    #: Seconds spent starting the engine (kept out of throughput numbers).
    start_seconds: float = 0.0
    #: How the start sized its memory, for the log (unified memory); empty elsewhere.
    memory_note: str = ""
    #: Seconds the start waited for another run's engine to free the GPUs (``engines/gpu_lock.py``):
    #: not part of the start, which this run pays for.
    gpu_wait_s: float = 0.0
    #: The labeling step's parts (:mod:`.spans`): a backend may name its own work there (tokenizing).
    spans: Spans | None = None

    @abc.abstractmethod
    def generate(
        self,
        requests: Iterable[EngineRequest],
        sampling: SamplingSpec,
        output: OutputSpec,
    ) -> Iterator[EngineResult]:
        """Yield one result per request, in completion order."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the engine's memory and processes."""

    def part(self, name: str) -> AbstractContextManager[None]:
        """Count what runs inside as part ``name`` of the step's time (``spans``; none: nothing)."""
        return self.spans.span(name) if self.spans is not None else contextlib.nullcontext()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LazyEngine(Engine):
    """Starts the real engine only when the first request actually needs generating.

    A rerun whose answers all come from the result store (appended rows aside, a touched
    input, a new gold column) then costs no engine start, which is a minute or more.
    ``model_id`` is the identity the run computed and stamps its rows with; an engine that
    answers as another one (new weights copied in since) stops the run before its first answer.

    The start runs in a thread of its own. Meanwhile the caller's thread keeps preparing work:
    when the request iterable has a ``meanwhile()`` method, it is called again and again until
    it returns False (nothing more to prepare) or the engine is ready; the requests themselves
    go to the engine once it is (a start that fails raises its own error here, as if it had
    run in this thread). ``spans``: the step's parts (:mod:`.spans`), the start among them::

        engine = LazyEngine(model_id, resource.get_engine, log=context.log.info)
        for result in engine.generate(requests, spec.sampling, spec.output): ...
    """

    spans: Spans  # always one: the step's, or its own

    def __init__(self, model_id: str, start: Callable[[], Engine], log: Callable[[str], None] | None = None,
                 settings: str = "", spans: Spans | None = None, cold_starts: Callable[[], int] | None = None) -> None:
        self.model_id = model_id
        self._start = start
        self._cold_starts = cold_starts  # how many engines ``start`` has loaded: unchanged for a warm one
        self._log, self._settings = log, settings  # "loading" and "ready" lines, outside the timed start
        self.spans = spans or Spans()
        self.started: Engine | None = None
        self._start_s = 0.0

    @property  # type: ignore[override]
    def start_seconds(self) -> float:
        """This run's engine starts: the one here, and those the engine made later (a cascade's stages)."""
        later = getattr(self.started, "later_start_s", 0.0) if self.started is not None else 0.0
        return self._start_s + later

    @start_seconds.setter
    def start_seconds(self, value: float) -> None:
        self._start_s = value

    def generate(
        self, requests: Iterable[EngineRequest], sampling: SamplingSpec, output: OutputSpec
    ) -> Iterator[EngineResult]:
        source = iter(requests)
        first = next(source, None)
        if first is None:
            return
        if self.started is None:
            self._start_meanwhile(getattr(requests, "meanwhile", None))
        assert self.started is not None
        check_identity(self.model_id, self.started.model_id)
        yield from self.started.generate(itertools.chain([first], source), sampling, output)

    def _start_meanwhile(self, meanwhile: Callable[[], bool] | None) -> None:
        """Start the engine in a thread, calling ``meanwhile`` on this one until it is ready."""
        before = memory.host()  # what was free, so the log shows what the start took
        if self._log:
            with self.spans.span("events"):
                self._log(f"engine loading: {self.model_id} {self._settings} ({memory.free_line(before)})")
        got: dict[str, Any] = {}
        ready = threading.Event()
        spans = self.spans

        def start() -> None:
            try:
                got["engine"] = self._start()
            except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
                got["error"] = exc
            finally:
                got["ended"] = time.perf_counter()
                spans.cover_until(got["ended"])
                ready.set()

        began = time.perf_counter()
        cold_before = self._cold_starts() if self._cold_starts is not None else None
        spans.push("engine_start", cover=True)
        try:
            threading.Thread(target=start, name="sparkbatch-engine-start", daemon=True).start()
            while meanwhile is not None and not ready.is_set() and meanwhile():
                pass
            ready.wait()
        finally:
            spans.pop()
        if "error" in got:
            raise got["error"]
        self.started = got["engine"]
        # What this run paid to get an engine: a cold start in full, a warm one (keep_warm) nothing,
        # and not the wait for another run's engine to free the GPUs.
        warm = cold_before is not None and self._cold_starts is not None and self._cold_starts() == cold_before
        self.start_seconds = 0.0 if warm else max(got["ended"] - began - self.started.gpu_wait_s, 0.0)
        spans.move("engine_start", "gpu_wait", self.started.gpu_wait_s)
        self.started.spans = spans  # the backend's own parts (tokenizing) in the step's
        if self._log:
            with spans.span("events"):
                self._log(self._ready_line(before))

    def _ready_line(self, before: memory.Host) -> str:
        after = memory.host()
        note = f"; {self.started.memory_note}" if self.started is not None and self.started.memory_note else ""
        waited = f" (after {self.started.gpu_wait_s:.1f} s waiting for the GPU)" \
            if self.started is not None and self.started.gpu_wait_s >= 0.05 else ""
        return (f"engine ready in {self.start_seconds:.1f} s{waited}; MemAvailable {memory.gib(before.available)} GiB "
                f"before the start, {memory.gib(after.available)} GiB after "
                f"({memory.gib(before.available - after.available)} GiB taken){note}")


def check_identity(expected: str, started: str) -> None:
    """Stop when the engine that started is not the model the run labels as: its answers would be
    stored under the wrong identity (and reused as that model's by later runs)."""
    if started == expected:
        return
    name, _, _ = expected.partition("@")
    what = (f"the files of {name} (weights, tokenizer, chat template) or its answer-changing settings changed "
            "after this run computed its identity" if started.partition("@")[0] == name else "another model")
    raise EngineError(
        f"the engine answers as {started}, but this run labels as {expected}: {what}. Nothing was generated "
        "or stored. Run again: the next run computes the identity afresh and labels under it (a keep_warm "
        "engine of the old files is replaced by then; resource.shutdown() stops it now)"
    )
