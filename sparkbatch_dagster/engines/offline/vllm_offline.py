"""Offline vLLM (``vllm.LLM`` in this process, its engine core in a child process).

Requests stream through ``llm_engine.add_request`` / ``step``: a bounded window of queued
requests is topped up as results finish, so the running batch never drains at a chunk
boundary, and the caller writes finished rows while the engine core keeps generating.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

from ...errors import EngineError
from ...spec import OutputSpec, SamplingSpec
from ...spec.prompts import chat_text
from .. import settings
from ..answers.encode_ahead import EncodeAhead
from ..answers.extras import of_vllm as extras_of
from ..answers.plan import AnswerPlan, plan
from ..answers.tools import with_calls
from ..base import Engine, EngineRequest, EngineResult
from ..config import EngineSettings
from .llm_start import engine_failure, start_llm


class VLLMOfflineEngine(Engine):
    """In-process ``vllm.LLM`` of ``cfg`` (as the start hands it on: its model resolved, its
    ``llm_kwargs``, which go to ``vllm.LLM`` unchanged, sized for this machine)."""

    def __init__(self, cfg: EngineSettings) -> None:
        started = time.perf_counter()
        self._llm = start_llm(cfg.model_name(), dict(cfg.llm_kwargs), cfg.engine_start_timeout_s)
        self.start_seconds = time.perf_counter() - started
        self.settings = cfg
        self.model_id = self.model_path = cfg.model_name()  # model_id may be renamed to a portable identity
        self.sampling_defaults = cfg.sampling_defaults()
        self.window, self.chunk = cfg.queue()
        self.chunk = min(self.chunk, self.window)
        self._tokenizer = self._llm.get_tokenizer()
        self._max_len = int(self._llm.llm_engine.model_config.max_model_len)
        config = getattr(self._llm.llm_engine, "vllm_config", None)
        #: Sequences the engine runs at once: while a label probe is out, the grammar's rows fill the rest.
        self.max_num_seqs = int(getattr(getattr(config, "scheduler_config", None), "max_num_seqs", 0) or 256)
        self._ids = itertools.count()
        from .reasoning_offline import native_budget

        #: Whether a reasoning job's thinking budget is vLLM's own (:mod:`.reasoning_offline`);
        #: else two requests a row. Settable to measure or test the other way.
        self.native_budget = native_budget(self._llm)
        self._closed = False
        threading.Thread(target=self._watch_engine_core, name="sparkbatch-watchdog", daemon=True).start()

    def _watch_engine_core(self) -> None:
        """Unblock ``step()`` if the engine core process dies.

        vLLM's own monitor marks the engine dead, but the synchronous client keeps waiting on
        its output queue; a run would hang forever. Putting an error into that queue makes
        the waiting ``step()`` raise, so the run fails in about a second instead.
        """
        core = self._llm.llm_engine.engine_core
        resources = getattr(core, "resources", None)
        procs = list(getattr(getattr(resources, "engine_manager", None), "processes", []) or [])
        outputs = getattr(core, "outputs_queue", None)
        if outputs is None or not procs:
            return  # an in-process engine core, or internals this version does not have
        while not self._closed:
            time.sleep(1.0)
            if not self._closed and any(not p.is_alive() for p in procs):
                outputs.put_nowait(EngineError("the vLLM engine core process died"))
                return

    def encode(self, batch: list[EngineRequest], template_kwargs: dict[str, Any] | None = None) -> list[list[int]]:
        """Token ids of each request's prompt (chat template applied when the model has one, with
        ``template_kwargs``: a reasoning job's ``enable_thinking``)."""
        if not batch:
            return []
        rendered = [chat_text(self._tokenizer, r.messages, template_kwargs,  # as preview shows
                              r.tools.template_tools() if r.tools else None) for r in batch]
        special = rendered[0][1]  # one tokenizer: the same answer for every request
        return list(self._tokenizer([text for text, _ in rendered], add_special_tokens=special)["input_ids"])

    def generate(
        self, requests: Iterable[EngineRequest], sampling: SamplingSpec, output: OutputSpec
    ) -> Iterator[EngineResult]:
        answers = plan(self._tokenizer, sampling, output, self.settings, defaults=self.sampling_defaults,
                       cpu=settings.on_cpu())
        if answers.thinking is not None:  # a reasoning model that thinks first: its own loop
            from .reasoning_offline import generate_reasoned

            yield from generate_reasoned(self, requests, answers)
            return
        if self.native_budget:
            from .reasoning_offline import check_unbounded

            check_unbounded(self._tokenizer, sampling, output)
        held: list[tuple[EngineRequest, list[int]]] = []  # encoded, waiting for the probe's answers (tally)
        engine, source = self._llm.llm_engine, iter(requests)
        in_flight: dict[str, tuple[str, int]] = {}  # request id: (row id, prompt tokens)
        asked: dict[str, EngineRequest] = {}  # in flight as one step: asked again if it settles nothing
        again: set[str] = set()  # asked again with the grammar
        extras: dict[str, SamplingSpec] = {}  # in flight with a line's own settings that ask for more than text
        tooled: dict[str, EngineRequest] = {}  # in flight with a forced tool call: its answer becomes the calls
        exhausted = False
        ahead = EncodeAhead(self.encode)
        try:
            while True:
                # Top up a chunk at a time (one tokenizer call each), also at the start: the engine
                # begins on the first chunk while the next are still being rendered and encoded
                # (on their own thread: encode_ahead.py), instead of idling until the window is full.
                while (not exhausted and ahead.room()
                       and len(in_flight) + len(held) + ahead.rows <= self.window - self.chunk):
                    batch = list(itertools.islice(source, self.chunk))
                    exhausted = not batch
                    if batch:
                        with self.part("tokenize"):  # the step's own work on its thread, named in its timings
                            ahead.submit(batch)
                # What is encoded goes in; with nothing in flight the engine waits for the next chunk.
                with self.part("tokenize"):
                    encoded = held + list(ahead.take(wait=not in_flight and not held))
                held = []
                for req, ids in encoded:
                    if len(ids) >= self._max_len:
                        why = f"prompt_too_long: {len(ids)} tokens, model context is {self._max_len}"
                        yield EngineResult(req.id, None, len(ids), error=why)
                        continue
                    route = answers.route(req, len(asked))
                    if route is None:  # the probe is out: the grammar's rows keep the batch full, the others wait
                        route = "grammar" if not held and len(in_flight) < self.max_num_seqs else None
                    if answers.tallied(req) and (held or route is None):
                        held.append((req, ids))  # after the probe's answers, in order
                        continue
                    rid = self._add(ids, answers.vllm_params(req, route))
                    in_flight[rid] = (req.id, len(ids))
                    if route == "own" and req.sampling is not None and req.sampling.extras_asked():
                        extras[rid] = req.sampling
                    if route == "step":
                        asked[rid] = req
                    if req.tools is not None and req.tools.forced():
                        tooled[rid] = req
                if not in_flight:
                    if exhausted and not ahead.rows and not held:
                        answers.report()
                        return
                    continue
                with engine_failure():
                    outputs = engine.step()
                done = [out for out in outputs if out.finished]
                if asked:
                    done, settled = self._settle(done, answers, asked, in_flight, again)
                    yield from settled
                texts = self._tokenizer.batch_decode(
                    [list(out.outputs[0].token_ids) for out in done], skip_special_tokens=True
                ) if done else []
                for out, text in zip(done, texts, strict=True):
                    row_id, n_prompt = in_flight.pop(out.request_id)
                    asked_more = extras.pop(out.request_id, None)
                    if asked_more is not None and asked_more.stop:  # detokenized, and cut before its stop string
                        text = out.outputs[0].text
                    extra = extras_of(out, self._tokenizer, asked_more) if asked_more else None
                    forced = tooled.pop(out.request_id, None)
                    yield self._result(row_id, text, n_prompt, out, answers,
                                       spent=sum(len(c.token_ids) for c in out.outputs) + (out.request_id in again),
                                       extra=with_calls(extra, text, forced.tools) if forced else extra)
                    again.discard(out.request_id)
        finally:
            ahead.close()
            if in_flight:  # the caller stopped early: leave the engine clean for the next shard
                with contextlib.suppress(Exception):  # a dead engine has nothing to abort
                    engine.abort_request(list(in_flight))

    def _add(self, ids: list[int], params: Any) -> str:
        """One request into the engine; its request id."""
        from vllm.inputs import TokensPrompt

        rid = f"sb-{next(self._ids)}"
        with engine_failure():  # the engine core may die between two steps
            self._llm.llm_engine.add_request(rid, TokensPrompt(prompt_token_ids=ids), params)
        return rid

    @staticmethod
    def _result(row_id: str, text: str, n_prompt: int, out: Any, answers: AnswerPlan, spent: int,
                extra: str | None = None) -> EngineResult:
        """A finished request's result; ``spent``: its output tokens, every choice's (a row asked
        again with the grammar spent the one step too); ``extra``: what its request asked beyond the text."""
        return EngineResult(row_id, text, prompt_tokens=n_prompt, output_tokens=spent,
                            cached_tokens=int(out.num_cached_tokens or 0), finish_reason=out.outputs[0].finish_reason,
                            confidence=answers.scorer.of_vllm(text, out.outputs[0]) if answers.scorer else None,
                            extra=extra)

    def _settle(self, done: list[Any], answers: AnswerPlan, asked: dict[str, EngineRequest],
                in_flight: dict[str, tuple[str, int]], again: set[str]) -> tuple[list[Any], list[EngineResult]]:
        """Of ``done``, the one-step answers settled: a token that begins one label is that label;
        one that begins several is asked again with the grammar, under a new request id of the
        same row (``again``). Returns the grammar's outputs (to decode) and the settled results."""
        rest, settled = [], []
        for out in done:
            req = asked.pop(out.request_id, None)
            if req is None:
                rest.append(out)
                continue
            tokens = out.outputs[0].token_ids
            label = answers.settle(tokens[0]) if tokens else None
            row_id, n_prompt = in_flight.pop(out.request_id)
            if label is not None:
                settled.append(EngineResult(row_id, label, prompt_tokens=n_prompt, output_tokens=1,
                                            cached_tokens=int(out.num_cached_tokens or 0), finish_reason="stop",
                                            confidence=answers.scorer.of_vllm(label, out.outputs[0])
                                            if answers.scorer else None))
                continue
            rid = self._add(self.encode([req])[0], answers.vllm_params(req, "grammar"))
            in_flight[rid] = (row_id, n_prompt)
            again.add(rid)
        return rest, settled

    def close(self) -> None:
        self._closed = True
        llm = getattr(self, "_llm", None)
        if llm is None:
            return
        with contextlib.suppress(Exception):  # already gone
            llm.llm_engine.engine_core.shutdown()
        self._llm = None
        import gc
        import multiprocessing

        gc.collect()
        # Reap the exited engine-core process: a long-lived Dagster process that starts several
        # engines (an estimate comparing models) would otherwise keep one zombie per engine.
        multiprocessing.active_children()
