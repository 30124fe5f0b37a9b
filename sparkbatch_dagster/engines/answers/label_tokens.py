"""Labels decoded in one step where the first token settles them, the grammar where it does not.

A label job's answer is one of a few labels. With vLLM's choice grammar each answer costs a
decode step per token of the label plus the grammar's work on every step (about 12% of a
prefill-bound 40,000-row labeling run on an H200). Greedy decoding under the grammar picks, at
its first step, the most likely token that begins some label; when that token begins only one
label, the rest of the answer is forced. So one step with exactly those tokens allowed
(``allowed_token_ids``, max_tokens 1) gives the grammar's answer whenever the token it picks
begins one label only; a row whose token begins several ("ne": negative or neutral) is asked
again with the grammar, which picks the same first token and goes on. Same answers, greedy
decoding assumed (with a temperature one step and the grammar's paths draw differently, so
such jobs keep the grammar, as do labels outside ASCII, whose first bytes may be split across
tokens). ``VLLMResource.label_decoding="grammar"`` keeps the grammar always.

A row asked again pays for a grammar request on top of its step, so the step pays only where
few rows are asked again, and how few depends on the platform: on a 2-core CPU (measured: 8% asked
again ran 1.03x faster than the grammar, 66% 0.66x) break-even is near 11%, while on a GPU the
grammar's decode steps cost far more than a step (2.06x on an H200) and a row asked again
reuses its prompt's cached blocks. A generate call therefore sends its first ``PROBE`` label rows
in one step and holds the rest until they are answered (:class:`Tally`; the offline engine fills
its running batch with grammar rows meanwhile): while at most the platform's share
(:func:`max_asked_again`) of the one-step answers were asked again the rest go in one step too,
else straight to the grammar (at once when more of the probe were asked again than its share
allows). Either way every answer is the grammar's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...spec import OutputSpec, SamplingSpec

log = logging.getLogger("sparkbatch")


@dataclass(frozen=True)
class FirstStep:
    """The grammar's first step over a label set: every token it allows, and the label of each
    that begins exactly one label (the others need the grammar's next steps)."""

    allowed: tuple[int, ...]
    labels: Mapping[int, str]

    def label(self, token: int) -> str | None:
        """The label ``token`` settles; None when it begins several labels."""
        return self.labels.get(token)


def first_step(tokenizer: Any, labels: Sequence[str]) -> FirstStep | None:
    """The first step of ``labels`` in ``tokenizer``'s vocabulary (decoded once per engine and
    label set), or None for labels outside ASCII. Example::

        step = first_step(tok, ["positive", "negative", "neutral"])
        step.label(tok.encode("pos")[0]) == "positive"; step.label(tok.encode("ne")[0]) is None
    """
    if not all(label.isascii() for label in labels):
        return None
    key = (id(tokenizer), tuple(labels))
    if key not in _STEPS:
        texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
        begins = {i: [label for label in labels if label.startswith(text)] for i, text in enumerate(texts) if text}
        allowed = tuple(sorted(i for i, found in begins.items() if found))
        _STEPS[key] = FirstStep(allowed, {i: found[0] for i, found in begins.items() if len(found) == 1})
    return _STEPS[key]


#: (tokenizer, labels) -> their first step: a vocabulary's worth of decoding, done once.
_STEPS: dict[tuple[int, tuple[str, ...]], FirstStep] = {}


def plan(tokenizer: Any, sampling: SamplingSpec, output: OutputSpec, mode: str) -> FirstStep | None:
    """The first step a request decodes in, or None for the grammar: ``mode`` "auto" on a label
    job decoded greedily (:func:`first_step`) whose first step can settle a label at all."""
    if mode != "auto" or output.kind != "label" or sampling.temperature != 0 or sampling.ignore_eos:
        return None
    step = first_step(tokenizer, output.labels)
    return step if step is not None and step.labels else None


#: Label rows a generate call sends in one step before their answers decide how the rest go.
PROBE = 32
#: The largest share of one-step answers asked again with which the rest still go in one step,
#: on the CPU backend (its break-even, measured) and on a GPU (derived from the grammar's measured
#: 2.06x there, docs/engine.md: random weights ask no row again, so no GPU run has tested it).
MAX_ASKED_AGAIN = 0.1
MAX_ASKED_AGAIN_GPU = 0.3


def max_asked_again(cpu: bool) -> float:
    """The share of one-step answers asked again up to which the step pays, on the CPU backend or
    a GPU: ``Tally(max_asked_again=max_asked_again(settings.on_cpu()))``."""
    return MAX_ASKED_AGAIN if cpu else MAX_ASKED_AGAIN_GPU


class Tally:
    """How one generate call's label rows go: in one step while few need the grammar after it.

    ``route`` is asked before each label row is sent, with the one-step rows still in flight::

        tally = Tally(probe=32)
        tally.route(in_flight=0)      # "step": the probe's rows go in one step
        tally.route(in_flight=32)     # None: hold the row until the probe's answers are in
        tally.record(settled=False)   # an answer whose token began several labels (asked again)
        tally.route(in_flight=0)      # "step" or "grammar", by the share asked again
    """

    def __init__(self, probe: int = PROBE, max_asked_again: float = MAX_ASKED_AGAIN) -> None:
        self.probe, self.max_asked_again = probe, max_asked_again
        self.settled = 0
        self.asked_again = 0

    def record(self, settled: bool) -> None:
        """A one-step answer: it settled its label, or was asked again with the grammar."""
        if settled:
            self.settled += 1
        else:
            self.asked_again += 1

    def route(self, in_flight: int) -> str | None:
        """How the next label row goes: ``"step"``, ``"grammar"``, or None to hold it while the
        probe's ``in_flight`` one-step rows are answered (never None with none in flight)."""
        answered = self.answered
        if self.decided():
            return "step" if self.asked_again <= self.max_asked_again * answered else "grammar"
        return "step" if answered + in_flight < self.probe or not in_flight else None

    @property
    def answered(self) -> int:
        """One-step answers so far."""
        return self.settled + self.asked_again

    def decided(self) -> bool:
        """Whether the route is the share's, not the probe's: its answers are all in, or already
        more of them were asked again than the whole probe may have (the held rows need not wait)."""
        return self.answered >= self.probe or self.asked_again > self.max_asked_again * self.probe

    def report(self) -> None:
        """At a generate call's end: what the step settled and where the rest went, in the log
        (once the probe decided; a call of a few rows says nothing)."""
        if self.decided():
            log.info(self.summary())

    def summary(self) -> str:
        """What the step settled, and where the rest went."""
        answered = self.answered
        share = self.asked_again / answered if answered else 0.0
        where = "one step" if self.route(0) == "step" else "the grammar directly"
        return (f"labels in one step: {self.asked_again} of {answered} answers began several labels and were "
                f"asked again with the grammar ({share:.0%}; the step pays up to {self.max_asked_again:.0%}): "
                f"the rest went to {where}")
