"""A batch line's tools (issue 51): checked with errors naming the field, a forced call's JSON
schema built as vLLM's server builds it, the tools part of the answer's name, the answer's JSON
read into tool calls, and those calls written as the providers' fields."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sparkbatch_dagster.engines.answers.extras import Extras
from sparkbatch_dagster.engines.answers.tools import with_calls
from sparkbatch_dagster.engines.base import request_of
from sparkbatch_dagster.run.batch_lines import ToolCallMessage, anthropic_content, anthropic_stop, openai_choices
from sparkbatch_dagster.spec import OutputSpec, SamplingSpec
from sparkbatch_dagster.spec.batch_prompt import request_prompt
from sparkbatch_dagster.spec.batch_requests import LineError, parse_line

HI = [{"role": "user", "content": "hi"}]
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
F = {"type": "function", "function": {"name": "f", "description": "F", "parameters": CITY}}
G = {"type": "function", "function": {"name": "g"}}


def openai(**body: Any) -> Any:
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": HI, **body}}
    return parse_line(line, "openai_batch", SamplingSpec()).request


def anthropic(**params: Any) -> Any:
    return parse_line({"custom_id": "a", "params": {"messages": HI, "max_tokens": 9, **params}}, "anthropic_batch",
                      SamplingSpec()).request


def refused(fmt: str, **fields: Any) -> str:
    with pytest.raises(LineError) as caught:
        openai(**fields) if fmt == "openai" else anthropic(**fields)
    return str(caught.value.args[0])


@pytest.mark.parametrize(("fmt", "fields", "named"), [
    ("openai", {"tools": F}, "bad_request: body.tools is not a list"),
    ("openai", {"tools": [{"type": "web_search"}], "tool_choice": "required"}, "unsupported: body.tools[0].type"),
    ("openai", {"tools": [{"type": "function"}], "tool_choice": "required"}, "bad_request: body.tools[0].function"),
    ("openai", {"tools": [{"type": "function", "function": {"name": "a b"}}], "tool_choice": "required"},
     "bad_request: body.tools[0].function.name"),
    ("openai", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}],
                "tool_choice": "required"}, "bad_request: body.tools[0].function.parameters"),
    ("openai", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                                         "required": 3}}}],
                "tool_choice": "required"}, "bad_request: body.tools[0].function.parameters is not a valid"),
    ("openai", {"tools": [F, F], "tool_choice": "required"}, "bad_request: body.tools names 'f' twice"),
    ("openai", {"tools": [F], "tool_choice": {"type": "function", "function": {"name": "g"}}},
     "bad_request: body.tool_choice names 'g'"),
    ("openai", {"tools": [F], "tool_choice": "sometimes"}, "bad_request: body.tool_choice"),
    ("openai", {"tools": [F], "tool_choice": "required", "parallel_tool_calls": "no"},
     "bad_request: body.parallel_tool_calls"),
    ("openai", {"tools": [F]}, "unsupported: body.tools with tool_choice auto"),
    ("openai", {"tools": [F], "tool_choice": "required", "response_format": {"type": "json_object"}},
     "unsupported: body.response_format"),
    ("anthropic", {"tools": [{"name": "t"}], "tool_choice": {"type": "any"}},
     "bad_request: params.tools[0].input_schema is required"),
    ("anthropic", {"tools": [{"type": "web_search_20250305", "name": "web_search"}], "tool_choice": {"type": "any"}},
     "unsupported: params.tools[0].type"),
    ("anthropic", {"tools": [{"name": "t", "input_schema": CITY}], "tool_choice": {"type": "tool"}},
     "bad_request: params.tool_choice.name"),
    ("anthropic", {"tools": [{"name": "t", "input_schema": CITY}], "tool_choice": {"type": "tool", "name": "u"}},
     "bad_request: params.tool_choice names 'u'"),
    ("anthropic", {"tools": [{"name": "t", "input_schema": CITY}], "tool_choice": {"type": "whatever"}},
     "bad_request: params.tool_choice"),
    ("anthropic", {"tool_choice": {"type": "any"}}, "bad_request: params.tool_choice"),
])
def test_tools_that_cannot_run_are_the_lines_error_naming_the_field(fmt: str, fields: dict[str, Any],
                                                                    named: str) -> None:
    assert refused(fmt, **fields).startswith(named)


def test_the_forced_schema_is_vllms() -> None:
    # vllm.tool_parsers.utils.get_json_schema_from_tools for the same request (its output, written down).
    required = openai(tools=[F, G], tool_choice="required", parallel_tool_calls=False).tools
    assert required.schema() == {"type": "array", "minItems": 1, "maxItems": 1, "items": {"type": "object", "anyOf": [
        {"properties": {"name": {"type": "string", "enum": ["f"]}, "parameters": CITY},
         "required": ["name", "parameters"]},
        {"properties": {"name": {"type": "string", "enum": ["g"]}, "parameters": {"type": "object", "properties": {}}},
         "required": ["name", "parameters"]}]}}
    assert "maxItems" not in openai(tools=[F, G], tool_choice="required").tools.schema()
    assert openai(tools=[F, G], tool_choice={"type": "function", "function": {"name": "f"}}).tools.schema() == CITY
    anth = anthropic(tools=[{"name": "f", "input_schema": CITY}], tool_choice={"type": "any",
                                                                              "disable_parallel_tool_use": True})
    assert anth.tools.schema()["maxItems"] == 1
    assert anthropic(tools=[{"name": "f", "input_schema": CITY}],
                     tool_choice={"type": "tool", "name": "f"}).tools.schema() == CITY


def test_defs_move_to_the_top_of_a_required_schema() -> None:
    params = {"type": "object", "properties": {"p": {"$ref": "#/$defs/P"}}, "$defs": {"P": {"type": "string"}}}
    tools = openai(tools=[{"type": "function", "function": {"name": "f", "parameters": params}}],
                   tool_choice="required").tools
    schema = tools.schema()
    assert schema["$defs"] == {"P": {"type": "string"}}
    assert "$defs" not in schema["items"]["anyOf"][0]["properties"]["parameters"]
    other = {**params, "$defs": {"P": {"type": "integer"}}}
    assert refused("openai", tool_choice="required", tools=[
        {"type": "function", "function": {"name": "f", "parameters": params}},
        {"type": "function", "function": {"name": "g", "parameters": other}}]).startswith("bad_request: the tools")


def test_tools_and_choice_name_the_answer() -> None:
    plain = openai()
    assert "tools" not in plain.to_text()  # a line without tools keeps the bytes it always had
    texts = {openai(tools=[F, G], tool_choice="required").to_text(),
             openai(tools=[F], tool_choice="required").to_text(),
             openai(tools=[F, G], tool_choice="required", parallel_tool_calls=False).to_text(),
             openai(tools=[F, G], tool_choice={"type": "function", "function": {"name": "f"}}).to_text(),
             openai(tools=[F, {**G, "function": {"name": "g", "description": "other"}}],
                    tool_choice="required").to_text(),
             openai(tools=[F, G], tool_choice="none").to_text(), plain.to_text()}
    assert len(texts) == 7
    job = SamplingSpec()  # the lines sample, and a draw is never named: name them greedy
    keys = {request_prompt(t.replace('"temperature":1.0', '"temperature":0.0'), job).answer_key(job, OutputSpec())
            for t in texts}
    assert len(keys) == 7
    # The same tools from either provider are the same request.
    assert anthropic(tools=[{"name": "f", "description": "F", "input_schema": CITY}],
                     tool_choice={"type": "any"}).tools == openai(tools=[F], tool_choice="required").tools


def test_a_forced_line_runs_as_json_under_the_schema_and_carries_its_tools() -> None:
    req = openai(tools=[F, G], tool_choice="required")
    prompt = request_prompt(req.to_text(), SamplingSpec())
    assert prompt.output is not None and prompt.output.kind == "json"
    assert prompt.output.json_schema == req.tools.schema()
    engine_request = request_of("r", prompt)
    assert engine_request.tools == req.tools
    assert [t["function"]["name"] for t in req.tools.template_tools()] == ["f", "g"]
    assert req.tools.template_tools()[0] == F
    shown = request_prompt(openai(tools=[F], tool_choice="none").to_text(), SamplingSpec())
    assert shown.output is None and shown.tools is not None and not shown.tools.forced()


def test_a_forced_answer_becomes_tool_calls() -> None:
    required = openai(tools=[F, G], tool_choice="required").tools
    text = '[{"name": "f", "parameters": {"city": "Paris"}}, {"name": "g", "parameters": {}}]'
    extra = with_calls(None, text, required)
    calls = Extras.decode(extra).tool_calls
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("f", {"city": "Paris"}), ("g", {})]
    assert len({c.id for c in calls}) == 2 and with_calls(None, text, required) == extra  # ids named by the answer
    named = openai(tools=[F, G], tool_choice={"type": "function", "function": {"name": "f"}}).tools
    calls = Extras.decode(with_calls('{"stop": "x"}', '{"city": "Oslo"}', named))
    assert calls.stop == "x" and [(c.name, c.arguments) for c in calls.tool_calls] == [("f", '{"city": "Oslo"}')]
    # A cut answer: its calls as far as they went (issue 59); a line that forced nothing: no calls.
    assert [(c.name, c.arguments) for c in Extras.decode(with_calls(None, '[{"name": "f", "param', required))
            .tool_calls] == [("f", "")]
    assert with_calls(None, text, None) is None
    assert with_calls(None, text, openai(tools=[F], tool_choice="none").tools) is None


def test_tool_calls_are_written_as_the_providers_fields() -> None:
    named = openai(tools=[F], tool_choice={"type": "function", "function": {"name": "f"}}).tools
    extra = with_calls(None, '{"city": "Oslo"}', named)
    (choice,) = openai_choices('{"city": "Oslo"}', False, extra)
    assert choice.finish_reason == "tool_calls" and isinstance(choice.message, ToolCallMessage)
    assert choice.message.content is None
    call = choice.message.tool_calls[0]
    assert call.id.startswith("call_") and call.function.name == "f" and call.function.arguments == '{"city": "Oslo"}'
    from openai.types.chat import ChatCompletion

    body = {"id": "x", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [choice.to_json()]}
    parsed = ChatCompletion.model_validate(body, strict=True)
    assert parsed.choices[0].message.tool_calls and parsed.choices[0].message.tool_calls[0].function.name == "f"
    assert anthropic_stop(False, extra) == ("tool_use", None) and anthropic_stop(True, extra)[0] == "max_tokens"
    (block,) = anthropic_content('{"city": "Oslo"}', extra)
    assert block.to_json() == {"type": "tool_use", "id": "toolu_" + call.id[len("call_"):], "name": "f",
                               "input": {"city": "Oslo"}}
    assert [b.to_json() for b in anthropic_content("hello", None)] == [{"type": "text", "text": "hello"}]


class _Template:
    """A tokenizer whose chat template shows what it was given (the tools' names)."""

    chat_template = "yes"

    def apply_chat_template(self, messages: list[dict[str, str]], tokenize: bool, add_generation_prompt: bool,
                            tools: list[dict[str, Any]] | None = None) -> str:
        names = [t["function"]["name"] for t in tools or []]
        return f"tools={names} " + " ".join(m["content"] for m in messages)

    def __call__(self, texts: list[str], add_special_tokens: bool) -> dict[str, list[list[int]]]:
        return {"input_ids": [[len(t)] for t in texts]}


def test_a_server_is_sent_the_tools_and_its_tool_calls_come_back_as_calls() -> None:
    from sparkbatch_dagster.engines.answers.tools import body_fields
    from sparkbatch_dagster.engines.server.server_bodies import answer_result
    from sparkbatch_dagster.engines.server.token_prompts import token_bodies
    from sparkbatch_dagster.spec.prompts import chat_text

    named = openai(tools=[F, G], tool_choice={"type": "function", "function": {"name": "f"}}).tools
    required = openai(tools=[F, G], tool_choice="required", parallel_tool_calls=False).tools
    # A chat body: the server runs the choice itself.
    assert body_fields(named, completions=False) == {"tools": named.template_tools(), "tool_choice": {
        "type": "function", "function": {"name": "f"}}}
    assert body_fields(required, completions=False)["parallel_tool_calls"] is False
    # Token ids: the tools rendered here by the chat template, as the offline engine renders them.
    (body,) = token_bodies(_Template(), [{"messages": HI, **body_fields(named, completions=True)}])
    assert "tools" not in body and body["prompt"] == [len("tools=['f', 'g'] hi")]
    assert chat_text(_Template(), HI)[0] == "tools=[] hi"
    answer = {"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": None,
              "tool_calls": [{"id": "chatcmpl-tool-1", "type": "function",
                              "function": {"name": "f", "arguments": '{"city": "Rome"}'}}]}}],
              "usage": {"prompt_tokens": 3, "completion_tokens": 5}}
    res = answer_result("r", answer, None, None, None, tools=named)
    assert json.loads(res.text or "") == {"city": "Rome"}
    assert [(c.name, c.arguments) for c in Extras.decode(res.extra).tool_calls] == [("f", '{"city": "Rome"}')]
    res = answer_result("r", answer, None, None, None, tools=required)
    assert json.loads(res.text or "") == [{"name": "f", "parameters": {"city": "Rome"}}]
    # A completion's text is the forced JSON itself.
    text = {"choices": [{"index": 0, "finish_reason": "stop", "text": '{"city": "Rome"}'}], "usage": {}}
    assert Extras.decode(answer_result("r", text, None, None, None, tools=named).extra).tool_calls[0].name == "f"
