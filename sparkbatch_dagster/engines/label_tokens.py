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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..spec import OutputSpec, SamplingSpec


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
    job decoded greedily (:func:`first_step`)."""
    if mode != "auto" or output.kind != "label" or sampling.temperature != 0 or sampling.ignore_eos:
        return None
    return first_step(tokenizer, output.labels)
