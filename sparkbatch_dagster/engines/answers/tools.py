"""A batch line's tool calls, read from its answer into :class:`.extras.Extras`' ``tool_calls``.

A forced call (``Tools.forced()``) is JSON under the tools' schema, as vLLM's server generates
it: :meth:`~sparkbatch_dagster.spec.batch_tools.Tools.calls` reads it. A forced answer cut at
``max_tokens`` is no whole JSON: its calls are read as far as they go (:func:`cut_calls`: the
complete ones, then the last one's name and the start of its arguments), as OpenAI returns a
call cut at its limit (``finish_reason`` ``length``), never the engine's internal array as text.
The id kept here is a placeholder: the result files name each call by the batch, the request,
the choice and the call's place (``run/batch_lines.call_id``), so two requests with the same
answer never share one. Example::

    extra = with_calls(extra, text, req.tools)   # the row's extra column, with the calls

A server's chat body carries the tools and the choice (:func:`body_fields`), and its answer's
``tool_calls`` are read back as that JSON (:func:`forced_text`).
"""

from __future__ import annotations

import hashlib
import json
import re
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
    if calls is None:
        calls = cut_calls(text, tools)
    if not calls:
        return extra
    found = [ToolCall(call_id(text, i), name, arguments) for i, (name, arguments) in enumerate(calls)]
    return msgspec.structs.replace(Extras.decode(extra), tool_calls=found).encode()


#: The name of a call in the forced array, where the array is cut.
_NAME = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_PARAMETERS = re.compile(r'\s*,\s*"parameters"\s*:\s*')


def cut_calls(text: str, tools: Tools) -> list[tuple[str, str]]:
    """The calls of a forced answer cut short, as (name, arguments so far): a named tool's
    arguments are the text itself; an array's complete calls, then the cut one's name and the
    start of its ``parameters`` (none when even its name was cut)."""
    if tools.choice == "named":
        return [(str(tools.name), text)]
    decoder, calls, at = json.JSONDecoder(), [], text.find("[") + 1
    while 0 < at < len(text):
        start = len(text) - len(text[at:].lstrip(" \t\n\r,"))
        try:
            call, at = decoder.raw_decode(text, start)
        except ValueError:
            found = _NAME.match(text, start)
            if found is not None:
                params = _PARAMETERS.match(text, found.end())
                calls.append((json.loads(f'"{found.group(1)}"'), text[params.end():] if params else ""))
            break
        if isinstance(call, dict) and isinstance(call.get("name"), str):
            calls.append((call["name"], json.dumps(call.get("parameters", {}), ensure_ascii=False)))
    return calls


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
    def args(call: dict[str, Any]) -> tuple[str, bool]:
        raw = call["function"].get("arguments") or "{}"
        try:
            return json.dumps(json.loads(raw), ensure_ascii=False), True
        except ValueError:  # a call cut at max_tokens: its arguments as far as they go, left open
            return str(raw), False

    if tools.choice == "named":
        return args(calls[0])[0]
    parts = []
    for call in calls:
        arguments, whole = args(call)
        parts.append(f'{{"name": {json.dumps(call["function"]["name"], ensure_ascii=False)}, "parameters": '
                     f'{arguments}' + ("}" if whole else ""))
        if not whole:
            return "[" + ", ".join(parts)
    return "[" + ", ".join(parts) + "]"
