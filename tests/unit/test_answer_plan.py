"""engines/answers/plan.py: what one generate call decides for its requests, the one place both
backends ask (the labels' one step and its tally, the confidence scorer, the reasoning, and
what each request carries)."""

import pytest

from sparkbatch_dagster import OutputSpec, SamplingSpec
from sparkbatch_dagster.engines.answers import label_tokens
from sparkbatch_dagster.engines.answers import plan as answer_plan
from sparkbatch_dagster.engines.answers.plan import plan
from sparkbatch_dagster.engines.base import EngineRequest
from sparkbatch_dagster.engines.config import EngineSettings
from sparkbatch_dagster.errors import ConfigError
from sparkbatch_dagster.testing import QWEN3_STYLE_TEMPLATE

SENTIMENT = ["positive", "negative", "neutral"]
LABEL = OutputSpec(kind="label", labels=SENTIMENT)
GREEDY = SamplingSpec(max_tokens=8)
REQ = EngineRequest("r", [{"role": "user", "content": "x"}])


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from sparkbatch_dagster.engines.platform.model import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model(None))


def test_a_greedy_label_job_goes_in_one_step_scored_and_tallied(tokenizer):
    answers = plan(tokenizer, GREEDY, LABEL, cpu=True)
    assert answers.step is not None and answers.scorer is not None and answers.tally is not None
    assert answers.tally.max_asked_again == label_tokens.max_asked_again(cpu=True)
    assert answers.route(REQ, stepping=0) == "step" and answers.first("step") == answers.step.allowed
    assert answers.logprobs == answers.scorer.top
    # A batch file line's own settings: never the job's one step, nor its tally.
    own = EngineRequest("o", REQ.messages, sampling=SamplingSpec(max_tokens=3, temperature=0.5))
    assert answers.route(own, stepping=0) == "own" and not answers.tallied(own) and answers.tallied(REQ)
    assert answers.fields(own, "own", completions=False)["temperature"] == 0.5
    assert answers.fields(own, "own", completions=False)["max_tokens"] == 3


def test_settling_counts_in_the_tally(tokenizer):
    answers = plan(tokenizer, GREEDY, LABEL)
    assert answers.step is not None and answers.tally is not None
    token, label = next(iter(answers.step.labels.items()))
    assert answers.settle(token) == label and answers.settle_text(tokenizer.decode([token])) == label
    several = next(t for t in answers.step.allowed if t not in answers.step.labels)
    assert answers.settle(several) is None
    assert (answers.tally.settled, answers.tally.asked_again) == (2, 1)


def test_what_keeps_the_grammar(tokenizer):
    """Sampling with a temperature, label_decoding="grammar", or no tokenizer here (a chat server)."""
    for answers in (plan(tokenizer, SamplingSpec(max_tokens=8, temperature=0.7), LABEL),
                    plan(tokenizer, GREEDY, LABEL, EngineSettings(label_decoding="grammar")),
                    plan(None, GREEDY, LABEL)):
        assert answers.step is None and answers.tally is None and answers.route(REQ, stepping=0) == "grammar"
        body = answers.fields(REQ, "grammar", completions=False)
        assert body["structured_outputs"] == {"choice": SENTIMENT} and "allowed_token_ids" not in body


def test_a_reasoning_job_has_no_one_step_and_a_server_scores_none_of_it(tokenizer):
    thinker = type(tokenizer).from_pretrained(tokenizer.name_or_path)
    thinker.add_tokens(["<think>", "</think>"])
    thinker.chat_template = QWEN3_STYLE_TEMPLATE
    thinking = SamplingSpec(reasoning=16, max_tokens=64)
    offline, server = plan(thinker, thinking, LABEL), plan(thinker, thinking, LABEL, server=True)
    assert offline.thinking is not None and offline.step is None and offline.scorer is not None
    assert server.thinking is not None and server.scorer is None  # its log-probabilities cover the thinking
    assert server.fields(REQ, "grammar", completions=True)["thinking_token_budget"] == 16
    with pytest.raises(ConfigError, match="server_token_ids=True"):
        plan(None, SamplingSpec(reasoning="auto", max_tokens=2000), LABEL, server=True)


def test_a_sampling_setting_reaches_every_request_from_one_function(tokenizer, monkeypatch):
    """What the plan sends is sampling_fields' (SamplingParams offline reads the same function)."""
    base = answer_plan.sampling_fields
    monkeypatch.setattr(answer_plan, "sampling_fields",
                        lambda sampling, cpu=False, defaults=None: {**base(sampling, cpu, defaults), "stop": ["\n"]})
    answers = plan(tokenizer, GREEDY, LABEL, defaults={"repetition_penalty": 1.1})
    for route in ("step", "grammar", "own"):
        body = answers.fields(REQ, route, completions=True)
        assert body["stop"] == ["\n"] and body["repetition_penalty"] == 1.1 and body["temperature"] == 0
