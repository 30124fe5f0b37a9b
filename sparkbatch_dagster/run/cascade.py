"""A cascade of models as one engine (``JobSpec.cascade``, ``spec/cascade.py``).

Every request goes to stage 1. An answer it is at least ``below`` sure of stands; the others (and
the rows it could not answer) go to stage 2, and so on; the last stage's answer stands whatever
its confidence. Each answer names the stage that gave it (``EngineResult.model``), and its tokens
are those of every stage that worked on the row (what the row cost).

Each stage keeps its answers in the result store under its own model identity, as it gives them:
a rerun of the same cascade reuses the job's own answers, and a cascade whose later stage changed
asks stage 1 nothing again (its answers are stored) and the new stage only the rows escalated to
it. A stage's engine starts when its first request is not in its store, once per run, and stays
up until :meth:`CascadeEngine.close` (on a GPU the stages share its memory: ``definitions/cascade.py``
splits it). Requests go through the stages in rounds of ``ROUND``: stage 1 answers a round,
stage 2 the round's escalated rows, and so on, then the next round; so shards commit as the run
goes, and each is billed for the time of the rounds that finished it.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ..engines.base import Engine, EngineRequest, EngineResult
from ..spec import JobSpec, OutputSpec, SamplingSpec
from .result_store import ResultStore
from .rows import STORED_ERRORS, outcome

#: Requests looked up in a stage's store at a time, and fresh answers stored at a time.
CHUNK = 256
#: Requests taken through every stage before the next ones: shards commit as the run goes (not
#: all at its end), and each stage's engine still sees batches far larger than it runs at once.
ROUND = 4096


@dataclass
class Stage:
    """One stage: its model identity (``name``), how its engine starts and stops, the confidence
    under which its answers go on (None: the last stage), and its answers' store."""

    name: str
    start: Callable[[], Engine]
    stop: Callable[[], None]
    below: float | None
    store: ResultStore | None = None
    engine: Engine | None = None
    start_s: float = 0.0


