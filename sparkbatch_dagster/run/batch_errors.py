"""A request's error as each provider words it: the job's error row (``<kind>: [line N: ]<why>``)
as OpenAI's error object (:func:`openai_error`: its ``type``, its own ``code`` and the ``param``
the reason names) or as the message of Anthropic's ``errored`` result (:func:`anthropic_message`,
which cites the request and field of a Message Batch, never a line of a file its user never saw).

    openai_error("bad_request: line 4: body.temperature=9: at most 2")
    # ('invalid_request_error', 'invalid_value', 'temperature')
"""

from __future__ import annotations

import re
from typing import Literal

ErrorType = Literal["invalid_request_error", "server_error"]

#: The job's kinds of row error that are the request's fault, as OpenAI's codes (``bad_request``'s
#: is read from its reason: :func:`_bad_request`).
_CODES = {"unsupported": "unsupported_value", "unparsable_row": "invalid_json_line",
          "invalid_text": "invalid_json_line", "duplicate_id": "duplicate_custom_id",
          "null_id": "missing_required_parameter", "prompt_too_long": "context_length_exceeded",
          "too_long": "context_length_exceeded", "empty_text": "invalid_value", "null_text": "invalid_value",
          "bad_type": "invalid_type", "render_error": "invalid_value"}
#: Row errors that are the request's fault: HTTP 400, as the provider answers them.
CLIENT_ERRORS = ("bad_request", *_CODES)
#: The field a kind is always about, when its reason names none.
_PARAMS = {"duplicate_id": "custom_id", "null_id": "custom_id", "prompt_too_long": "messages",
           "too_long": "messages", "empty_text": "messages", "null_text": "messages"}
_LINE = re.compile(r"^(\w+): line (\d+): ")
_FIELD = re.compile(r"\b(?:body|params)\.([A-Za-z_]\w*(?:\[\d+\])*(?:\.[A-Za-z_]\w*(?:\[\d+\])*)*)")
_UNKNOWN = re.compile(r"unknown field '([^']+)'")
_LEADING = re.compile(r"^(custom_id|url|method|body|params)\b")


def kind_of(error: str) -> str:
    """The error row's kind: the word before its first colon."""
    return error.split(":", 1)[0].strip() or "error"


def is_client_error(error: str) -> bool:
    """Whether the row failed by the request's fault (HTTP 400), not the engine's (500)."""
    return kind_of(error).startswith(CLIENT_ERRORS)


def openai_error(error: str) -> tuple[ErrorType, str | None, str | None]:
    """(``type``, ``code``, ``param``) of OpenAI's error object for an error row: a request's own
    fault is an ``invalid_request_error`` with OpenAI's code and the field at fault; the engine's
    is a ``server_error`` (code None, as OpenAI's 500s)."""
    if not is_client_error(error):
        return "server_error", None, None
    kind = kind_of(error)
    why = _LINE.sub("", error)
    why = why.split(":", 1)[1].strip() if why.startswith(kind + ":") else why
    code = _CODES.get(kind) or _bad_request(why)
    return "invalid_request_error", code, _param(why) or _PARAMS.get(kind)


def _bad_request(why: str) -> str:
    if _UNKNOWN.search(why):
        return "unknown_parameter"
    if "is missing" in why or "is required" in why:
        return "missing_required_parameter"
    return "invalid_value"


def _param(why: str) -> str | None:
    """The request field a reason names: ``body.temperature`` -> ``temperature``, an unknown
    field's name, or the line's field it starts with (``url``, ``custom_id``...)."""
    for pattern in (_FIELD, _UNKNOWN, _LEADING):
        found = pattern.search(why)
        if found is not None:
            return found.group(1)
    return None


def anthropic_message(error: str, cite_requests: bool) -> str:
    """An ``errored`` result's message: the error row's reason; for a Message Batch created
    through the API (``cite_requests``), its ``line N`` (the server's own file of the requests,
    one a line) cited as the request Anthropic's client sent: ``requests.<N-1>.params.max_tokens``."""
    if not cite_requests:
        return error
    found = _LINE.match(error)
    if found is None:
        return error
    rest = error[found.end():]
    where = f"requests.{int(found.group(2)) - 1}"
    return f"{found.group(1)}: {where}.{rest}" if rest.startswith("params") else f"{found.group(1)}: {where}: {rest}"
