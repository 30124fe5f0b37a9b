"""Provider batch files: one request line of an OpenAI Batch input file (``/v1/chat/completions``)
or an Anthropic Message Batches file, checked and reduced to what this product runs.

A line becomes a :class:`BatchLine` (its ``custom_id``, provider, url, the body or params as
sent, and the :class:`BatchRequest` it normalizes to: messages, the sampling fields it sets that
differ from the job's, its output), or :class:`LineError` says why it cannot run (``bad_request:
...``, ``unsupported: ...``). What does not map to this product (images, audio, per-line
reasoning...) is an error naming the field, never dropped silently. A request's canonical
JSON (:meth:`BatchRequest.to_text`) is the row's one text column; :mod:`.batch_prompt` reads it
back as the run's prompt. The sampling fields are :mod:`.request_fields`' declaration; a field a
line leaves out is the job's where the job sets it, else the hosted APIs' default
(:data:`.request_fields.LINE_DEFAULTS`: temperature 1, no seed). Example::

    line = parse_line(obj, "openai_batch", SamplingSpec())   # raises LineError
    text = line.request.to_text()                            # the staged row's ``request``
"""

from __future__ import annotations

import json
from typing import Any, Literal

import msgspec

from .answer import SamplingSpec
from .batch_tools import ToolError, Tools, line_tools
from .job_spec import BATCH_INPUTS
from .request_fields import FIELDS_BY_NAME, LINE_DEFAULTS, line_names

__all__ = ["BATCH_INPUTS", "BatchLine", "BatchRequest", "JsonOutput", "LineError", "Message", "normalize",
           "parse_line"]
Provider = Literal["openai_batch", "anthropic_batch"]
#: The one endpoint an OpenAI line may name (vLLM's ``run-batch`` also takes ``/v1/embeddings``...).
CHAT_URLS = ("/v1/chat/completions",)
#: Request fields accepted and not acted on: they change nothing this product generates
#: (``parallel_tool_calls`` does with tools: :mod:`.batch_tools` reads it there).
_IGNORED = {"model", "user", "metadata", "store", "service_tier", "stream_options", "parallel_tool_calls",
            "prompt_cache_key", "safety_identifier", "container", "context_management", "mcp_servers"}
#: Fields accepted when they hold the value that means "nothing special" (reasoning:
#: off), per provider. Any other value of theirs is refused, naming the field.
_NEUTRAL: dict[str, dict[str, tuple[Any, ...]]] = {
    "openai_batch": {"stream": (False,), "reasoning_effort": (None, "none"), "top_logprobs": (None,)},
    "anthropic_batch": {"stream": (False,), "thinking": (None, {"type": "disabled"})}}
#: Why a neutral-only field's other values are refused (the engine runs them otherwise).
_WHY = {"reasoning_effort": "a batch line cannot set its own reasoning: set the job's sampling.reasoning (a thinking "
                            "budget, docs/reasoning.md)",
        "thinking": "a batch line cannot set its own thinking: set the job's sampling.reasoning (a thinking budget, "
                    "docs/reasoning.md)",
        "stream": "a batch answer is never streamed"}
#: A line's sampling fields, per provider: its name there -> ``SamplingSpec``'s (``top_logprobs``
#: is read with ``logprobs``).
_SAMPLING = {fmt: {k: v for k, v in line_names(fmt).items() if k != "top_logprobs"}
             for fmt in ("openai_batch", "anthropic_batch")}
_ROLES = {"openai_batch": ("system", "developer", "user", "assistant"), "anthropic_batch": ("user", "assistant")}


class LineError(ValueError):
    """Why one request line cannot run: its message is the error row's reason."""


class Message(msgspec.Struct, frozen=True, omit_defaults=True):
    """One chat turn of a normalized request (``developer`` is ``system``; content is text;
    ``name``: the turn's participant name, given to the chat template as sent)."""

    role: str
    content: str
    name: str | None = None


class JsonOutput(msgspec.Struct, frozen=True):
    """A request's ``response_format`` as this product runs it: JSON under ``json_schema``."""

    kind: Literal["json"]
    json_schema: dict[str, Any]


class BatchRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A request line reduced to what this product runs: its messages, the sampling fields it sets
    that differ from the job's (``SamplingSpec`` field names, validated), its output (None:
    plain text) and its tools (:mod:`.batch_tools`; None, and absent from the JSON: none)."""

    messages: list[Message]
    sampling: dict[str, Any]
    output: JsonOutput | None
    tools: Tools | None = None

    def to_text(self) -> str:
        """The canonical JSON: the staged row's ``request``, the same bytes for the same request
        (it names the prompt in the result store, so reuse across releases depends on it)."""
        return json.dumps(msgspec.to_builtins(self), sort_keys=True, ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_text(cls, text: str) -> BatchRequest:
        """A staged row's ``request`` read back (numbers as the standard JSON reader gives them)."""
        return msgspec.convert(json.loads(text), cls)


