"""Reasoning models: where the thinking is, how long it may run, and where the answer begins.

Models such as Qwen3 think before they answer: ``<think> ... </think>`` and then the answer. A
job's ``sampling.reasoning`` says what to do with that (:class:`~..spec.SamplingSpec`):

- ``"off"``: nothing here; the prompt is the chat template's default and the grammar applies
  from the first token.
- a budget ``N``: the model thinks at most ``N`` tokens, then answers under the grammar.
- ``"auto"``: a budget of :data:`AUTO_BUDGET` when the chat template thinks by default, else off.

:func:`plan` reads the markers from the model's chat template and tokenizer; the engines bound the
thinking (vLLM's own ``thinking_token_budget`` where the engine has it, else a second request that
closes the thinking and asks for the answer: ``reasoning_offline.py``), and :func:`split_ids` /
:func:`split_text` cut what came back into the thinking and the answer. Example::

    plan = reasoning.plan(tokenizer, spec.sampling)     # None: reasoning off for this model
    thinking, answer = split_text("<think>hmm</think>\\n\\npositive", plan.markers)  # ("hmm", "positive")
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import ConfigError
from ...spec import SamplingSpec

#: The thinking budget of ``reasoning: auto`` on a template that thinks, in tokens.
AUTO_BUDGET = 1024
#: Pairs of thinking markers this knows (Qwen3, DeepSeek-R1, Nemotron and most others use the first).
KNOWN_MARKERS = (("<think>", "</think>"),)
#: A message to render the template's default generation prompt with.
_PROBE = [{"role": "user", "content": "sparkbatch-probe"}]


@dataclass(frozen=True)
class Markers:
    """The strings that open and close the thinking, and their token ids (None where the marker
    is not one token of the vocabulary: then only the text is split)."""

    start: str
    end: str
    start_id: int | None = None
    end_id: int | None = None


@dataclass(frozen=True)
class Plan:
    """A job's reasoning on one model: at most ``budget`` thinking tokens, between ``markers``;
    ``template_kwargs`` go to the chat template (``enable_thinking`` where it reads it)."""

    budget: int
    markers: Markers
    template_kwargs: dict[str, Any]


def _template(tokenizer: Any) -> str:
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):  # named templates: the default one
        template = template.get("default") or next(iter(template.values()), "")
    return str(template)


def markers(tokenizer: Any) -> Markers | None:
    """The thinking markers named in the model's chat template, or None (not a reasoning model)."""
    template = _template(tokenizer)
    for start, end in KNOWN_MARKERS:
        if end in template:
            vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
            return Markers(start, end, vocab.get(start), vocab.get(end))
    return None


def thinks_by_default(tokenizer: Any) -> bool:
    """Whether the template, as the run renders it by default, lets the model think: it names
    thinking markers and its generation prompt does not close an empty thinking block (what
    Qwen3's template writes for ``enable_thinking=False``)."""
    found = markers(tokenizer)
    if found is None:
        return False
    prompt = tokenizer.apply_chat_template(_PROBE, tokenize=False, add_generation_prompt=True)
    tail = prompt[prompt.rfind("sparkbatch-probe") + len("sparkbatch-probe"):]
    return found.end not in tail


def template_kwargs(tokenizer: Any) -> dict[str, Any]:
    """What turns the template's thinking on where it has a switch (``enable_thinking``)."""
    return {"enable_thinking": True} if "enable_thinking" in _template(tokenizer) else {}


def budget_of(sampling: SamplingSpec, thinks: bool) -> int | None:
    """The thinking budget of ``sampling`` on a model whose template thinks (``thinks``) or not;
    None: reasoning off."""
    if sampling.reasoning == "off" or (sampling.reasoning == "auto" and not thinks):
        return None
    return AUTO_BUDGET if sampling.reasoning == "auto" else int(sampling.reasoning)


