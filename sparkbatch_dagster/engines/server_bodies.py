"""The bodies server mode sends, and what an HTTP failure means for the row it was sent for."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

from ..errors import ConfigError
from ..spec import OutputSpec, SamplingSpec
from .base import structured_outputs
from .endpoints import key_error

_RETRY_STATUS = {408, 429, 500, 502, 503, 504}


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
