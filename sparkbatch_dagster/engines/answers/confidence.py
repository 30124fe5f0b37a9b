"""How sure the model was of its answer, from the log-probabilities the engine returns.

**A label** (``kind: label``): the probability the model gave its label among the declared
labels. Decoding a label is a walk over tokens that keep the answer a label (the choice
grammar, or the one step of ``label_tokens``); at each step the engine's distribution is
renormalized over the tokens it may take there, and the label's probability is that of its
path: ``p(t1) * p(t2 | t1) * ...``. The first step also counts every other first token that can
only become the same label ("pos" and "positive" both mean ``positive``), so a label the model
spells two ways is not marked unsure. What is left out is only what the top log-probabilities
(``LABEL_TOP`` a step) do not show, and a path through a token that begins several labels
other than the one answered: the figure is a lower bound, exact when each label has one
spelling the model uses.

**A JSON answer** (``kind: json``): the lowest probability the model gave any token inside a
value (strings, numbers, literals; keys and punctuation, which the schema's grammar mostly
forces, are left out). One unsure value makes the row unsure, which is what a reviewer needs.

**Free text**: none (there is no set of answers to be sure among).

Engines started here run vLLM with ``logprobs_mode="processed_logprobs"``, whose probabilities
are those after the grammar's mask and the allowed tokens, so each step's are already
renormalized; against someone else's server (raw log-probabilities) the renormalization over
what the step allows is done here from the top ones. Example::

    label_confidence("positive", [(11, {11: -0.1, 12: -2.5})], {11: "positive", 12: "negative"}.get)
    # 0.916827: exp(-0.1) / (exp(-0.1) + exp(-2.5))
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from typing import Any

from ...spec import OutputSpec
from . import label_tokens

#: Log-probabilities asked per step of a label answer (vLLM's default ``max_logprobs`` is 20).
LABEL_TOP = 20

#: One decode step: the token taken (a token id, or its text from a server) and the top tokens'
#: log-probabilities at that step, the taken one among them.
Step = tuple[Hashable, Mapping[Any, float]]


class Scorer:
    """The confidence of one job's answers, from what its engine returns: vLLM's completions
    (offline) or an OpenAI-style ``logprobs`` object (a server). ``tokenizer``: the model's, when
    tokens are known by id (None: by text, as a chat server names them); ``step``: the one-step
    table when labels are decoded that way (``label_tokens``)."""

    def __init__(self, output: OutputSpec, tokenizer: Any = None, step: label_tokens.FirstStep | None = None) -> None:
        self.kind, self.top, self.tokenizer = output.kind, logprobs_wanted(output.kind), tokenizer
        self.labels = list(output.labels)
        # Which label a first token can only become: the one step's table, or the same table made
        # for the confidence (by text without a tokenizer; none for labels outside ASCII).
        first = step or (label_tokens.first_step(tokenizer, output.labels) if tokenizer and output.kind == "label"
                         else None)
        self.settles = first.label if first is not None else settles_by_text(output.labels) if tokenizer is None \
            else (lambda _: None)
        self.allowed = frozenset(step.allowed) if step is not None else None

    def fields(self, completions: bool) -> dict[str, Any]:
        """A server request's fields asking for the log-probabilities."""
        if not completions:
            return {"logprobs": True, "top_logprobs": self.top}
        # A label's tokens by id (the first-step table is by id); a JSON answer's by text (its pieces).
        return {"logprobs": self.top, "return_tokens_as_token_ids": self.kind == "label"}

    def of_openai(self, text: str, logprobs: Any) -> float | None:
        """From a server's answer: ``choices[0].logprobs``."""
        steps, pieces = openai_steps(logprobs)
        if self.tokenizer is not None and steps and isinstance(steps[0][0], int):  # tokens by id
            pieces = self.tokenizer.batch_decode([[t] for t, _ in steps], skip_special_tokens=True)
        return answer_confidence(self.kind, text, steps, pieces, self.settles, self.allowed, self.labels)

    def of_vllm(self, text: str, completion: Any) -> float | None:
        """From ``vllm``'s ``CompletionOutput`` (its ``token_ids`` and ``logprobs``)."""
        tokens, logprobs = list(completion.token_ids), completion.logprobs or []
        steps = [(t, {k: lp.logprob for k, lp in top.items()}) for t, top in zip(tokens, logprobs, strict=False)]
        # A label settled in one step needs no text; the grammar's steps do (see label_confidence).
        pieces = self.tokenizer.batch_decode([[t] for t in tokens], skip_special_tokens=True) \
            if len(tokens) > 1 else []
        return answer_confidence(self.kind, text, steps, pieces, self.settles, self.allowed, self.labels)


def logprobs_wanted(kind: str) -> int | None:
    """Top log-probabilities to ask per generated token for an output kind (0: the taken
    token's alone), or None for none."""
    return LABEL_TOP if kind == "label" else 0 if kind == "json" else None


def answer_confidence(kind: str, text: str, steps: Sequence[Step], pieces: Sequence[str],
                      settles: Callable[[Any], str | None], allowed: Collection[Any] | None = None,
                      labels: Sequence[str] = ()) -> float | None:
    """The confidence of one answer of an output ``kind``: ``text`` as generated, its ``steps``,
    each token's text (``pieces``), which label a first token ``settles``, the tokens a one-step
    label answer was ``allowed`` (``label_tokens``; None: the grammar's), and the ``labels``."""
    if not steps:
        return None
    if kind == "label":
        one_step = allowed is not None and len(steps) == 1 and settles(steps[0][0]) is not None
        label = settles(steps[0][0]) if one_step else text.strip()
        return label_confidence(str(label), steps, settles, allowed.__contains__ if one_step and allowed else None,
                                pieces, labels)
    if kind == "json":
        return json_confidence(pieces, [top[token] for token, top in steps])
    return None


