"""Batch lines with tools (issue 51) on the fake engine, through the whole job: a forced call
(OpenAI ``tool_choice: "required"`` or a named function; Anthropic ``{"type": "any"}`` or
``{"type": "tool"}``) comes back as the providers' tool calls, every line parsed with their own
types in strict mode; the tools name the answer, and a reused answer keeps its calls. The same on
the real engine: tests/real/test_real_batch_fields.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from batch_jobs import run_file

URL = "/v1/chat/completions"
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
           "required": ["city", "days"]}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"]}
OPENAI_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                                  "parameters": WEATHER}},
                {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
ANTHROPIC_TOOLS = [{"name": "get_weather", "description": "Weather", "input_schema": WEATHER},
                   {"name": "get_time", "input_schema": TIME}]


def openai_line(cid: str, content: str = "hello", **body: Any) -> str:
    return json.dumps({"custom_id": cid, "method": "POST", "url": URL,
                       "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": content}], **body}})


def anthropic_line(cid: str, **params: Any) -> str:
    return json.dumps({"custom_id": cid, "params": {"model": "claude-x", "max_tokens": 64,
                                                    "messages": [{"role": "user", "content": cid}], **params}})


def _completions(ok: list[dict[str, Any]]) -> dict[str, Any]:
    from openai.types.chat import ChatCompletion

    return {x["custom_id"]: ChatCompletion.model_validate(x["response"]["body"], strict=True) for x in ok}


def _matches(arguments: dict[str, Any], schema: dict[str, Any]) -> bool:
    import jsonschema

    return jsonschema.Draft202012Validator(schema).is_valid(arguments)


def test_openai_forced_tool_calls_come_back_as_tool_calls(tmp_path: Path) -> None:
    from openai.types import ErrorObject

    lines = [openai_line("required", "weather in Paris?", tools=OPENAI_TOOLS, tool_choice="required"),
             openai_line("named", "what time is it?", tools=OPENAI_TOOLS,
                         tool_choice={"type": "function", "function": {"name": "get_time"}}),
             openai_line("one", "weather?", tools=OPENAI_TOOLS, tool_choice="required", parallel_tool_calls=False),
             openai_line("shown", "no call", tools=OPENAI_TOOLS, tool_choice="none"),
             openai_line("auto", "maybe a call", tools=OPENAI_TOOLS),
             openai_line("missing", tools=OPENAI_TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}),
             openai_line("bad-params", tools=[{"type": "function", "function": {"name": "f", "parameters": []}}],
                         tool_choice="required")]
    summary, ok, bad = run_file(tmp_path, lines)
    answers = _completions(ok)
    # A request's own failure: its HTTP answer's error (400 for these).
    assert {x["response"]["status_code"] for x in bad} == {400}
    errors = {x["custom_id"]: ErrorObject.model_validate(x["response"]["body"]["error"], strict=True) for x in bad}
    assert sorted(answers) == ["named", "one", "required", "shown"]
    assert {k: e.code for k, e in errors.items()} == {"auto": "unsupported_value", "missing": "invalid_value",
                                                      "bad-params": "invalid_value"}
    assert "body.tools" in (errors["auto"].message or "") and "required" in (errors["auto"].message or "")
    assert "'nope'" in (errors["missing"].message or "") and "body.tool_choice" in (errors["missing"].message or "")
    assert "body.tools[0].function.parameters" in (errors["bad-params"].message or "")
    schemas = {"get_weather": WEATHER, "get_time": TIME}
    for cid in ("required", "named", "one"):
        choice = answers[cid].choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None, cid
        calls = choice.message.tool_calls
        assert calls and all(c.type == "function" and c.id.startswith("call_") for c in calls)
        for call in calls:
            assert _matches(json.loads(call.function.arguments), schemas[call.function.name])
    assert [c.function.name for c in answers["named"].choices[0].message.tool_calls or []] == ["get_time"]
    # tool_choice none: the tools are shown to the model, and the answer is text.
    shown = answers["shown"].choices[0]
    assert shown.message.tool_calls is None and shown.message.content and shown.finish_reason == "stop"
    assert summary["export"]["errors"] == 3


def test_tools_name_the_answer_and_a_reused_answer_keeps_its_calls(tmp_path: Path) -> None:
    lines = [openai_line("all", "same prompt", tools=OPENAI_TOOLS, tool_choice="required", temperature=0),
             openai_line("first", "same prompt", tools=OPENAI_TOOLS[:1], tool_choice="required", temperature=0),
             openai_line("serial", "same prompt", tools=OPENAI_TOOLS, tool_choice="required",
                         parallel_tool_calls=False, temperature=0),
             openai_line("named", "same prompt", tools=OPENAI_TOOLS,
                         tool_choice={"type": "function", "function": {"name": "get_weather"}}, temperature=0),
             openai_line("plain", "same prompt", temperature=0)]
    first, ok, _ = run_file(tmp_path, lines)
    answers = _completions(ok)
    assert first["export"]["reused"] == 0  # other tools or choice: another answer
    assert answers["plain"].choices[0].message.tool_calls is None
    again, ok2, _ = run_file(tmp_path, lines, "again.jsonl")
    reused = _completions(ok2)
    assert again["export"]["reused"] == 5
    assert reused["all"].choices[0].message.tool_calls and reused["named"].choices[0].message.tool_calls
    for cid in answers:  # the same calls; their ids are this other batch's own (issue 59)
        assert _without_ids(reused[cid].choices[0].model_dump()) == _without_ids(answers[cid].choices[0].model_dump())
        assert not {c.id for c in reused[cid].choices[0].message.tool_calls or []} & \
            {c.id for c in answers[cid].choices[0].message.tool_calls or []}


def _without_ids(choice: dict[str, Any]) -> dict[str, Any]:
    calls = choice["message"].get("tool_calls")
    return {**choice, "message": {**choice["message"], "tool_calls": calls and [
        {k: v for k, v in c.items() if k != "id"} for c in calls]}}


def test_anthropic_forced_tool_use(tmp_path: Path) -> None:
    from anthropic.types.messages import MessageBatchIndividualResponse

    lines = [anthropic_line("any", tools=ANTHROPIC_TOOLS, tool_choice={"type": "any"}),
             anthropic_line("tool", tools=ANTHROPIC_TOOLS, tool_choice={"type": "tool", "name": "get_weather"}),
             anthropic_line("auto", tools=ANTHROPIC_TOOLS),
             anthropic_line("no-schema", tools=[{"name": "t"}], tool_choice={"type": "any"}),
             anthropic_line("missing", tools=ANTHROPIC_TOOLS, tool_choice={"type": "tool", "name": "nope"})]
    _, ok, bad = run_file(tmp_path, lines)
    results = {r.custom_id: r.result for r in (MessageBatchIndividualResponse.model_validate(x, strict=True)
                                               for x in ok + bad)}
    for cid in ("any", "tool"):
        result = results[cid]
        assert result.type == "succeeded" and result.message.stop_reason == "tool_use", cid
        blocks = result.message.content
        assert blocks and all(b.type == "tool_use" and b.id.startswith("toolu_") for b in blocks)
        for b in blocks:
            assert b.type == "tool_use" and _matches(b.input, WEATHER if b.name == "get_weather" else TIME)
    tool = results["tool"]
    assert tool.type == "succeeded" and [b.name for b in tool.message.content if b.type == "tool_use"] == \
        ["get_weather"]
    for cid, field in (("auto", "params.tools"), ("no-schema", "params.tools[0].input_schema"),
                       ("missing", "params.tool_choice")):
        result = results[cid]
        assert result.type == "errored" and field in result.error.error.message, cid


class _ToolServer:
    """A stub OpenAI-compatible server that forces calls as vLLM's does: a body with
    ``tool_choice`` gets ``tool_calls`` back (its bodies are kept for the test)."""

    def __init__(self) -> None:
        from aiohttp import web

        from local_server import LocalServer

        self.bodies: list[dict[str, Any]] = []
        self.server = LocalServer([web.get("/v1/models", self.models), web.post("/v1/chat/completions", self.chat)])

    async def models(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response({"object": "list", "data": [{"id": "m", "root": "/models/x", "max_model_len": 512}]})

    async def chat(self, request: Any) -> Any:
        from aiohttp import web

        body = await request.json()
        self.bodies.append(body)
        choice = body.get("tool_choice")
        name = choice["function"]["name"] if isinstance(choice, dict) else body["tools"][0]["function"]["name"]
        args = '{"city": "Rome", "days": 2}'
        calls = [{"id": "chatcmpl-tool-9", "type": "function", "function": {"name": name, "arguments": args}}]
        message = {"role": "assistant", "content": None, "tool_calls": calls} if choice else \
            {"role": "assistant", "content": "plain"}
        return web.json_response({"model": "m", "choices": [{"index": 0, "message": message,
                                                             "finish_reason": "tool_calls" if choice else "stop"}],
                                  "usage": {"prompt_tokens": 9, "completion_tokens": 7}})


def test_the_server_client_sends_the_tools_and_reads_the_calls_back() -> None:
    from sparkbatch_dagster.engines.answers.extras import Extras
    from sparkbatch_dagster.engines.base import request_of
    from sparkbatch_dagster.engines.config import EngineSettings
    from sparkbatch_dagster.engines.server.vllm_server import VLLMServerEngine
    from sparkbatch_dagster.spec import OutputSpec, SamplingSpec
    from sparkbatch_dagster.spec.batch_prompt import request_prompt
    from sparkbatch_dagster.spec.batch_requests import parse_line

    stub = _ToolServer()
    try:
        bodies = {"named": {"tools": OPENAI_TOOLS, "tool_choice": {"type": "function",
                                                                    "function": {"name": "get_weather"}}},
                  "required": {"tools": OPENAI_TOOLS, "tool_choice": "required", "parallel_tool_calls": False}}
        reqs = []
        for cid, fields in bodies.items():
            line = parse_line(json.loads(openai_line(cid, cid, **fields)), "openai_batch", SamplingSpec())
            reqs.append(request_of(cid, request_prompt(line.request.to_text(), SamplingSpec())))
        cfg = EngineSettings(engine="server", model="m", endpoints=(stub.server.url,), max_retries=0)
        with VLLMServerEngine(cfg, stub.server.url, "m") as engine:
            out = {r.id: r for r in engine.generate(reqs, SamplingSpec(max_tokens=16), OutputSpec())}
    finally:
        stub.server.stop()
    sent = {b["messages"][-1]["content"]: b for b in stub.bodies}
    assert sent["named"]["tools"][0]["function"]["name"] == "get_weather"
    assert sent["named"]["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert sent["required"]["tool_choice"] == "required" and sent["required"]["parallel_tool_calls"] is False
    assert all("structured_outputs" not in b for b in stub.bodies)  # the server forces the call itself
    assert json.loads(out["named"].text or "") == {"city": "Rome", "days": 2}
    assert json.loads(out["required"].text or "") == [{"name": "get_weather", "parameters": {"city": "Rome",
                                                                                             "days": 2}}]
    for cid in bodies:
        (call,) = Extras.decode(out[cid].extra).tool_calls
        assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Rome", "days": 2}
