"""Error objects as the providers write them (issue 59): OpenAI's own codes and the ``param`` the
reason names, parsed with the ``openai`` package's ``ErrorObject`` strictly; an Anthropic
``errored`` result of a Message Batch cites its request and field, never a line of the server's
file of its requests (a ``run-batch`` user's own file keeps its line)."""

from __future__ import annotations

from typing import Any

import pytest

from sparkbatch_dagster.run.batch_errors import anthropic_message, openai_error
from sparkbatch_dagster.run.batch_export import anthropic_line, openai_line

CASES = [
    ("unparsable_row: line 3: not valid JSON (raw NUL)", "invalid_json_line", None),
    ("unsupported: line 2: url '/v1/embeddings': only /v1/chat/completions is supported", "unsupported_value", "url"),
    ("bad_request: line 4: method 'GET': only POST is supported", "invalid_value", "method"),
    ("bad_request: line 5: body is missing or not an object", "missing_required_parameter", "body"),
    ("bad_request: line 6: custom_id is missing or not a non-empty string", "missing_required_parameter",
     "custom_id"),
    ("bad_request: line 8: body.temperature: Input should be less than or equal to 2", "invalid_value",
     "temperature"),
    ("unsupported: line 9: body.messages[1].role 'tool': roles are ['system']", "unsupported_value",
     "messages[1].role"),
    ("bad_request: line 2: unknown field 'x' in the line (a line has custom_id, params)", "unknown_parameter", "x"),
    ("duplicate_id: id a already used by an earlier row", "duplicate_custom_id", "custom_id"),
    ("prompt_too_long: 3000 tokens, model context is 2048", "context_length_exceeded", "messages"),
    ("empty_text: the prompt is empty", "invalid_value", "messages"),
]


def _row(error: str) -> dict[str, Any]:
    return {"row_id": "r", "error": error, "truncated": False, "finish_reason": None, "output": None, "extra": None,
            "model": None}


@pytest.mark.parametrize(("error", "code", "param"), CASES)
def test_a_requests_fault_is_openais_code_and_param(error: str, code: str, param: str | None):
    from openai.types.shared import ErrorObject

    assert openai_error(error) == ("invalid_request_error", code, param)
    line = openai_line(_row(error), "v", 1, (0, 0)).to_json()
    assert line["response"]["status_code"] == 400 and line["error"] is None
    parsed = ErrorObject.model_validate(line["response"]["body"]["error"], strict=True)
    assert (parsed.type, parsed.code, parsed.param, parsed.message) == ("invalid_request_error", code, param, error)


def test_the_engines_fault_is_a_server_error_without_a_code():
    line = openai_line(_row("bad_output: the answer is not JSON"), "v", 1, (0, 0)).to_json()
    assert line["response"]["status_code"] == 500
    assert line["response"]["body"]["error"]["type"] == "server_error" and line["response"]["body"]["error"]["code"] \
        is None


def test_a_message_batchs_error_cites_its_request_not_a_line():
    from anthropic.types.messages import MessageBatchErroredResult

    error = "bad_request: line 37: params.temperature: Input should be less than or equal to 1"
    cited = anthropic_message(error, cite_requests=True)
    assert cited == "bad_request: requests.36.params.temperature: Input should be less than or equal to 1"
    assert "line" not in cited and anthropic_message(error, cite_requests=False) == error  # run-batch: the user's file
    assert anthropic_message("unsupported: line 2: x", True) == "unsupported: requests.1: x"
    assert anthropic_message("prompt_too_long: 9 tokens", True) == "prompt_too_long: 9 tokens"
    line = anthropic_line(_row(error), "v", (0, 0), cite_requests=True).to_json()
    parsed = MessageBatchErroredResult.model_validate(line["result"], strict=True)
    assert parsed.error.error.message == cited and parsed.error.error.type == "invalid_request_error"
