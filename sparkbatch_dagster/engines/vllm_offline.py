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
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ..errors import EngineError
from ..spec import OutputSpec, SamplingSpec
from ..spec.prompts import chat_text
from . import confidence, label_tokens, reasoning, settings
from .base import Engine, EngineRequest, EngineResult, settings_key
from .encode_ahead import EncodeAhead
from .llm_start import start_llm
from .vllm_params import engine_failure, sampling_params


class VLLMOfflineEngine(Engine):
    """In-process ``vllm.LLM``. ``llm_kwargs`` go to ``vllm.LLM`` unchanged."""

    def __init__(self, model: str, llm_kwargs: dict[str, Any], window: int = 8192, chunk: int = 512,
                 start_timeout_s: float | None = None, sampling_defaults: Mapping[str, Any] | None = None,
                 label_decoding: str = "auto") -> None:
        started = time.perf_counter()
        self._llm = start_llm(model, llm_kwargs, start_timeout_s)
        self.start_seconds = time.perf_counter() - started
        self.model_id = model
        self.model_path = model  # what was loaded; model_id may be renamed to a portable identity
        self.sampling_defaults = dict(sampling_defaults or {})
        self.label_decoding = label_decoding
        #: Label rows sent in one step before their answers decide how the rest go (:class:`label_tokens.Tally`).
        self.label_probe = label_tokens.PROBE
        #: The share of those asked again up to which the rest go in one step too (the platform's).
        self.label_bar = label_tokens.max_asked_again(settings.on_cpu())
        #: Whether answers carry a confidence (:mod:`.confidence`); off only to measure what it costs.
        self.confidence = True
        #: Whether prompts are encoded on a thread of their own (:mod:`.encode_ahead`); off only to measure it.
        self.encode_ahead = True
        self.window = window
        self.chunk = min(chunk, window)
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
        rendered = [chat_text(self._tokenizer, r.messages, template_kwargs) for r in batch]  # as preview shows
        special = rendered[0][1]  # one tokenizer: the same answer for every request
        return list(self._tokenizer([text for text, _ in rendered], add_special_tokens=special)["input_ids"])

    def generate(
        self, requests: Iterable[EngineRequest], sampling: SamplingSpec, output: OutputSpec
    ) -> Iterator[EngineResult]:
        from vllm.inputs import TokensPrompt

        thinking = reasoning.plan(self._tokenizer, sampling)
        if thinking is not None:  # a reasoning model that thinks first: its own loop
            from .reasoning_offline import generate_reasoned

            yield from generate_reasoned(self, requests, sampling, output, thinking)
            return
        if self.native_budget:
            from .reasoning_offline import check_unbounded

            check_unbounded(self._tokenizer, sampling, output)
        step = label_tokens.plan(self._tokenizer, sampling, output, self.label_decoding)
        top = confidence.logprobs_wanted(output.kind) if self.confidence and output.confidence else None
        params = sampling_params(sampling, output, self.sampling_defaults, logprobs=top)
        first = sampling_params(sampling, output, self.sampling_defaults, step.allowed, top) if step else params
        sure = confidence.Scorer(output, self._tokenizer, step) if top is not None else None
        tally = label_tokens.Tally(self.label_probe, self.label_bar) if step is not None else None
        held: list[tuple[EngineRequest, list[int]]] = []  # encoded, waiting for the probe's answers (tally)
        engine = self._llm.llm_engine
        source = iter(requests)
        in_flight: dict[str, str] = {}
        prompt_lens: dict[str, int] = {}
        asked: dict[str, EngineRequest] = {}  # in flight as one step (``step``): asked again if it settles nothing
        own_params: dict[str, Any] = {}  # requests' own settings (a batch file's lines), built once each
        again: set[str] = set()  # asked again with the grammar
        exhausted = False
        ahead = EncodeAhead(self.encode, threaded=self.encode_ahead)
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
                        yield EngineResult(
                            req.id, None, len(ids),
                            error=f"prompt_too_long: {len(ids)} tokens, model context is {self._max_len}",
                        )
                        continue
                    own = req.sampling is not None or req.output is not None  # a batch file line's own
                    router = None if own else tally  # a label row's route is this call's tally's
                    route = router.route(len(asked)) if router is not None else None
                    if router is not None and route is None:
                        # The probe is out: the grammar's rows keep the batch full, the others wait for it.
                        route = "grammar" if not held and len(in_flight) < self.max_num_seqs else None
                    if router is not None and (held or route is None):
                        held.append((req, ids))  # after the probe's answers, in order
                        continue
                    rid = f"sb-{next(self._ids)}"
                    with engine_failure():  # the engine core may die between two steps
                        engine.add_request(rid, TokensPrompt(prompt_token_ids=ids),
                                           self._own_params(req, sampling, output, top, own_params) if own
                                           else params if route == "grammar" else first)
                    in_flight[rid] = req.id
                    prompt_lens[rid] = len(ids)
                    if route == "step":
                        asked[rid] = req
                if not in_flight:
                    if exhausted and not ahead.rows and not held:
                        if tally is not None:
                            tally.report()
                        return
                    continue
                with engine_failure():
                    outputs = engine.step()
                done = [out for out in outputs if out.finished]
                if step is not None:
                    done, settled = self._settle(done, step, asked, in_flight, prompt_lens, again, params, sure,
                                                 tally)
                    yield from settled
                texts = self._tokenizer.batch_decode(
                    [list(out.outputs[0].token_ids) for out in done], skip_special_tokens=True
                ) if done else []
                for out, text in zip(done, texts, strict=True):
                    row_id = in_flight.pop(out.request_id)
                    n_prompt = prompt_lens.pop(out.request_id)
                    yield EngineResult(
                        row_id,
                        text,
                        prompt_tokens=n_prompt,
                        # A row asked again with the grammar spent the one step too.
                        output_tokens=len(out.outputs[0].token_ids) + (out.request_id in again),
                        cached_tokens=int(out.num_cached_tokens or 0),
                        finish_reason=out.outputs[0].finish_reason,
                        confidence=sure.of_vllm(text, out.outputs[0]) if sure is not None else None,
                    )
                    again.discard(out.request_id)
        finally:
            ahead.close()
            if in_flight:  # the caller stopped early: leave the engine clean for the next shard
                with contextlib.suppress(Exception):  # a dead engine has nothing to abort
                    engine.abort_request(list(in_flight))

    def _own_params(self, req: EngineRequest, sampling: SamplingSpec, output: OutputSpec, top: int | None,
                    built: dict[str, Any]) -> Any:
        """``SamplingParams`` of a request that sets its own sampling or output, built once per pair."""
        pair = (req.sampling or sampling, req.output or output)
        key = settings_key(*pair)
        if key not in built:
            built[key] = sampling_params(*pair, self.sampling_defaults, logprobs=top)
        return built[key]

    def _settle(self, done: list[Any], step: label_tokens.FirstStep, asked: dict[str, EngineRequest],
                in_flight: dict[str, str], prompt_lens: dict[str, int], again: set[str],
                params: Any, sure: confidence.Scorer | None, tally: label_tokens.Tally | None = None
                ) -> tuple[list[Any], list[EngineResult]]:
        """Of ``done``, the one-step answers settled: a token that begins one label is that label;
        one that begins several is asked again with the grammar, under a new request id of the
        same row (``again``). Returns the grammar's outputs (to decode) and the settled results."""
        from vllm.inputs import TokensPrompt

        rest, settled = [], []
        for out in done:
            req = asked.pop(out.request_id, None)
            if req is None:
                rest.append(out)
                continue
            tokens = out.outputs[0].token_ids
            label = step.label(tokens[0]) if tokens else None
            row_id, n_prompt = in_flight.pop(out.request_id), prompt_lens.pop(out.request_id)
            if tally is not None:
                tally.record(settled=label is not None)
            if label is not None:
                settled.append(EngineResult(row_id, label, prompt_tokens=n_prompt, output_tokens=1,
                                            cached_tokens=int(out.num_cached_tokens or 0), finish_reason="stop",
                                            confidence=sure.of_vllm(label, out.outputs[0]) if sure else None))
                continue
            rid = f"sb-{next(self._ids)}"
            with engine_failure():
                self._llm.llm_engine.add_request(rid, TokensPrompt(prompt_token_ids=self.encode([req])[0]), params)
            in_flight[rid], prompt_lens[rid] = row_id, n_prompt
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