def openai_steps(logprobs: Mapping[str, Any] | None) -> tuple[list[Step], list[str]]:
    """The steps and token texts of an OpenAI-style ``logprobs`` object: a completion's
    (``tokens``, ``top_logprobs``; a token as ``token_id:<id>`` when asked so) or a chat
    message's (``content``)."""
    if not logprobs:
        return [], []
    if "content" in logprobs:
        items = logprobs.get("content") or []
        tokens = [_key(item["token"]) for item in items]
        tops = [{_key(t["token"]): t["logprob"] for t in item.get("top_logprobs") or []} for item in items]
        chosen = [item["logprob"] for item in items]
    else:
        tokens = [_key(t) for t in logprobs.get("tokens") or []]
        tops = [{_key(k): v for k, v in (top or {}).items()} for top in logprobs.get("top_logprobs") or []]
        chosen = list(logprobs.get("token_logprobs") or [])
    steps: list[Step] = []
    for token, top, lp in zip(tokens, tops, chosen, strict=False):
        steps.append((token, {**top, token: lp if lp is not None else -math.inf}))
    return steps, [t if isinstance(t, str) else "" for t in tokens]


def _key(token: str) -> Any:
    """A token as the server named it: its id when sent as ``token_id:<id>``, else its text."""
    return int(token[9:]) if token.startswith("token_id:") and token[9:].isdigit() else token


def label_confidence(label: str, steps: Sequence[Step], settles: Callable[[Any], str | None],
                     first_allowed: Callable[[Any], bool] | None = None, pieces: Sequence[str] = (),
                     labels: Sequence[str] = ()) -> float | None:
    """The probability of ``label`` among the labels (see the module's docstring).

    ``steps``: the answer's decode steps. ``settles``: the label a first token can only become
    (None when it begins several, or is unknown). ``first_allowed``: which tokens the first step
    allowed, when the engine's figures at that step were not already masked to them. ``pieces``:
    each step's text, with ``labels`` all the labels: once the text so far can only become
    ``label``, every way on leads to it, so later steps no longer count ("de" then "vel", or
    "v" and "el": devel either way)."""
    if not steps:
        return None
    (taken, top), rest = steps[0], steps[1:]
    allowed = first_allowed or (lambda _: True)
    total = sum(math.exp(lp) for key, lp in top.items() if allowed(key) and lp > -math.inf)
    if taken not in top or total <= 0:
        return None
    path = math.exp(top[taken])
    so_far = pieces[0] if pieces else ""
    for i, (token, later) in enumerate(rest, start=1):
        if settles(taken) == label or (so_far and [x for x in labels if x.startswith(so_far)] == [label]):
            break  # every way on from here is this label
        so_far += pieces[i] if i < len(pieces) else ""
        norm = sum(math.exp(lp) for lp in later.values() if lp > -math.inf)
        if token not in later or norm <= 0:
            return None
        path *= math.exp(later[token]) / norm
    spelled_too = sum(math.exp(lp) for key, lp in top.items()
                      if key != taken and allowed(key) and lp > -math.inf and settles(key) == label)
    return _clip((path + spelled_too) / total)


def json_confidence(pieces: Sequence[str], logprobs: Sequence[float]) -> float | None:
    """The lowest probability of a token inside a JSON value; ``pieces``: each token's text
    (their concatenation is the answer), ``logprobs``: each token's log-probability. None when
    the answer has no value (``{}``)."""
    spans = value_spans("".join(pieces))
    if not spans:
        return None
    lowest, start, span = 0.0, 0, 0
    for piece, lp in zip(pieces, logprobs, strict=False):
        end = start + len(piece)
        while span < len(spans) and spans[span][1] <= start:
            span += 1
        if span < len(spans) and spans[span][0] < end and end > start:
            lowest = min(lowest, lp)
        start = end
    return _clip(math.exp(lowest))


def value_spans(text: str) -> list[tuple[int, int]]:
    """Character spans [start, end) of the values in a JSON text: strings that are not keys,
    numbers, ``true``/``false``/``null``. Tolerant of a cut or malformed text (spans so far)."""
    spans: list[tuple[int, int]] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            end = min(j + 1, n)
            after = end
            while after < n and text[after] in " \t\r\n":
                after += 1
            if after >= n or text[after] != ":":  # a key is followed by its colon
                spans.append((i, end))
            i = end
        elif ch == "-" or ch.isdigit() or text.startswith(("true", "false", "null"), i):
            j = i
            while j < n and text[j] not in ",}] \t\r\n":
                j += 1
            spans.append((i, j))
            i = j
        else:
            i += 1
    return spans


def settles_by_text(labels: Sequence[str]) -> Callable[[Any], str | None]:
    """:func:`label_confidence`'s ``settles`` for steps keyed by token text (a chat server's):
    the one label that begins with the text."""

    def settles(text: Any) -> str | None:
        found = [label for label in labels if isinstance(text, str) and text and label.startswith(text)]
        return found[0] if len(found) == 1 else None

    return settles


def _clip(p: float) -> float:
    return round(min(max(p, 0.0), 1.0), 6)
