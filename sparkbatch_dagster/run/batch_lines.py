"""The lines of the providers' batch result files, as typed records: an OpenAI Batch output or
error line (:class:`OpenAIResultLine`) and an Anthropic Message Batches result
(:class:`AnthropicResultLine`). Their fields, in order, are the providers' (the tests parse the
files with the ``openai`` and ``anthropic`` packages' own models); ``to_json()`` gives the line
as written. :mod:`.batch_export` builds them from output rows.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

import msgspec

from ..engines.answers import extras
from ..engines.answers.extras import Extras


class _Line(msgspec.Struct, frozen=True, kw_only=True):
    def to_json(self) -> dict[str, Any]:
        """The line as the result file has it (one JSON object)."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out


# --- OpenAI Batch: https://platform.openai.com/docs/api-reference/batch/request-output -------


class AssistantMessage(_Line, frozen=True, kw_only=True):
    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: None = None


class FunctionCall(_Line, frozen=True, kw_only=True):
    name: str
    arguments: str  # JSON text, as the API gives it


class ToolCall(_Line, frozen=True, kw_only=True):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ToolCallMessage(AssistantMessage, frozen=True, kw_only=True):
    """The message of an answer that calls tools (a batch line's ``tools``)."""

    tool_calls: list[ToolCall]


class TopLogprob(_Line, frozen=True, kw_only=True):
    token: str
    bytes: list[int] | None
    logprob: float


class TokenLogprob(_Line, frozen=True, kw_only=True):
    token: str
    bytes: list[int] | None
    logprob: float
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(_Line, frozen=True, kw_only=True):
    """A choice's ``logprobs``, when its request set ``logprobs: true``."""

    content: list[TokenLogprob] | None
    refusal: None = None


class Choice(_Line, frozen=True, kw_only=True):
    index: int = 0
    finish_reason: Literal["stop", "length", "tool_calls"]
    logprobs: ChoiceLogprobs | None = None
    message: AssistantMessage


class CompletionUsage(_Line, frozen=True, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(_Line, frozen=True, kw_only=True):
    """The body of an answered line: a ``chat.completion`` as the endpoint returns it."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    system_fingerprint: str
    choices: list[Choice]
    usage: CompletionUsage


class ApiError(_Line, frozen=True, kw_only=True):
    message: str
    type: Literal["invalid_request_error", "server_error"]
    param: str | None = None
    code: str | None


class ErrorBody(_Line, frozen=True, kw_only=True):
    """The body of an error line's response, as the endpoint would have answered."""

    error: ApiError


class Response(_Line, frozen=True, kw_only=True):
    status_code: int
    request_id: str
    body: ChatCompletion | ErrorBody


class LineFailure(_Line, frozen=True, kw_only=True):
    """An error line's ``error``: the kind (``code``), the reason, the input line when known."""

    code: str
    message: str
    line: int | None
    param: None = None


class OpenAIResultLine(_Line, frozen=True, kw_only=True):
    """One line of an OpenAI Batch output file (``error`` None) or error file."""

    id: str
    custom_id: str
    response: Response
    error: LineFailure | None


# --- Anthropic Message Batches: https://docs.anthropic.com/en/api/retrieving-message-batch-results


class TextBlock(_Line, frozen=True, kw_only=True):
    type: Literal["text"] = "text"
    text: str | None


class ToolUseBlock(_Line, frozen=True, kw_only=True):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


class MessageUsage(_Line, frozen=True, kw_only=True):
    input_tokens: int
    output_tokens: int


class Message(_Line, frozen=True, kw_only=True):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[TextBlock | ToolUseBlock]
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]
    stop_sequence: str | None = None
    usage: MessageUsage


class Succeeded(_Line, frozen=True, kw_only=True):
    type: Literal["succeeded"] = "succeeded"
    message: Message


class ErrorDetail(_Line, frozen=True, kw_only=True):
    type: Literal["invalid_request_error", "api_error"]
    message: str


class ErrorResponse(_Line, frozen=True, kw_only=True):
    type: Literal["error"] = "error"
    error: ErrorDetail
    request_id: None = None


