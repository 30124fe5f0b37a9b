"""The bodies server mode sends, the results its answers give, and what a failure means for the
row it was sent for."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

from ..errors import ConfigError
from ..spec import OutputSpec, SamplingSpec
from . import confidence, reasoning
from .base import EngineResult, structured_outputs
from .endpoints import key_error
from .reasoning_server import reasoned_result

_RETRY_STATUS = {408, 429, 500, 502, 503, 504}
#: 400s held back while nothing has succeeded; this many (and none of those in flight succeeding)
#: mean the request itself is wrong, not the rows.
HOLD = 8


def request_body(model: str, messages: list[dict[str, str]], sampling: SamplingSpec, output: OutputSpec,
                 defaults: Mapping[str, Any] | None = None, first: Collection[int] | None = None) -> dict:
    """The chat-completions payload, structured outputs included; ``defaults``: the sampling
    defaults offline mode applies too, sent so that the server applies exactly those; ``first``:
    the labels' first tokens, one step instead of the grammar (as offline: ``label_tokens``)."""
    body: dict[str, Any] = {
        "model": model, "messages": messages, "max_tokens": 1 if first else sampling.max_tokens,
        "temperature": sampling.temperature, "top_p": sampling.top_p, "seed": sampling.seed,
        "ignore_eos": sampling.ignore_eos, **(defaults or {}),
    }
    fields = None if first else structured_outputs(output)
    if fields:
        body["structured_outputs"] = fields
    if first:
        body["allowed_token_ids"] = sorted(first)
    return body


def grammar_body(body: dict[str, Any], sampling: SamplingSpec, output: OutputSpec) -> dict[str, Any]:
    """A one-step body (:func:`request_body` with ``first``) asked again with the grammar."""
    out = {k: v for k, v in body.items() if k != "allowed_token_ids"}
    out["max_tokens"] = sampling.max_tokens
    out["structured_outputs"] = structured_outputs(output)
    return out


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
                  thinking: reasoning.Plan | None, tokenizer: Any) -> EngineResult:
    """The row's result from a 200 answer: a chat answer's message, or a completion's text
    (``server_token_ids``), with its token counts, and its confidence when ``sure`` scores it."""
    usage = data.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    choice = data["choices"][0]
    text = (choice["text"] if "text" in choice else choice["message"].get("content")) or ""
    if thinking is not None:
        return reasoned_result(row_id, text, choice, usage, thinking, tokenizer)
    return EngineResult(
        row_id, text,
        prompt_tokens=int(usage.get("prompt_tokens", 0)), output_tokens=int(usage.get("completion_tokens", 0)),
        cached_tokens=int(details.get("cached_tokens") or 0), finish_reason=choice.get("finish_reason"),
        confidence=sure.of_openai(text, choice.get("logprobs")) if sure is not None else None,
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
