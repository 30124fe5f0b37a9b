"""The request fields a migrating team's batch files set on nearly every line (issue 51), run on
the fake engine through the whole job: ``stop``, ``n``, ``logprobs`` / ``top_logprobs``,
penalties, ``logit_bias``, ``seed``; Anthropic's ``stop_sequences`` and ``top_k``. Every result
line is parsed with the providers' own types in strict mode; a cut JSON answer is a 200 with
``finish_reason: "length"``; each field counts in the answer's identity, and a reused answer
brings its choices and log-probabilities back. The same on the real engine:
tests/real/test_real_batch_fields.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from batch_jobs import run_file

URL = "/v1/chat/completions"


def openai_line(cid: str, content: str = "hello", **body: Any) -> str:
    return json.dumps({"custom_id": cid, "method": "POST", "url": URL,
                       "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": content}], **body}})


def _completions(ok: list[dict[str, Any]]) -> dict[str, Any]:
    from openai.types.chat import ChatCompletion

    return {x["custom_id"]: ChatCompletion.model_validate(x["response"]["body"], strict=True) for x in ok}


PAIR = {"type": "json_schema", "json_schema": {"name": "pair", "schema": {
    "type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}}}}}
MIXED = [
    openai_line("stop", "stop here", stop=["-"]),
    openai_line("stop-str", "a stop string", stop="-"),
    openai_line("n3", "three answers", n=3, temperature=0.9, seed=7),
    openai_line("lp", "token by token", logprobs=True, top_logprobs=2),
    openai_line("lp0", "token by token", logprobs=True),
    openai_line("pen", "penalties", presence_penalty=0.5, frequency_penalty=-0.5, logit_bias={"50256": -100}),
    openai_line("cut", "json please", max_tokens=1, response_format=PAIR),
    openai_line("plain", "nothing special", n=1, stop=None, logprobs=False, tool_choice="none"),
    openai_line("tools", tools=[{"type": "function", "function": {"name": "f"}}]),
    openai_line("effort", reasoning_effort="high"),
    openai_line("top-alone", top_logprobs=2),
    openai_line("too-many-stops", stop=["a", "b", "c", "d", "e"]),
]


def test_openai_fields_are_honoured_per_line_and_parse_strictly(tmp_path: Path) -> None:
    from openai.types.shared import ErrorObject

    summary, ok, bad = run_file(tmp_path, MIXED)
    answers = _completions(ok)
    assert all(x["error"] is None and x["response"]["status_code"] == 400 for x in bad)
    errors = {x["custom_id"]: ErrorObject.model_validate(x["response"]["body"]["error"], strict=True) for x in bad}
    assert sorted(answers) == ["cut", "lp", "lp0", "n3", "pen", "plain", "stop", "stop-str"]
    assert {k: e.code for k, e in errors.items()} == {"tools": "unsupported_value", "effort": "unsupported_value",
                                                      "top-alone": "invalid_value", "too-many-stops": "invalid_value"}
    assert {k: e.param for k, e in errors.items()} == {"tools": "tools", "effort": "reasoning_effort",
                                                       "top-alone": "top_logprobs", "too-many-stops": "stop"}
    assert "body.tools" in (errors["tools"].message or "") and "reasoning_effort" in (errors["effort"].message or "")
    # The fake model answers "answer-<n>": a stop string "-" ends it before the dash.
    assert answers["stop"].choices[0].message.content == "answer" == answers["stop-str"].choices[0].message.content
    assert answers["stop"].choices[0].finish_reason == "stop"
    n3 = answers["n3"].choices
    assert [c.index for c in n3] == [0, 1, 2] and len({c.message.content for c in n3}) == 3
    assert answers["n3"].usage is not None and answers["n3"].usage.completion_tokens == 3  # every choice's tokens
    lp = answers["lp"].choices[0].logprobs
    assert lp is not None and lp.content and all(len(t.top_logprobs) == 2 for t in lp.content)
    assert lp.content[0].token == answers["lp"].choices[0].message.content
    assert lp.content[0].bytes == list(lp.content[0].token.encode())
    lp0 = answers["lp0"].choices[0].logprobs
    assert lp0 is not None and lp0.content and lp0.content[0].top_logprobs == []
    assert answers["plain"].choices[0].logprobs is None and len(answers["plain"].choices) == 1
    # A JSON answer cut at the line's max_tokens: 200, finish_reason "length", its text as far as it got.
    cut = answers["cut"].choices[0]
    assert cut.finish_reason == "length" and cut.message.content
    assert summary["export"]["complete"] and summary["export"]["errors"] == 4


def test_each_field_names_the_answer_and_a_reused_answer_keeps_its_extras(tmp_path: Path) -> None:
    # Seeded, or at temperature 0: an unseeded sample is never reused (issue 59).
    lines = [openai_line("n2", "same prompt", n=2, temperature=0.5, seed=7),
             openai_line("n1", "same prompt", temperature=0.5, seed=7),
             openai_line("lp", "same prompt", temperature=0.5, seed=7, logprobs=True, top_logprobs=1),
             openai_line("st", "same prompt", temperature=0.5, seed=7, stop=["x"]),
             openai_line("cut", "same prompt", max_tokens=1, response_format=PAIR, temperature=0)]
    first, ok, _ = run_file(tmp_path, lines)
    answers = _completions(ok)
    assert first["export"]["reused"] == 0  # five settings: five answers, none shared
    assert answers["cut"].choices[0].finish_reason == "length"
    assert len(answers["n2"].choices) == 2 and len(answers["n1"].choices) == 1
    # The same file again, as another job: every answer from the shared store, extras included.
    again, ok2, _ = run_file(tmp_path, lines, "again.jsonl")
    reused = _completions(ok2)
    # A cut answer too: the same prompt under the same settings is cut the same, so it is kept with its mark.
    assert again["export"]["reused"] == 5 and again["export"]["output_tokens"] == 0
    for cid in answers:
        assert [c.model_dump() for c in reused[cid].choices] == [c.model_dump() for c in answers[cid].choices]


def test_anthropic_stop_sequences_and_top_k(tmp_path: Path) -> None:
    from anthropic.types.messages import MessageBatchIndividualResponse

    def line(cid: str, **params: Any) -> str:
        return json.dumps({"custom_id": cid, "params": {"model": "claude-x", "max_tokens": 16,
                                                        "messages": [{"role": "user", "content": cid}], **params}})

    lines = [line("seq", stop_sequences=["-"]), line("topk", top_k=5, temperature=0.5),
             line("off", thinking={"type": "disabled"}, tool_choice={"type": "none"}),
             line("think", thinking={"type": "enabled", "budget_tokens": 1024}), line("zero-k", top_k=0)]
    _, ok, bad = run_file(tmp_path, lines)
    results = {r.custom_id: r.result for r in (MessageBatchIndividualResponse.model_validate(x, strict=True)
                                               for x in ok + bad)}
    seq = results["seq"]
    assert seq.type == "succeeded" and seq.message.stop_reason == "stop_sequence" and seq.message.stop_sequence == "-"
    assert results["topk"].type == "succeeded" and results["topk"].message.stop_reason == "end_turn"
    assert results["off"].type == "succeeded"
    assert results["think"].type == "errored" and "params.thinking" in results["think"].error.error.message
    assert results["zero-k"].type == "errored" and "params.top_k" in results["zero-k"].error.error.message
