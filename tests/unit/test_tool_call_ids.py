"""Tool calls' ids and cut calls (issue 59): an id per call, named by the batch, the request, the
choice and the call's place (two requests with the same answer no longer share one, the same
batch written again keeps them); a forced call cut at ``max_tokens`` is OpenAI's ``length``
choice with the call as far as it went (Anthropic's ``max_tokens``), never the engine's internal
``[{"name": ...`` array as text. Every line parsed with the providers' own types, strictly."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from sparkbatch_dagster.engines.answers.extras import Extras
from sparkbatch_dagster.engines.answers.tools import cut_calls, forced_text, with_calls
from sparkbatch_dagster.run.batch_export import anthropic_line, openai_line
from sparkbatch_dagster.spec import SamplingSpec
from sparkbatch_dagster.spec.batch_requests import parse_line

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": CITY}},
         {"type": "function", "function": {"name": "g", "parameters": CITY}}]
ANSWER = '[{"name": "f", "parameters": {"city": "Paris"}}, {"name": "g", "parameters": {"city": "Oslo"}}]'


def _tools(choice: Any) -> Any:
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "tool_choice": choice}}
    return parse_line(line, "openai_batch", SamplingSpec()).request.tools


REQUIRED, NAMED = _tools("required"), _tools({"type": "function", "function": {"name": "f"}})


def _row(rid: str, text: str, cut: bool = False, tools: Any = REQUIRED) -> dict[str, Any]:
    return {"row_id": rid, "error": None, "truncated": cut, "finish_reason": "length" if cut else "stop",
            "output": text, "extra": with_calls(None, text, tools), "model": "m"}


def _openai_calls(row: dict[str, Any], job: str = "/batches/b1/home") -> Any:
    from openai.types.chat import ChatCompletion

    body = openai_line(row, "v1", 1, (3, 4), job).to_json()["response"]["body"]
    return ChatCompletion.model_validate(body, strict=True).choices[0]


def test_two_requests_with_the_same_answer_have_their_own_call_ids():
    a, b = _openai_calls(_row("a", ANSWER)), _openai_calls(_row("b", ANSWER))
    ids = [c.id for c in (a.message.tool_calls or []) + (b.message.tool_calls or [])]
    assert len(ids) == 4 and len(set(ids)) == 4 and all(i.startswith("call_") for i in ids)
    again = _openai_calls(_row("a", ANSWER))  # the same batch's results written again: the same ids
    assert [c.id for c in again.message.tool_calls or []] == ids[:2]
    other_batch = _openai_calls(_row("a", ANSWER), "/batches/b2/home")
    assert not {c.id for c in other_batch.message.tool_calls or []} & set(ids)
    blocks = anthropic_line(_row("a", ANSWER), "v1", (3, 4), "/batches/b1/home").to_json()["result"]["message"]
    assert [x["id"] for x in blocks["content"]] == ["toolu_" + i[len("call_"):] for i in ids[:2]]


def test_a_forced_call_cut_at_max_tokens_is_a_length_choice_with_the_call_so_far():
    from anthropic.types import Message

    cut = ANSWER[:-30]  # the second call's arguments cut
    choice = _openai_calls(_row("a", cut, cut=True))
    assert choice.finish_reason == "length" and choice.message.content is None
    calls = choice.message.tool_calls or []
    assert [c.function.name for c in calls] == ["f", "g"]  # type: ignore[union-attr]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}  # type: ignore[union-attr]
    assert ANSWER.startswith(cut) and calls[1].function.arguments in cut  # type: ignore[union-attr]
    named = _openai_calls(_row("a", '{"city": "Os', cut=True, tools=NAMED))
    assert named.finish_reason == "length" and named.message.tool_calls[0].function.arguments == '{"city": "Os'  # type: ignore[union-attr,index]
    message = anthropic_line(_row("a", cut, cut=True), "v1", (3, 4), "j").to_json()["result"]["message"]
    parsed = Message.model_validate(message, strict=True)
    assert parsed.stop_reason == "max_tokens"
    assert [(b.type, getattr(b, "input", None)) for b in parsed.content] == [("tool_use", {"city": "Paris"}),
                                                                            ("tool_use", {})]
    nothing = _openai_calls(_row("a", "[", cut=True))  # cut before any name: no call, no internal text
    assert nothing.finish_reason == "length" and nothing.message.content == "["


@given(st.integers(min_value=0, max_value=len(ANSWER)))
def test_every_cut_of_a_forced_array_reads_as_a_prefix_of_its_calls(at: int):
    """Wherever the answer is cut, the calls read are the whole answer's, the last one possibly
    cut: names equal, arguments a prefix (the oracle: the uncut answer's calls)."""
    whole = REQUIRED.calls(ANSWER)
    got = REQUIRED.calls(ANSWER[:at]) or cut_calls(ANSWER[:at], REQUIRED)
    assert len(got) <= len(whole)
    for (name, arguments), (whole_name, whole_arguments) in zip(got, whole, strict=False):
        assert name == whole_name
        assert whole_arguments.startswith(arguments) or json.loads(arguments) == json.loads(whole_arguments)


def test_a_servers_cut_call_is_read_as_far_as_it_went():
    calls = [{"function": {"name": "f", "arguments": '{"city": "Paris"}'}},
             {"function": {"name": "g", "arguments": '{"city": "Os'}}]
    text = forced_text(calls, REQUIRED)
    got = Extras.decode(with_calls(None, text, REQUIRED)).tool_calls
    assert [(c.name, c.arguments) for c in got] == [("f", '{"city": "Paris"}'), ("g", '{"city": "Os')]
