"""A reasoning job on the offline engine: the thinking bounded, the grammar on the answer only.

Two ways, chosen per engine (:func:`native_budget`):

- **vLLM's own budget.** An engine started with a reasoning parser
  (``engine_kwargs={"reasoning_parser": "qwen3"}``) on a vLLM whose ``SamplingParams`` has
  ``thinking_token_budget``: one request per row. vLLM forces the end marker when the budget is
  spent, and its structured outputs apply the grammar from the end of the thinking on.
- **Two requests** (any other vLLM or engine): the first lets the model think, without a
  grammar, up to the budget or its own end marker; the second continues the prompt, the
  thinking and the end marker, and asks for the answer under the grammar. Its answer may take
  ``max_tokens - budget - 1`` tokens, so thinking and answer together stay within ``max_tokens``.

Either way a row's ``output_tokens`` count the thinking (``reasoning_tokens``: its tokens and the
end marker) and the answer, its ``confidence`` is the answer's tokens' alone, and its text is
the answer after the end marker (:mod:`.reasoning`). Example::

    engine = start(VLLMResource(model=..., engine_kwargs={"reasoning_parser": "qwen3"}).engine_settings())
    for res in engine.generate(requests, SamplingSpec(reasoning=256, max_tokens=300), output): ...
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Protocol

from ...errors import ConfigError
from ...spec import OutputSpec, SamplingSpec
from ..answers import confidence, reasoning
from ..answers.plan import AnswerPlan, sampling_params
from ..base import EngineRequest, EngineResult, structured_outputs
from .llm_start import engine_failure

if TYPE_CHECKING:
    from contextlib import AbstractContextManager


class OfflineEngine(Protocol):
    """What this module uses of :class:`.vllm_offline.VLLMOfflineEngine`, whose helper it is
    (typed here so that the helper never imports the engine that imports it)."""

    window: int
    chunk: int
    native_budget: bool
    _llm: Any
    _tokenizer: Any
    _max_len: int
    _ids: itertools.count[int]

    def encode(self, batch: list[EngineRequest],
               template_kwargs: dict[str, Any] | None = None) -> list[list[int]]: ...

    def part(self, name: str) -> AbstractContextManager[None]: ...


def native_budget(llm: Any) -> bool:
    """Whether this engine bounds the thinking itself: its vLLM has ``thinking_token_budget`` and it
    was started with a reasoning parser (its reasoning config is on), which also makes its
    structured outputs start after the thinking."""
    from vllm import SamplingParams

    if "thinking_token_budget" not in getattr(SamplingParams, "__struct_fields__", ()):
        return False
    config = getattr(getattr(llm.llm_engine, "vllm_config", None), "reasoning_config", None)
    return bool(config is not None and getattr(config, "enabled", False))


def check_unbounded(tokenizer: Any, sampling: SamplingSpec, output: OutputSpec) -> None:
    """On an engine started with a reasoning parser, a job without a thinking budget: its grammar
    would wait for a ``</think>`` that the model of a template thinking by default may never
    write, leaving its answers unchecked. Refused (ConfigError), naming both ways out."""
    if structured_outputs(output) and reasoning.thinks_by_default(tokenizer):
        raise ConfigError(
            f"sampling.reasoning={sampling.reasoning!r} on an engine started with a reasoning parser, whose grammar "
            "starts only after a </think>: this model's template thinks by default, so its answers would go "
            "unchecked; set sampling.reasoning to a budget (or 'auto'), or start the engine without "
            "engine_kwargs.reasoning_parser")


@dataclass
class _Row:
    """A row in flight: its id, prompt ids, and (second request) the thinking it is answering after."""

    row_id: str
    prompt: list[int]
    cached: int = 0
    thought: list[int] | None = None


def generate_reasoned(engine: OfflineEngine, requests: Iterable[EngineRequest],
                      answers: AnswerPlan) -> Iterator[EngineResult]:
    """Yield one result per request, in completion order (the engine's window and chunks as
    :meth:`VLLMOfflineEngine.generate`, with the plan's thinking before each answer)."""
    from vllm.inputs import TokensPrompt

    assert answers.thinking is not None  # a reasoning job's plan
    plan, sampling, output, sure = answers.thinking, answers.sampling, answers.output, answers.scorer
    native, top, defaults = engine.native_budget, answers.logprobs, answers.defaults
    if native:
        answer = sampling_params(sampling, output, defaults, logprobs=top, cpu=answers.cpu,
                                 thinking_token_budget=plan.budget)
        think = answer
    else:
        stop = [plan.markers.end_id] if plan.markers.end_id is not None else None
        think = sampling_params(sampling, None, defaults, max_tokens=plan.budget, cpu=answers.cpu,
                                stop_token_ids=stop)
        answer = sampling_params(sampling, output, defaults, logprobs=top, cpu=answers.cpu,
                                 max_tokens=sampling.max_tokens - plan.budget - 1)
    closing = _closing(engine._tokenizer, plan.markers)
    llm = engine._llm.llm_engine
    source = iter(requests)
    rows: dict[str, _Row] = {}
    exhausted = False
    try:
        while True:
            if not exhausted and len(rows) <= engine.window - engine.chunk:
                batch = list(itertools.islice(source, engine.chunk))
                exhausted = not batch
                with engine.part("tokenize"):
                    encoded = engine.encode(batch, plan.template_kwargs)
                for req, ids in zip(batch, encoded, strict=True):
                    if len(ids) >= engine._max_len:
                        yield EngineResult(req.id, None, len(ids), error=f"prompt_too_long: {len(ids)} tokens, "
                                           f"model context is {engine._max_len}")
                        continue
                    rid = f"sb-{next(engine._ids)}"
                    with engine_failure():
                        llm.add_request(rid, TokensPrompt(prompt_token_ids=ids), think)
                    rows[rid] = _Row(req.id, ids)
            if not rows:
                if exhausted:
                    return
                continue
            with engine_failure():
                outputs = llm.step()
            for out in (o for o in outputs if o.finished):
                row = rows.pop(out.request_id)
                done = out.outputs[0]
                if native or row.thought is not None:
                    yield _result(engine, row, done, plan, sampling, sure, int(out.num_cached_tokens or 0))
                    continue
                # The thinking ended (its marker, the budget, or the model's own end): ask for the answer.
                ids = list(done.token_ids)
                if ids and ids[-1] == engine._tokenizer.eos_token_id:  # the model's own end, not the prompt's
                    ids = ids[:-1]
                cut = reasoning.split_ids(ids, plan.markers)
                row.thought, row.cached = ids[: cut - 1] if cut else ids, int(out.num_cached_tokens or 0)
                follow = row.prompt + row.thought + closing
                if len(follow) >= engine._max_len:
                    yield EngineResult(row.row_id, None, len(row.prompt), output_tokens=len(ids),
                                       error=f"prompt_too_long: prompt and thinking are {len(follow)} tokens, model "
                                       f"context is {engine._max_len}")
                    continue
                rid = f"sb-{next(engine._ids)}"
                with engine_failure():
                    llm.add_request(rid, TokensPrompt(prompt_token_ids=follow), answer)
                rows[rid] = row
    finally:
        if rows:  # the caller stopped early: leave the engine clean for the next shard
            with contextlib.suppress(Exception):
                llm.abort_request(list(rows))


def _closing(tokenizer: Any, markers: reasoning.Markers) -> list[int]:
    """What the second request puts after the thinking: the end marker and the blank line a
    reasoning template writes before the answer."""
    return list(tokenizer(markers.end + "\n\n", add_special_tokens=False)["input_ids"])


def _result(engine: OfflineEngine, row: _Row, done: Any, plan: reasoning.Plan, sampling: SamplingSpec,
            sure: confidence.Scorer | None, cached: int) -> EngineResult:
    """One row's result from its last completion: the thinking, then the answer after its end marker."""
    ids, logprobs = list(done.token_ids), list(done.logprobs or [])
    if row.thought is not None:  # two requests: the completion is the answer alone
        thought, answer_ids, cached = row.thought, ids, row.cached
        spent = len(thought) + 1  # and the end marker
    else:
        cut = reasoning.split_ids(ids, plan.markers)
        if cut is None:  # the model stopped inside its thinking: no answer
            text = engine._tokenizer.decode(ids, skip_special_tokens=True)
            return EngineResult(row.row_id, None, len(row.prompt), output_tokens=len(ids), cached_tokens=cached,
                                finish_reason=done.finish_reason, error=reasoning.unfinished(sampling),
                                reasoning=reasoning.split_text(text, plan.markers)[0], reasoning_tokens=len(ids))
        thought, answer_ids, logprobs, spent = ids[: cut - 1], ids[cut:], logprobs[cut:], cut
    thinking = reasoning.split_text(engine._tokenizer.decode(thought, skip_special_tokens=True), plan.markers)[0]
    text = engine._tokenizer.decode(answer_ids, skip_special_tokens=True).lstrip()
    completion = SimpleNamespace(token_ids=answer_ids, logprobs=logprobs or None)
    return EngineResult(
        row.row_id, text, prompt_tokens=len(row.prompt), output_tokens=spent + len(answer_ids), cached_tokens=cached,
        finish_reason=done.finish_reason, confidence=sure.of_vllm(text, completion) if sure is not None else None,
        reasoning=thinking, reasoning_tokens=spent,
    )