def room_problem(sampling: SamplingSpec, budget: int) -> str | None:
    """Why ``max_tokens`` cannot hold the thinking plus the end marker and an answer; None when it can."""
    if sampling.max_tokens >= budget + 2:
        return None
    return (f"sampling.max_tokens={sampling.max_tokens} cannot hold the thinking budget ({budget} tokens, "
            f"reasoning={sampling.reasoning!r}) plus the end of the thinking and an answer: raise "
            f"sampling.max_tokens to at least {budget + 2} plus the answer's length (e.g. {budget + 64}), or set "
            "sampling.reasoning to a smaller budget or 'off'")


def plan(tokenizer: Any, sampling: SamplingSpec) -> Plan | None:
    """The reasoning plan of a job on the model of ``tokenizer``; None: reasoning off. A budget on
    a model without markers, or an ``auto`` budget ``max_tokens`` cannot hold, is a ConfigError.
    ``tokenizer`` None: a chat server's, whose template stays on the server, so ``auto`` cannot be
    decided here and a budget gets the known markers."""
    if sampling.reasoning == "off":
        return None
    if tokenizer is None:
        return _chat_server_plan(sampling)
    found = markers(tokenizer)
    if found is None:
        if sampling.reasoning == "auto":
            return None
        raise ConfigError(f"sampling.reasoning={sampling.reasoning!r}, but the model's chat template names no "
                          f"thinking markers ({', '.join(s + e for s, e in KNOWN_MARKERS)}): it is not a reasoning "
                          "model this knows; set sampling.reasoning to 'off' (or 'auto')")
    budget = budget_of(sampling, thinks_by_default(tokenizer))
    if budget is None:
        return None
    problem = room_problem(sampling, budget)
    if problem:
        raise ConfigError(problem)
    return Plan(budget, found, template_kwargs(tokenizer))


def _chat_server_plan(sampling: SamplingSpec) -> Plan:
    if sampling.reasoning == "auto":
        raise ConfigError("sampling.reasoning='auto' reads the model's chat template, which a chat server keeps to "
                          "itself: set a thinking budget (e.g. reasoning: 512), or server_token_ids=True so that the "
                          "template is read here")
    budget = int(sampling.reasoning)
    problem = room_problem(sampling, budget)
    if problem:
        raise ConfigError(problem)
    return Plan(budget, Markers(*KNOWN_MARKERS[0]), {"enable_thinking": True})


def request_fields(found: Plan) -> dict[str, Any]:
    """What a server request adds for a reasoning job: vLLM's ``thinking_token_budget`` (the
    server must run with ``--reasoning-parser``, which also makes its grammar start after the
    thinking; a server without one answers HTTP 400 to every request, and the run stops naming
    it) and the template's thinking switch."""
    fields: dict[str, Any] = {"thinking_token_budget": found.budget}
    if found.template_kwargs:
        fields["chat_template_kwargs"] = dict(found.template_kwargs)
    return fields


def unfinished(sampling: SamplingSpec) -> str:
    """The error of a row whose thinking never ended (the model stopped inside it)."""
    return (f"reasoning_unfinished: the model stopped inside its thinking (reasoning={sampling.reasoning!r}, "
            f"max_tokens={sampling.max_tokens}) and gave no answer; a smaller budget leaves more room for it")


def split_text(text: str, found: Markers) -> tuple[str, str | None]:
    """(thinking, answer) of a generated text; the answer is None when the thinking never ended
    (no end marker). The thinking ends at the FIRST end marker: what follows is the answer, even
    if it holds another marker (then it is the answer's text, checked as any answer is)."""
    cut = text.find(found.end)
    if cut < 0:
        return _thinking(text, found), None
    return _thinking(text[:cut], found), text[cut + len(found.end):].lstrip()


def split_ids(ids: Sequence[int], found: Markers) -> int | None:
    """Where the answer begins in generated token ids: one past the first end marker; None when
    the thinking never ended (or the marker is not one token: split the text instead)."""
    if found.end_id is None:
        return None
    try:
        return list(ids).index(found.end_id) + 1
    except ValueError:
        return None


def _thinking(text: str, found: Markers) -> str:
    """The thinking's text: without its start marker (the model's, when the prompt did not open it)."""
    text = text.strip()
    return text[len(found.start):].strip() if text.startswith(found.start) else text