class CascadeEngine(Engine):
    """The stages as one :class:`Engine` named ``model_id`` (the cascade's identity). Example::

        engine = CascadeEngine("cascade(a<0.8, b)", [Stage("a", start_a, stop_a, 0.8, store_a),
                                                      Stage("b", start_b, stop_b, None, store_b)], spec)
    """

    def __init__(self, model_id: str, stages: list[Stage], spec: JobSpec) -> None:
        self.model_id, self.stages, self.spec = model_id, stages, spec
        #: Seconds spent starting stage engines during ``generate`` (a LazyEngine adds them to its start).
        self.later_start_s = 0.0
        #: Rows each stage answered for good, by stage name: what the run reports.
        self.answered: dict[str, int] = {s.name: 0 for s in stages}
        self.round = ROUND

    def generate(self, requests: Iterable[EngineRequest], sampling: SamplingSpec,
                 output: OutputSpec) -> Iterator[EngineResult]:
        source = iter(requests)
        while batch := list(itertools.islice(source, self.round)):
            yield from self._through_stages(batch, sampling, output)

    def _through_stages(self, requests: list[EngineRequest], sampling: SamplingSpec,
                        output: OutputSpec) -> Iterator[EngineResult]:
        """One round of requests through the stages, each stage's escalations to the next."""
        todo: Iterable[EngineRequest] = requests
        so_far: dict[str, EngineResult] = {}  # escalated rows: what the stages before cost them
        for stage in self.stages:
            on: list[EngineRequest] = []
            for req, res in self._answers(stage, todo, sampling, output):
                before = so_far.pop(res.id, None)
                res = _added(before, dataclasses.replace(res, model=stage.name))
                if res.retryable or stage.below is None or self._sure(res, stage.below):
                    self.answered[stage.name] += not res.retryable
                    yield res
                else:
                    so_far[res.id] = res
                    on.append(req)
            if not on:
                return
            todo = on

    def _sure(self, res: EngineResult, below: float) -> bool:
        """Whether a stage's answer stands: it parses (``rows.outcome``) and its confidence is at
        least ``below``. An error row, an answer without a confidence, one cut at max_tokens goes on."""
        output, error, cut = outcome(res, self.spec)
        return error is None and not cut and output is not None and res.confidence is not None \
            and res.confidence >= below

    def _answers(self, stage: Stage, requests: Iterable[EngineRequest], sampling: SamplingSpec,
                 output: OutputSpec) -> Iterator[tuple[EngineRequest, EngineResult]]:
        """Each request's answer from ``stage``: its store's where it has one, its engine's (started
        on the first request the store lacks) for the rest; fresh answers go to its store."""
        sent: dict[str, EngineRequest] = {}
        stored: deque[tuple[EngineRequest, EngineResult]] = deque()
        keys: dict[str, str] = {}

        def fresh() -> Iterator[EngineRequest]:
            source = iter(requests)
            while chunk := list(itertools.islice(source, CHUNK)):
                found = self._lookup(stage, chunk, keys)
                for req in chunk:
                    if req.id in found:
                        stored.append((req, found[req.id]))
                    else:
                        sent[req.id] = req
                        yield req

        pending = fresh()
        first = next(pending, None)
        yield from _drain(stored)
        if first is None:
            return
        results = self._engine(stage).generate(itertools.chain([first], pending), sampling, output)
        adding: list[dict[str, Any]] = []
        try:
            for res in results:
                yield from _drain(stored)
                self._keep(stage, res, keys, adding)
                yield sent.pop(res.id), res
            yield from _drain(stored)
        finally:
            close = getattr(results, "close", None)
            if close is not None:  # a caller that stops early (the brake) aborts what is in flight now
                close()
            self._store(stage, adding)

    def _lookup(self, stage: Stage, chunk: list[EngineRequest], keys: dict[str, str]) -> dict[str, EngineResult]:
        if stage.store is None:
            return {}
        # A request without its prompt's key (a caller that has none) is neither looked up nor stored.
        keys.update({req.id: req.key for req in chunk if req.key is not None})
        found = stage.store.lookup([keys[r.id] for r in chunk if r.id in keys])
        out = {}
        for req in chunk:
            if req.id in keys and keys[req.id] in found:
                text, error, confidence, _, reasoning, extra, cut, _ = found[keys[req.id]]
                out[req.id] = EngineResult(req.id, text, error=error,
                                           finish_reason=("length" if cut else "stop") if error is None else None,
                                           confidence=confidence, reasoning=reasoning, extra=extra)
        return out

    def _keep(self, stage: Stage, res: EngineResult, keys: dict[str, str], adding: list[dict[str, Any]]) -> None:
        """Queue a fresh answer for the stage's store (what the same prompt would get again), and
        store the queue every ``CHUNK`` answers: a crash loses at most that many."""
        if stage.store is None or res.retryable or res.id not in keys:
            return
        text, error, cut = outcome(res, self.spec)
        if cut or (error is not None and not error.startswith(STORED_ERRORS)):
            return
        adding.append({"prompt_key": keys[res.id], "output": text, "error": error, "prompt_tokens": res.prompt_tokens,
                       "output_tokens": res.output_tokens, "model": stage.name,
                       "confidence": res.confidence if text is not None else None,
                       "reasoning": res.reasoning if self.spec.output.keep_reasoning else None,
                       "extra": res.extra})
        if len(adding) >= CHUNK:
            self._store(stage, adding)

    def _store(self, stage: Stage, adding: list[dict[str, Any]]) -> None:
        if stage.store is not None and adding:
            stage.store.add(list(adding))
        adding.clear()

    def _engine(self, stage: Stage) -> Engine:
        if stage.engine is None:
            began = time.perf_counter()
            stage.engine = stage.start()
            stage.start_s = time.perf_counter() - began
            self.later_start_s += stage.start_s
            if stage.engine.model_id != stage.name:  # new weights since the identity was taken
                from ..engines.base import check_identity

                check_identity(stage.name, stage.engine.model_id)
        return stage.engine

    def close(self) -> None:
        for stage in self.stages:
            if stage.engine is not None:
                stage.stop()
                stage.engine = None


def _drain(stored: deque[tuple[EngineRequest, EngineResult]]) -> Iterator[tuple[EngineRequest, EngineResult]]:
    while stored:
        yield stored.popleft()


def _added(before: EngineResult | None, res: EngineResult) -> EngineResult:
    """``res`` with the tokens the stages before spent on the same row."""
    if before is None:
        return res
    return dataclasses.replace(res, prompt_tokens=res.prompt_tokens + before.prompt_tokens,
                               output_tokens=res.output_tokens + before.output_tokens,
                               cached_tokens=res.cached_tokens + before.cached_tokens,
                               reasoning_tokens=res.reasoning_tokens + before.reasoning_tokens)