class Errored(_Line, frozen=True, kw_only=True):
    type: Literal["errored"] = "errored"
    error: ErrorResponse


class AnthropicResultLine(_Line, frozen=True, kw_only=True):
    """One result of an Anthropic Message Batches results file."""

    custom_id: str
    result: Succeeded | Errored


ResultLine = OpenAIResultLine | AnthropicResultLine


def call_id(key: str, choice: int, call: int) -> str:
    """A tool call's id (24 hex digits, before the provider's prefix): named by ``key`` (the batch
    and the request: :mod:`.batch_export` passes them), the choice and the call's place, so it is
    unique per call and the same when the same batch's results are written again."""
    return hashlib.sha256(json.dumps([key, choice, call]).encode()).hexdigest()[:24]


def openai_choices(text: str, cut: bool, extra: str | None, key: str = "") -> list[Choice]:
    """An answer's ``choices``: the row's answer first, then the further ones its request asked
    for (``n``), each with its ``logprobs`` when asked (``extra``: the row's, :mod:`.extras`);
    ``key`` names its tool calls' ids (:func:`call_id`). A call cut at ``max_tokens`` is a
    ``length`` choice with the call as far as it went, as OpenAI returns one."""
    more = Extras.decode(extra)
    first = Choice(finish_reason="length" if cut else "stop", logprobs=_logprobs(more.logprobs),
                   message=AssistantMessage(content=text))
    if more.tool_calls:  # the answer is its calls: the text besides them (none for a forced call) is the content
        first = Choice(finish_reason="length" if cut else "tool_calls", logprobs=_logprobs(more.logprobs),
                       message=ToolCallMessage(content=more.content, tool_calls=[
                           ToolCall(id=f"call_{call_id(key, 0, i)}", function=FunctionCall(
                               name=c.name, arguments=c.arguments)) for i, c in enumerate(more.tool_calls)]))
    return [first] + [Choice(index=i, finish_reason="length" if c.finish_reason == "length" else "stop",
                             logprobs=_logprobs(c.logprobs), message=AssistantMessage(content=c.text))
                      for i, c in enumerate(more.choices, start=1)]


def _logprobs(tokens: list[extras.TokenLogprob] | None) -> ChoiceLogprobs | None:
    if tokens is None:
        return None
    return ChoiceLogprobs(content=[TokenLogprob(token=t.token, bytes=list(t.token.encode()), logprob=t.logprob,
                                                top_logprobs=[TopLogprob(token=a.token, bytes=list(a.token.encode()),
                                                                         logprob=a.logprob) for a in t.top])
                                   for t in tokens])


def anthropic_stop(cut: bool, extra: str | None) -> tuple[Literal["end_turn", "max_tokens", "stop_sequence",
                                                                  "tool_use"], str | None]:
    """A message's ``stop_reason`` and ``stop_sequence``: ``max_tokens`` when it was cut (a tool
    call too, as Anthropic's), the stop sequence that ended it if one did; ``tool_use`` when it
    calls tools."""
    more = Extras.decode(extra)
    if cut:
        return "max_tokens", None
    if more.tool_calls:
        return "tool_use", None
    return ("stop_sequence", more.stop) if more.stop is not None else ("end_turn", None)


def anthropic_content(text: str, extra: str | None, key: str = "") -> list[TextBlock | ToolUseBlock]:
    """A message's ``content``: its text, or the text besides its tool calls (if any) and a
    ``tool_use`` block per call (ids by ``key``: :func:`call_id`); a call cut short has the
    ``input`` it got whole, else ``{}`` (its arguments as far as they went are no object)."""
    more = Extras.decode(extra)
    if not more.tool_calls:
        return [TextBlock(text=text)]
    blocks: list[TextBlock | ToolUseBlock] = [TextBlock(text=more.content)] if more.content else []
    return blocks + [ToolUseBlock(id=f"toolu_{call_id(key, 0, i)}", name=c.name, input=_input(c.arguments))
                     for i, c in enumerate(more.tool_calls)]


def _input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
