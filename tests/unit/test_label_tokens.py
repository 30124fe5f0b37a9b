"""Labels without the grammar where the first token settles them (``engines/answers/label_tokens.py``):
one decode step over every token the grammar's first step allows; a row whose token begins
several labels is asked again with the grammar. Checked with the embedded SmolLM2's own
tokenizer, then on the real engine (offline here, `vllm serve` in test_server_engine.py):
the same answers as the grammar's."""


import pytest

from sparkbatch_dagster import OutputSpec, SamplingSpec
from sparkbatch_dagster.engines.answers.label_tokens import Tally, first_step, max_asked_again, plan
from sparkbatch_dagster.engines.answers.plan import plan as answer_plan
from sparkbatch_dagster.engines.base import EngineRequest
from sparkbatch_dagster.engines.server.server_bodies import grammar_body

SENTIMENT = ["positive", "negative", "neutral"]
#: Debian sections whose first tokens begin other sections too ("lib", "de", "java").
SECTIONS = ["libs", "libdevel", "devel", "doc", "java", "javascript", "python", "net"]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from sparkbatch_dagster.engines.platform.model import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model(None))


def _token(tokenizer, text):
    [token] = tokenizer(text, add_special_tokens=False)["input_ids"]
    return token


def test_the_step_allows_what_the_grammar_allows_and_settles_single_label_tokens(tokenizer):
    step = first_step(tokenizer, SENTIMENT)
    assert step is not None
    for token in step.allowed:  # every token that begins a label, and nothing else
        assert any(label.startswith(tokenizer.decode([token])) for label in SENTIMENT)
    assert len(step.allowed) == sum(1 for t in range(len(tokenizer))
                                    if (text := tokenizer.decode([t])) and any(x.startswith(text) for x in SENTIMENT))
    assert step.label(_token(tokenizer, "pos")) == "positive" and step.label(_token(tokenizer, "neut")) == "neutral"
    assert _token(tokenizer, "ne") in step.allowed and step.label(_token(tokenizer, "ne")) is None  # two labels


def test_labels_that_share_first_tokens_leave_those_to_the_grammar(tokenizer):
    step = first_step(tokenizer, SECTIONS)
    assert step is not None
    assert step.label(_token(tokenizer, "lib")) is None  # libs or libdevel
    assert step.label(_token(tokenizer, "java")) is None  # java or javascript
    assert step.label(_token(tokenizer, "python")) == "python"


def test_only_greedy_ascii_label_jobs_in_auto_mode_take_the_step(tokenizer):
    label = OutputSpec(kind="label", labels=SENTIMENT)
    greedy = SamplingSpec(max_tokens=8)
    assert plan(tokenizer, greedy, label, "auto")
    assert plan(tokenizer, greedy, label, "grammar") is None
    assert plan(tokenizer, SamplingSpec(max_tokens=8, temperature=0.7), label, "auto") is None
    assert plan(tokenizer, SamplingSpec(max_tokens=8, ignore_eos=True), label, "auto") is None
    assert plan(tokenizer, greedy, OutputSpec(kind="json", json_schema={"type": "object"}), "auto") is None
    assert plan(tokenizer, greedy, OutputSpec(kind="label", labels=["été", "hiver"]), "auto") is None


def test_labels_no_first_token_can_settle_go_to_the_grammar_at_once(tokenizer):
    """Labels that share their first tokens ("category-..."): one step could only ever be asked
    again, so it is never sent."""
    shared = ["category-alpha", "category-beta"]
    assert first_step(tokenizer, shared) is not None and not first_step(tokenizer, shared).labels
    assert plan(tokenizer, SamplingSpec(max_tokens=8), OutputSpec(kind="label", labels=shared), "auto") is None


def test_the_probe_goes_in_one_step_and_its_answers_route_the_rest():
    tally = Tally(probe=4, max_asked_again=0.25)
    assert [tally.route(in_flight=n) for n in range(4)] == ["step"] * 4
    assert tally.route(in_flight=4) is None  # held until the probe's answers are in
    for settled in (True, True, False):
        tally.record(settled)
    assert tally.route(in_flight=1) is None and not tally.decided()
    assert tally.route(in_flight=0) == "step"  # never held with nothing in flight
    tally.record(True)
    assert tally.decided() and tally.route(in_flight=0) == "step"  # 1 of 4 asked again: the step pays
    tally.record(False)
    assert tally.route(in_flight=0) == "grammar"  # 2 of 5: the rest straight to the grammar
    assert "2 of 5 answers" in tally.summary() and "the grammar directly" in tally.summary()


def test_a_probe_mostly_asked_again_sends_the_rest_to_the_grammar():
    tally = Tally(probe=3)
    assert tally.route(in_flight=0) == "step"
    tally.record(settled=False)
    assert tally.route(in_flight=0) == "grammar"  # 1 of 3 is past 10% already: the probe need not go on


def test_the_probe_decides_for_the_grammar_as_soon_as_too_many_were_asked_again():
    """4 of 32 may not be asked again at 10%: the 4th decides, and the rows held meanwhile go on."""
    tally = Tally(probe=32, max_asked_again=0.1)
    assert tally.route(in_flight=31) == "step" and tally.route(in_flight=32) is None
    for settled in (False, True, False, False):
        tally.record(settled)
    assert tally.route(in_flight=28) is None and not tally.decided()  # 3 of 32 would still pay
    tally.record(settled=False)
    assert tally.decided() and tally.route(in_flight=27) == "grammar"
    assert "4 of 5 answers" in tally.summary()


def test_a_gpu_keeps_the_step_at_a_share_asked_again_the_cpu_sends_to_the_grammar():
    """The step's break-even is the platform's: 5 of 20 asked again (25%) is past the CPU's, not a GPU's."""
    cpu, gpu = Tally(probe=20, max_asked_again=max_asked_again(cpu=True)), Tally(20, max_asked_again(cpu=False))
    for tally in (cpu, gpu):
        for i in range(20):
            tally.record(settled=i >= 5)
    assert cpu.route(in_flight=0) == "grammar" and gpu.route(in_flight=0) == "step"


def test_a_server_request_asks_for_one_step_and_again_with_the_grammar(tokenizer):
    label = OutputSpec(kind="label", labels=SENTIMENT)
    sampling = SamplingSpec(max_tokens=8)
    answers, req = answer_plan(tokenizer, sampling, label), EngineRequest("r", [{"role": "user", "content": "x"}])
    assert answers.step is not None and answers.planned(req) == "step"
    body = answers.fields(req, "step", completions=True)
    assert body["max_tokens"] == 1 and body["allowed_token_ids"] == sorted(answers.step.allowed)
    assert "structured_outputs" not in body
    grammar = answers.fields(req, "grammar", completions=True)
    assert grammar["structured_outputs"] == {"choice": SENTIMENT} and "allowed_token_ids" not in grammar
    assert grammar_body(body, sampling, label) == grammar