class BatchLine(msgspec.Struct, frozen=True, kw_only=True):
    """One request line of a provider batch file that can run: its ``custom_id``, provider,
    ``url`` (OpenAI's endpoint; None for Anthropic), the body or params as sent, and the
    request they normalize to."""

    custom_id: str
    provider: Provider
    url: str | None
    params: dict[str, Any]
    request: BatchRequest


def parse_line(obj: Any, fmt: str, job: SamplingSpec) -> BatchLine:
    """One decoded line, checked and normalized; raises :class:`LineError` (after ``custom_id`` is
    known, as ``LineError.args[1]``) when it cannot run."""
    if not isinstance(obj, dict):
        raise LineError(f"bad_request: a JSON {type(obj).__name__}, expected an object", None)
    cid = obj.get("custom_id")
    cid = cid if isinstance(cid, str) and cid else None
    try:
        if cid is None:
            raise LineError("bad_request: custom_id is missing or not a non-empty string")
        if fmt == "openai_batch":
            body = _openai_body(obj)
            return BatchLine(custom_id=cid, provider="openai_batch", url=obj["url"], params=body,
                             request=normalize(body, fmt, job))
        params = _anthropic_params(obj)
        return BatchLine(custom_id=cid, provider="anthropic_batch", url=None, params=params,
                         request=normalize(params, fmt, job))
    except LineError as exc:
        raise LineError(exc.args[0], cid) from None


def _openai_body(obj: dict[str, Any]) -> dict[str, Any]:
    extra = sorted(set(obj) - {"custom_id", "method", "url", "body"})
    if extra:
        raise LineError(f"bad_request: unknown field {extra[0]!r} in the line (a line has custom_id, method, url, "
                        "body)")
    if obj.get("method") != "POST":
        raise LineError(f"bad_request: method {obj.get('method')!r}: only POST is supported")
    if obj.get("url") not in CHAT_URLS:
        raise LineError(f"unsupported: url {obj.get('url')!r}: only {CHAT_URLS[0]} is supported")
    body = obj.get("body")
    if not isinstance(body, dict):
        raise LineError("bad_request: body is missing or not an object")
    return body


def _anthropic_params(obj: dict[str, Any]) -> dict[str, Any]:
    extra = sorted(set(obj) - {"custom_id", "params"})
    if extra:
        raise LineError(f"bad_request: unknown field {extra[0]!r} in the line (a line has custom_id, params)")
    params = obj.get("params")
    if not isinstance(params, dict):
        raise LineError("bad_request: params is missing or not an object")
    if "max_tokens" not in params:
        raise LineError("bad_request: params.max_tokens is required (Anthropic's Messages API requires it)")
    return params


def normalize(body: dict[str, Any], fmt: str, job: SamplingSpec) -> BatchRequest:
    """A request body reduced to its messages, the sampling fields it sets, its output."""
    where = "body" if fmt == "openai_batch" else "params"
    for key, value in body.items():
        if key in _IGNORED or key in _SAMPLING[fmt] or key in ("messages", "system", "response_format", "tools",
                                                              "tool_choice"):
            continue
        if key in _NEUTRAL[fmt] and value in _NEUTRAL[fmt][key]:
            continue
        if key == "top_logprobs" and body.get("logprobs") is True:
            continue
        why = _WHY.get(key, f"not a field sparkbatch runs (it runs {', '.join(sorted(_SAMPLING[fmt]))}, messages, "
                       f"{'system, ' if fmt == 'anthropic_batch' else 'response_format, '}and ignores "
                       f"{', '.join(sorted(_IGNORED))})")
        raise LineError(f"{'bad_request' if key == 'top_logprobs' else 'unsupported'}: {where}.{key}="
                        f"{json.dumps(value)[:60]}: "
                        + ("top_logprobs needs logprobs: true" if key == "top_logprobs" else why))
    messages = _messages(body.get("messages"), fmt, where)
    if fmt == "anthropic_batch" and body.get("system") is not None:
        messages.insert(0, Message("system", _text(body["system"], f"{where}.system")))
    elif "system" in body:
        raise LineError(f"unsupported: {where}.system: give the system prompt as a message with role 'system'")
    output = _output(body.get("response_format"), where)
    try:
        tools = line_tools(body, fmt, where, output is not None)
    except ToolError as exc:
        raise LineError(str(exc)) from None
    return BatchRequest(messages=messages, sampling=_sampling(body, fmt, job, where), output=output, tools=tools)


