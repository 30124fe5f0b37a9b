"""The tests of tests/unit/test_label_tokens.py on the real vLLM engine; that file says what they cover."""

import contextlib
import re
from unittest import mock

import pytest

from sparkbatch_dagster import OutputSpec, SamplingSpec
from sparkbatch_dagster.engines import EngineRequest
from sparkbatch_dagster.engines.answers import label_tokens
from testkit import exact_numerics
from unit.test_label_tokens import SECTIONS, SENTIMENT

REVIEWS = ["I loved it, best purchase ever", "Terrible, it broke in a day", "It is a box. It holds things.",
           "Absolutely wonderful service", "Worst film I have seen", "The meeting is at noon",
           "What a fantastic surprise", "I want my money back", "The train leaves at six"]


PACKAGES = ["libssl3: SSL shared libraries", "libssl-dev: SSL development files", "gcc: the GNU C compiler",
            "python3-numpy: array computing for Python", "openjdk-17-jre: Java runtime", "node-lodash: JavaScript "
            "utilities", "curl: command line tool for transferring data with URL syntax", "debian-policy: Debian "
            "policy manual"]


def _answers(engine, mode, labels=SENTIMENT, texts=None):
    settings = engine.settings
    engine.settings = settings.model_copy(update={"label_decoding": mode})  # the engine's own, for this call
    texts = texts or (REVIEWS if labels == SENTIMENT else PACKAGES)
    system = f"Answer with one of: {', '.join(labels)}."
    reqs = [EngineRequest(str(i), [{"role": "system", "content": system}, {"role": "user", "content": text}])
            for i, text in enumerate(texts)]
    try:
        out = list(engine.generate(reqs, SamplingSpec(max_tokens=8), OutputSpec(kind="label", labels=labels)))
    finally:
        engine.settings = settings
    return {r.id: r for r in out}


@pytest.mark.parametrize("labels", [SENTIMENT, SECTIONS])
def test_the_real_engine_answers_as_the_grammar_does(real_engine, labels):
    fast, grammar = _answers(real_engine, "auto", labels), _answers(real_engine, "grammar", labels)
    assert {k: r.text for k, r in fast.items()} == {k: r.text for k, r in grammar.items()}
    assert all(r.text in labels and r.finish_reason == "stop" for r in fast.values())
    # Settled in one step, or that step plus the grammar's tokens (in bf16 the grammar may spell a
    # label in other tokens when batched otherwise: exact_numerics).
    again = {k: r.output_tokens for k, r in fast.items() if r.output_tokens != 1}
    assert all(n == grammar[k].output_tokens + 1 if exact_numerics() else n >= 2 for k, n in again.items())


#: Labels whose likely first token ("very") begins two of them: most one-step answers are asked again.
VERY = ["very-positive", "very-negative", "neutral"]


def probed(engine, probe, **settings):
    """The engine's answers to REVIEWS over VERY with a probe of ``probe`` rows (and ``settings``
    set on the engine meanwhile), and the grammar's."""
    on_engine = mock.patch.multiple(engine, **settings) if settings else contextlib.nullcontext()
    with mock.patch.object(label_tokens, "PROBE", probe), on_engine:
        fast = _answers(engine, "auto", VERY, REVIEWS)
    return fast, _answers(engine, "grammar", VERY, REVIEWS)


def check_probed(fast, grammar, probe, log):
    """The grammar's answers; the probe's rows mostly asked again, so the rest went to the grammar
    directly: the tally counted the probe's one-step answers and no more, and where numerics are
    exact the token counts agree (a row asked again: one step more than the grammar's tokens)."""
    assert {k: r.text for k, r in fast.items()} == {k: r.text for k, r in grammar.items()}
    said = re.search(r"labels in one step: (\d+) of (\d+) answers", log)
    assert said and int(said[1]) >= 2 and int(said[2]) == probe, log
    assert "the rest went to the grammar directly" in log
    if exact_numerics():
        again = [k for k, r in fast.items() if int(k) < probe and r.output_tokens == grammar[k].output_tokens + 1]
        assert len(again) >= 2, {k: (r.text, r.output_tokens) for k, r in fast.items()}
        assert all(fast[k].output_tokens == grammar[k].output_tokens for k in fast if int(k) >= probe)


def test_the_real_engine_sends_the_rest_to_the_grammar_when_the_probe_is_mostly_asked_again(real_engine, caplog):
    """A batch of 3 (max_num_seqs): the probe's 3 rows fill it, so the rest wait for its answers."""
    with caplog.at_level("INFO", logger="sparkbatch"):
        fast, grammar = probed(real_engine, 3, max_num_seqs=3)
    check_probed(fast, grammar, 3, caplog.text)
