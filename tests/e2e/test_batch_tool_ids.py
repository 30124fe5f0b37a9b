"""Tool calls through a whole batch-file job on the fake engine (issue 59): two requests with the
same forced call (one generation, the second a duplicate) get ids of their own, and a forced call
cut at ``max_tokens`` comes back as OpenAI's ``length`` choice with the call so far (Anthropic's
``max_tokens``), every line parsed with the providers' own types in strict mode."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from batch_jobs import run_file

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
           "required": ["city", "days"]}
OPENAI_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
ANTHROPIC_TOOLS = [{"name": "get_weather", "input_schema": WEATHER}]


def openai_line(cid: str, content: str, **body: Any) -> str:
    return json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": content}], **body}})


def anthropic_line(cid: str, **params: Any) -> str:
    return json.dumps({"custom_id": cid, "params": {"model": "claude-x", "max_tokens": 64,
                                                    "messages": [{"role": "user", "content": "weather?"}], **params}})


def test_the_same_forced_call_of_two_requests_has_two_ids_and_a_cut_one_is_a_length_choice(tmp_path: Path):
    from openai.types.chat import ChatCompletion

    named = {"type": "function", "function": {"name": "get_weather"}}
    lines = [openai_line(cid, "weather in Paris?", tools=OPENAI_TOOLS, tool_choice="required") for cid in "ab"]
    lines.append(openai_line("cut", "weather in Oslo?", tools=OPENAI_TOOLS, tool_choice=named, max_tokens=3))
    _, ok, bad = run_file(tmp_path, lines)
    assert not bad
    bodies = {x["custom_id"]: ChatCompletion.model_validate(x["response"]["body"], strict=True) for x in ok}
    calls = {cid: bodies[cid].choices[0].message.tool_calls or [] for cid in "ab"}
    assert [c.function.arguments for c in calls["a"]] == [c.function.arguments for c in calls["b"]]  # type: ignore[union-attr]
    ids = [c.id for cid in "ab" for c in calls[cid]]
    assert ids and len(set(ids)) == len(ids)
    cut = bodies["cut"].choices[0]
    assert cut.finish_reason == "length" and cut.message.content is None
    assert [c.function.name for c in cut.message.tool_calls or []] == ["get_weather"]  # type: ignore[union-attr]
    _, again, _ = run_file(tmp_path, lines)  # the same batch again (its answers reused): the same ids
    redone = {x["custom_id"]: x for x in again}
    assert [c["id"] for cid in "ab" for c in redone[cid]["response"]["body"]["choices"][0]["message"]["tool_calls"]] \
        == ids


def test_an_anthropic_tool_use_cut_at_max_tokens_stops_at_max_tokens(tmp_path: Path):
    from anthropic.types import Message

    choice = {"type": "tool", "name": "get_weather"}
    lines = [anthropic_line(cid, tools=ANTHROPIC_TOOLS, tool_choice=choice) for cid in ("x", "y")]
    lines.append(anthropic_line("cut", tools=ANTHROPIC_TOOLS, tool_choice=choice, max_tokens=3))
    _, results, _ = run_file(tmp_path, lines)
    messages = {x["custom_id"]: Message.model_validate(x["result"]["message"], strict=True) for x in results}
    assert messages["cut"].stop_reason == "max_tokens" and messages["x"].stop_reason == "tool_use"
    assert [b.type for b in messages["cut"].content] == ["tool_use"]
    ids = [b.id for cid in ("x", "y") for b in messages[cid].content if b.type == "tool_use"]
    assert len(ids) == 2 and len(set(ids)) == 2