def _messages(value: Any, fmt: str, where: str) -> list[Message]:
    if not isinstance(value, list) or not value:
        raise LineError(f"bad_request: {where}.messages is missing or empty")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or m.get("role") not in _ROLES[fmt]:
            role = m.get("role") if isinstance(m, dict) else m
            raise LineError(f"unsupported: {where}.messages[{i}].role {role!r}: roles are {list(_ROLES[fmt])}")
        role = "system" if m["role"] == "developer" else m["role"]
        other = sorted(set(m) - {"role", "content", "name"})
        if other:
            raise LineError(f"unsupported: {where}.messages[{i}].{other[0]} (tool calls and audio are not supported)")
        name = m.get("name")
        if name is not None and not isinstance(name, str):
            raise LineError(f"bad_request: {where}.messages[{i}].name is not a string")
        out.append(Message(role, _text(m.get("content"), f"{where}.messages[{i}].content"), name))
    if out[-1].role == "assistant":
        raise LineError(f"unsupported: {where}.messages ends with an assistant turn (a prefill): end with a user turn")
    return out


def _text(content: Any, where: str) -> str:
    """A message's text: a string, or text parts joined (any other part is refused)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise LineError(f"unsupported: {where} part of type {kind!r}: only text parts are supported")
            texts.append(part["text"])
        return "\n".join(texts)
    raise LineError(f"bad_request: {where} is missing, empty or not text")


def _sampling(body: dict[str, Any], fmt: str, job: SamplingSpec, where: str) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    named: dict[str, str] = {}  # SamplingSpec's name -> the line's, for the error's message
    for key, ours in _SAMPLING[fmt].items():
        value = body.get(key)
        if value is not None and not (key == "max_tokens" and "max_completion_tokens" in body):
            fields[ours], named[ours] = _value(key, value, body, where), key
            _check_range(key, ours, fields[ours], fmt, where)
    # What the line leaves out: the job's where the job sets it, else the hosted APIs' default.
    unset = {k: v for k, v in LINE_DEFAULTS.items() if k not in fields and k not in job.model_fields_set}
    try:
        merged = SamplingSpec(**{**job.model_dump(), **unset, **fields})
    except ValueError as exc:
        first = exc.errors()[0] if hasattr(exc, "errors") else {"loc": ("?",), "msg": str(exc)}
        field = str(first["loc"][0]) if first["loc"] else "?"
        raise LineError(f"bad_request: {where}.{named.get(field, field)}: {first['msg']}") from None
    # Only what differs from the job's: a line that asks for nothing special shares the job's settings.
    return {k: v for k, v in merged.model_dump().items() if v != getattr(job, k)}


def _check_range(key: str, ours: str, value: Any, fmt: str, where: str) -> None:
    """A provider's own range, where narrower than ours (Anthropic's temperature: 0 to 1)."""
    bounds = FIELDS_BY_NAME[ours].bounds(fmt)
    if bounds and isinstance(value, int | float) and not bounds[0] <= value <= bounds[1]:
        raise LineError(f"bad_request: {where}.{key}={value}: must be between {bounds[0]:g} and {bounds[1]:g}")


def _value(key: str, value: Any, body: dict[str, Any], where: str) -> Any:
    """A sampling field's value as ``SamplingSpec`` names it (the type checks are its own)."""
    if key in ("stop", "stop_sequences"):
        stops = [value] if isinstance(value, str) else value
        if key == "stop" and isinstance(stops, list) and len(stops) > 4:
            raise LineError(f"bad_request: {where}.stop has {len(stops)} sequences: at most 4")
        return stops
    if key == "logprobs":
        if not isinstance(value, bool):
            raise LineError(f"bad_request: {where}.logprobs={json.dumps(value)[:20]}: a boolean")
        return body.get("top_logprobs") or 0 if value else None
    if key == "logit_bias" and isinstance(value, dict):
        try:
            return {int(k): v for k, v in value.items()}
        except ValueError:
            raise LineError(f"bad_request: {where}.logit_bias: its keys are token ids (\"50256\")") from None
    return value


def _output(fmt: Any, where: str) -> JsonOutput | None:
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return None
    if not isinstance(fmt, dict):
        raise LineError(f"bad_request: {where}.response_format is not an object")
    if fmt.get("type") == "json_object":
        return JsonOutput("json", {"type": "object"})
    schema = (fmt.get("json_schema") or {}).get("schema") if fmt.get("type") == "json_schema" else None
    if not isinstance(schema, dict) or not schema:
        raise LineError(f"unsupported: {where}.response_format {json.dumps(fmt)[:80]}: use json_schema with a "
                        "schema, json_object or text")
    return JsonOutput("json", schema)
