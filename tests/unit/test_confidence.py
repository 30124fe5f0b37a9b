"""An answer's confidence from log-probabilities (``engines/answers/confidence.py``): the arithmetic,
on steps written out by hand. The real engines' confidences are checked in
test_confidence_real.py."""

import math

import pytest

from sparkbatch_dagster import OutputSpec
from sparkbatch_dagster.engines.answers import confidence
from sparkbatch_dagster.engines.answers.confidence import (
    answer_confidence,
    json_confidence,
    label_confidence,
    openai_steps,
    settles_by_text,
    value_spans,
)

LABELS = {1: "positive", 2: "negative", 3: "neutral", 4: "positive"}  # token 4: another spelling of positive
ln = math.log


def test_a_one_step_label_is_its_share_of_every_way_to_begin_a_label():
    # 0.6 "pos", 0.1 "posit" (also positive), 0.2 "neg", 0.1 "neut", renormalized over the step.
    top = {1: ln(0.6), 4: ln(0.1), 2: ln(0.2), 3: ln(0.1)}
    assert label_confidence("positive", [(1, top)], LABELS.get) == pytest.approx(0.7)
    assert label_confidence("negative", [(2, top)], LABELS.get) == pytest.approx(0.2)
    # Raw figures (someone else's server): tokens the step did not allow are left out of the sum.
    raw = {1: ln(0.3), 2: ln(0.1), 9: ln(0.5)}
    assert label_confidence("positive", [(1, raw)], LABELS.get, first_allowed={1, 2}.__contains__) \
        == pytest.approx(0.75)


def test_a_label_through_a_shared_first_token_is_its_path_probability():
    # "ne" (token 5) begins negative and neutral: 0.8 at step one, then "g" 0.25 vs "ut" 0.75.
    settles = {1: "positive", 5: None}.get
    steps = [(5, {5: ln(0.8), 1: ln(0.2)}), (7, {7: ln(0.25), 8: ln(0.75)}), (0, {0: 0.0})]
    assert label_confidence("negative", steps, settles) == pytest.approx(0.8 * 0.25)


def test_steps_without_the_taken_token_give_no_confidence():
    assert label_confidence("positive", [(1, {2: ln(0.5)})], LABELS.get) is None
    assert label_confidence("positive", [], LABELS.get) is None


def test_json_confidence_is_the_least_sure_value_token():
    pieces = ['{"', "name", '":', ' "', "Ada", '",', ' "age', '":', " 3", "6", "}"]
    lps = [0.0, ln(0.5), 0.0, ln(0.9), ln(0.7), 0.0, ln(0.1), 0.0, ln(0.8), ln(0.6), 0.0]
    # "name" (0.5) and "age" (0.1) are keys, left out: the least sure value token is "6".
    assert json_confidence(pieces, lps) == pytest.approx(0.6)
    assert json_confidence(["{", "}"], [0.0, 0.0]) is None


def test_value_spans_tell_keys_from_values():
    text = '{"a": "x\\"y", "b": [1, -2.5e3, true, null], "c": {"d": false}}'
    values = [text[s:e] for s, e in value_spans(text)]
    assert values == ['"x\\"y"', "1", "-2.5e3", "true", "null", "false"]
    cut = '{"a": "cut off'
    assert [cut[s:e] for s, e in value_spans(cut)] == ['"cut off']


def test_a_servers_logprobs_read_the_same_as_the_engines():
    top = [{"token": t, "logprob": ln(p)} for t, p in (("pos", 0.6), ("neg", 0.3), ("ne", 0.1))]
    chat = {"content": [{"token": "pos", "logprob": ln(0.6), "top_logprobs": top}]}
    steps, pieces = openai_steps(chat)
    settles = settles_by_text(["positive", "negative", "neutral"])
    assert pieces == ["pos"] and settles("ne") is None and settles("neg") == "negative"
    assert label_confidence("positive", steps, settles) == pytest.approx(0.6)
    completion = {"tokens": ["token_id:1", "token_id:0"], "token_logprobs": [ln(0.6), 0.0],
                  "top_logprobs": [{"token_id:1": ln(0.6), "token_id:2": ln(0.4)}, {"token_id:0": 0.0}]}
    steps, _ = openai_steps(completion)
    assert steps[0] == (1, {1: ln(0.6), 2: ln(0.4)})
    assert answer_confidence("label", "positive", steps, [], LABELS.get) == pytest.approx(0.6)


def test_what_each_output_kind_asks_for():
    assert confidence.logprobs_wanted("label") == confidence.LABEL_TOP
    assert confidence.logprobs_wanted("json") == 0 and confidence.logprobs_wanted("text") is None
    scorer = confidence.Scorer(OutputSpec(kind="label", labels=["yes", "no"]))
    assert scorer.fields(completions=False) == {"logprobs": True, "top_logprobs": confidence.LABEL_TOP}
    assert scorer.fields(completions=True)["return_tokens_as_token_ids"] is True


def test_once_the_text_can_only_become_the_label_later_steps_do_not_count():
    labels = ["devel", "doc"]
    # "de" is not in the first-step table here (say, a chat server's text keys were not matched),
    # then "v" 0.6 / "vel" 0.4: either way devel, so the answer is as sure as its first step.
    steps = [(5, {5: ln(0.9), 6: ln(0.1)}), (7, {7: ln(0.6), 8: ln(0.4)}), (9, {9: 0.0})]
    settles = {6: "doc"}.get
    assert label_confidence("devel", steps, settles, pieces=["de", "v", "el"], labels=labels) == pytest.approx(0.9)
    assert label_confidence("devel", steps, settles) == pytest.approx(0.9 * 0.6)  # no texts: the path alone
