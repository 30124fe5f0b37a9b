"""A batch line's tool calls, read from its answer into :class:`.extras.Extras`' ``tool_calls``.

A forced call (``Tools.forced()``) is JSON under the tools' schema, as vLLM's server generates
it: :meth:`~sparkbatch_dagster.spec.batch_tools.Tools.calls` reads it, and each call gets an id
named by the answer (the same answer, the same ids: a reused answer keeps them). Example::

    extra = with_calls(extra, text, req.tools)   # the row's extra column, with the calls

A server's chat body carries the tools and the choice (:func:`body_fields`), and its answer's
``tool_calls`` are read back as that JSON (:func:`forced_text`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import msgspec

from ...spec.batch_tools import Tools
from .extras import Extras, ToolCall


def call_id(text: str, index: int) -> str:
    """A call's id: 24 hex digits named by the answer and the call's place in it."""
    return hashlib.sha256(f"{index}\x1e{text}".encode()).hexdigest()[:24]


def with_calls(extra: str | None, text: str | None, tools: Tools | None) -> str | None:
    """``extra`` (an answer's :class:`Extras` JSON, or None) with the tool calls of its text, when
    its request forced a call; as it was otherwise, or when the text is no call (cut short)."""
    if tools is None or not tools.forced() or text is None:
        return extra
    calls = tools.calls(text)
    if not calls:
        return extra
    found = [ToolCall(call_id(text, i), name, arguments) for i, (name, arguments) in enumerate(calls)]
    return msgspec.structs.replace(Extras.decode(extra), tool_calls=found).encode()


def body_fields(tools: Tools, completions: bool) -> dict[str, Any]:
    """A server request's tool fields: the tools (a completions body's are rendered here, into the
    prompt, by ``server.token_prompts``), and for a chat body the choice, which the server then
    runs itself (its schema, its tool calls back: :func:`forced_text`)."""
    fields: dict[str, Any] = {"tools": tools.template_tools()}
    if completions:
        return fields
    fields["tool_choice"] = {"type": "function", "function": {"name": tools.name}} if tools.choice == "named" \
        else tools.choice
    if not tools.parallel:
        fields["parallel_tool_calls"] = False
    return fields


def forced_text(calls: list[dict[str, Any]], tools: Tools) -> str:
    """A chat answer's ``tool_calls`` as the JSON the forced schema makes (what the offline engine
    generates for the same request): a named tool's arguments, or a list of ``{name, parameters}``."""
    def args(call: dict[str, Any]) -> Any:
        return json.loads(call["function"].get("arguments") or "{}")

    if tools.choice == "named":
        return json.dumps(args(calls[0]), ensure_ascii=False)
    return json.dumps([{"name": c["function"]["name"], "parameters": args(c)} for c in calls], ensure_ascii=False)
