"""A one-step body turned back to the grammar, the results a server's answers give, and what a
failure means for the row it was sent for (what a body holds is the plan's: ``answers/plan.py``)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from ...errors import ConfigError
from ...spec import OutputSpec, SamplingSpec
from ...spec.batch_tools import Tools
from ..answers import confidence, extras, reasoning
from ..answers import tools as answer_tools
from ..answers.plan import AnswerPlan
from ..base import EngineResult, structured_outputs
from .endpoints import key_error
from .reasoning_server import reasoned_result
from .replicas import Replica

#: A request on its way: row id, body, the replicas it got only transient failures from, the last one.
Sent = tuple[str, dict[str, Any], frozenset[Replica], EngineResult | None]

_RETRY_STATUS = {408, 429, 500, 502, 503, 504}
#: 400s held back while nothing has succeeded; this many (and none of those in flight succeeding)
#: mean the request itself is wrong, not the rows.
HOLD = 8


def grammar_body(body: dict[str, Any], sampling: SamplingSpec, output: OutputSpec) -> dict[str, Any]:
    """A one-step body (``AnswerPlan.fields`` of a ``"step"`` route) asked again with the grammar."""
    out = {k: v for k, v in body.items() if k != "allowed_token_ids"}
    out["max_tokens"] = sampling.max_tokens
    out["structured_outputs"] = structured_outputs(output)
    return out


def labeled(answers: AnswerPlan, row_id: str, body: dict[str, Any], res: EngineResult | None,
            again: set[str]) -> tuple[EngineResult | None, Sent | None]:
    """A one-step answer settled as its label, or the row to send again with the grammar (it began
    several labels: then it is in ``again``); a row asked again counts the one step in its tokens."""
    if res is not None and res.text is not None and "allowed_token_ids" in body:
        label = answers.settle_text(res.text)
        if label is None:
            again.add(row_id)
            return None, (row_id, grammar_body(body, answers.sampling, answers.output), frozenset(), None)
        return dataclasses.replace(res, text=label, finish_reason="stop"), None
    if res is not None and row_id in again:
        return dataclasses.replace(res, output_tokens=res.output_tokens + 1), None
    return res, None


def classify(status: int, text: str, url: str) -> str:
    """``retry``, or the reason of a row's own failure; a ConfigError for a setting that fails every row."""
    if status in _RETRY_STATUS:
        return "retry"
    if status in (401, 403):
        raise key_error(url, status)
    low = text.lower()
    if "chat template" in low or "chat_template" in low:
        raise ConfigError(f"server at {url} cannot render chat messages (HTTP {status}: {text}): the model has no "
                          "chat template: use a chat (instruct) model, or start the server with --chat-template")
    if re.search(r"context length|maximum[^.]*tokens|reduce the length", low):
        return "prompt_too_long"
    return "bad_request"


def answer_result(row_id: str, data: dict[str, Any], sure: confidence.Scorer | None,
                  thinking: reasoning.Plan | None, tokenizer: Any, more: SamplingSpec | None = None,
                  tools: Tools | None = None) -> EngineResult:
    """The row's result from a 200 answer: a chat answer's message, or a completion's text
    (``server_token_ids``), with its token counts, and its confidence when ``sure`` scores it;
    ``more``: the settings of a request that asked for more than the text (:mod:`..answers.extras`);
    ``tools``: a batch line's, whose forced call (a chat answer's ``tool_calls``) becomes its calls."""
    usage = data.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    choice = data["choices"][0]
    text = (choice["text"] if "text" in choice else choice["message"].get("content")) or ""
    if tools is not None and tools.forced() and (choice.get("message") or {}).get("tool_calls"):
        text = answer_tools.forced_text(choice["message"]["tool_calls"], tools)
    if thinking is not None:
        return reasoned_result(row_id, text, choice, usage, thinking, tokenizer)
    return EngineResult(
        row_id, text,
        prompt_tokens=int(usage.get("prompt_tokens", 0)), output_tokens=int(usage.get("completion_tokens", 0)),
        cached_tokens=int(details.get("cached_tokens") or 0), finish_reason=choice.get("finish_reason"),
        confidence=sure.of_openai(text, choice.get("logprobs")) if sure is not None else None,
        extra=answer_tools.with_calls(extras.of_openai(data["choices"], more) if more is not None else None, text,
                                      tools),
    )


def undecided(held: list[EngineResult], transient: bool, exhausted: bool) -> list[EngineResult]:
    """Held 400s when nothing is left in flight and nothing has succeeded: decide what they are."""
    if not held:
        return []
    if transient:  # the server also failed transiently: no evidence either way, so retry them later
        return [EngineResult(r.id, None, error=r.error, retryable=True) for r in held]
    reasons = {(r.error or "").split(":", 1)[0] for r in held}
    if exhausted and len(held) < HOLD and reasons == {"prompt_too_long"}:
        return held  # the server said why, row by row: a few over-long prompts are those rows' own
    raise ConfigError(f"every request fails with {(held[0].error or '').partition(': ')[2]}: "
                      "check VLLMResource.model and the job's output/sampling settings")
