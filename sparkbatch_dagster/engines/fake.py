"""A deterministic engine for fast unit tests. Never a stand-in for the real-engine tests."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Iterable, Iterator
from typing import Any

from ..errors import ConfigError, EngineError
from ..spec import OutputSpec, SamplingSpec
from .answers import extras, reasoning
from .answers.tools import with_calls
from .base import Engine, EngineRequest, EngineResult

#: How long a fake engine holds at a gate nobody opens (a test that failed before opening it).
GATE_LIMIT_S = 600.0


class FakeEngine(Engine):
    """Answers from a hash of the prompt: same prompt, same answer.

    Args:
        delay_s: sleep per request, to give kill tests a window.
        fail_after: raise :class:`EngineError` after this many results (an engine crash).
        answer: a fixed answer for every request (to produce unparseable output on purpose).
        trace_path: append each finished request id to this file (line-buffered).
        transient_first: the first N requests fail as a flaky server's would (``retryable``).
        gate_path: with ``gate_after``, a file that must exist before request ``gate_after + 1``
            is answered: the engine holds there (``gate_after`` answers given) until a test
            creates it, so the test, not the clock, decides what happens meanwhile (another
            process starts, a kill lands). A gate never opened raises :class:`EngineError`
            after ``GATE_LIMIT_S``, so a forgotten process does not live forever.
        gate_after: answers given before the gate (0: before the first).
        knows: words the model knows, each with its label: a label prompt holding one is answered
            with that label, fairly sure (confidence 0.6 to 1); any other is a guess, as sure as
            ever (0.05 to 1). An overconfident model whose confidence still ranks right above
            wrong: what calibration and a review budget are for.
        thinking: makes it a reasoning model whose template thinks by default: with
            ``sampling.reasoning`` on, each output is ``<think>{thinking}</think>`` and the answer
            (an ``answer`` holding a marker is the whole output as it is: the parsing paths). The
            thinking is cut at the budget, a word a token, as vLLM's budget cuts it.

    Example: hold after 35 answers until the test says go::

        FakeEngine(gate_path=str(tmp_path / "go"), gate_after=35)
        ...  # the test sees 35 rows traced, does what it must, then (tmp_path / "go").touch()
    """

    #: Set by ``FakeVLLMResource``'s start (``testing.fake_compile``): whether it found its compiled
    #: file in the compile cache (True), wrote it (False), or had no cache folder (None).
    compiled_from_cache: bool | None = None

    def __init__(
        self,
        model_id: str = "fake-model",
        delay_s: float = 0.0,
        fail_after: int | None = None,
        answer: str | None = None,
        trace_path: str | None = None,
        transient_first: int = 0,
        gate_path: str | None = None,
        gate_after: int = 0,
        thinking: str | None = None,
        knows: dict[str, str] | None = None,
    ) -> None:
        self.model_id = model_id
        self.delay_s = delay_s
        self.fail_after = fail_after
        self.answer = answer
        self.requests_seen = 0
        self.transient_first = transient_first
        self.gate_path, self.gate_after = gate_path, gate_after
        self.thinking = thinking
        self.knows = knows or {}
        self.closed = False  # set by close(): a test sees a stale warm engine stopped
        # Kill tests read this file to learn how many rows were generated before the kill.
        self._trace = open(trace_path, "a", buffering=1) if trace_path else None  # noqa: SIM115

    def close(self) -> None:
        self.closed = True

    def generate(
        self, requests: Iterable[EngineRequest], sampling: SamplingSpec, output: OutputSpec
    ) -> Iterator[EngineResult]:
        budget = reasoning.budget_of(sampling, self.thinking is not None)
        if budget is not None and self.thinking is None:
            raise ConfigError(f"sampling.reasoning={sampling.reasoning!r}, but fake model {self.model_id} does not "
                              "think (FakeEngine(thinking=...)): set sampling.reasoning to 'off' or 'auto'")
        for req in requests:
            if self.gate_path is not None and self.requests_seen == self.gate_after:
                self._wait_at_gate()
            if self.fail_after is not None and self.requests_seen >= self.fail_after:
                raise EngineError(f"fake engine died after {self.requests_seen} requests")
            self.requests_seen += 1
            if self.delay_s:
                time.sleep(self.delay_s)
            if self.requests_seen <= self.transient_first:
                yield EngineResult(id=req.id, text=None, error="server_error: HTTP 503 after 5 retries", retryable=True)
                continue
            prompt = "\n".join(m["content"] for m in req.messages)
            own, limit = req.output or output, (req.sampling or sampling).max_tokens
            known = _known(prompt, own, self.knows)
            text = self.answer if self.answer is not None else known or _answer(prompt, own)
            forced = req.tools if req.tools is not None and req.tools.forced() else None
            if forced is not None and self.answer is None:  # a call of a tool the schema allows
                text = _tool_answer(prompt, forced.schema() or {})
            if budget is not None:
                yield self._reasoned(req.id, prompt, text, budget, sampling, output)
                continue
            asked = req.sampling or sampling
            text, cut, stop = _finish(text, limit, asked)
            choices = [_finish(_answer(f"{prompt}\x1e{i}", own) if asked.temperature else text, limit, asked)
                       for i in range(1, asked.n)]
            if self._trace:
                self._trace.write(req.id + "\n")
            yield EngineResult(
                id=req.id,
                text=text,
                prompt_tokens=len(prompt.split()) + 4,
                output_tokens=sum(max(1, len(t.split())) for t, _, _ in [(text, cut, stop), *choices]),
                finish_reason="length" if cut else "stop",
                confidence=_confidence(self.model_id, prompt, own, bool(known)) if self.answer is None else None,
                extra=with_calls(_extras(text, stop, choices, asked) if asked.extras_asked() else None, text, forced),
            )

    def _reasoned(self, rid: str, prompt: str, text: str, budget: int, sampling: SamplingSpec,
                  output: OutputSpec) -> EngineResult:
        """One answer of the reasoning model: its thinking (cut at ``budget``), then the answer."""
        marks = reasoning.Markers(*reasoning.KNOWN_MARKERS[0])
        raw = text if marks.start in text or marks.end in text else f"{marks.start}{self.thinking}{marks.end}\n\n{text}"
        thought, answer = reasoning.split_text(raw, marks)
        words = thought.split()
        if len(words) > budget:  # the budget ends the thinking: the answer follows
            thought, answer = " ".join(words[:budget]), answer if answer is not None else _answer(prompt, output)
        thought_tokens = len(thought.split()) + 2  # a word a token, and the two markers
        n_prompt = len(prompt.split()) + 4
        if answer is None:  # the model stopped inside its thinking
            return EngineResult(rid, None, n_prompt, output_tokens=thought_tokens, finish_reason="stop",
                                error=reasoning.unfinished(sampling), reasoning=thought,
                                reasoning_tokens=thought_tokens)
        room = max(sampling.max_tokens - thought_tokens, 1)
        cut = len(answer.split(" ")) > room
        answer = " ".join(answer.split(" ")[:room]) if cut else answer
        return EngineResult(rid, answer, n_prompt, output_tokens=thought_tokens + max(1, len(answer.split())),
                            finish_reason="length" if cut else "stop", reasoning=thought,
                            reasoning_tokens=thought_tokens,
                            confidence=_confidence(self.model_id, prompt, output) if self.answer is None else None)

    def _wait_at_gate(self) -> None:
        deadline = time.monotonic() + GATE_LIMIT_S
        while not os.path.exists(str(self.gate_path)):
            if time.monotonic() > deadline:
                raise EngineError(f"fake engine: gate {self.gate_path} not opened in {GATE_LIMIT_S:.0f} s")
            time.sleep(0.02)


def _finish(text: str, limit: int, sampling: SamplingSpec) -> tuple[str, bool, str | None]:
    """(text, cut, stop string): ended at the first stop string it holds, else at ``limit`` words
    (a word a token)."""
    hits = [(text.find(s), s) for s in sampling.stop or () if s in text]
    if hits:
        at, stop = min(hits)
        return text[:at], False, stop
    words = text.split(" ")
    return " ".join(words[:limit]), len(words) > limit, None


def _extras(text: str, stop: str | None, choices: list[tuple[str, bool, str | None]], sampling: SamplingSpec) -> str:
    """What the request asked beyond the text: a word a token, with log-probabilities from its hash."""

    def logprobs(answer: str) -> list[extras.TokenLogprob] | None:
        if sampling.logprobs is None:
            return None
        tokens = [w for w in answer.split(" ") if w]
        lps = [-(int(hashlib.sha256(w.encode()).hexdigest(), 16) % 100) / 100 for w in tokens]
        return [extras.TokenLogprob(w, lp, [extras.TopLogprob(w if k == 0 else f"{w}~{k}", lp - k)
                                            for k in range(sampling.logprobs)])
                for w, lp in zip(tokens, lps, strict=True)]

    rest = [extras.Choice(t, "length" if cut else "stop", s, logprobs(t)) for t, cut, s in choices]
    return extras.Extras(stop, logprobs(text), rest).encode()


def _confidence(model: str, prompt: str, output: OutputSpec, known: bool = False) -> float | None:
    """A confidence from the model's and prompt's hash, spread over (0, 1] as a real engine's
    would be: another model is sure of other rows (a cascade's stages differ); over [0.6, 1) where
    the model knew the answer (``knows``)."""
    if output.kind == "text" or not output.confidence:
        return None
    h = int(hashlib.sha256(f"confidence\x1e{model}\x1e{prompt}".encode()).hexdigest(), 16)
    return round(0.6 + (h % 4000) / 10000, 4) if known else round(0.05 + (h % 9500) / 10000, 4)


def _known(prompt: str, output: OutputSpec, knows: dict[str, str]) -> str | None:
    """The label of the first word the model knows in ``prompt`` (a label job's only), else None."""
    if output.kind != "label" or not knows:
        return None
    words = set(re.findall(r"[a-z]+", prompt.lower()))
    return next((label for word, label in sorted(knows.items()) if word in words and label in output.labels), None)


def _tool_answer(prompt: str, schema: dict[str, Any]) -> str:
    """A forced call's JSON under its schema (``Tools.schema``): the arguments of a named tool, or
    a list of one call of the tool the prompt's hash picks."""
    h = int(hashlib.sha256(prompt.encode()).hexdigest(), 16)
    if schema.get("type") != "array":
        return json.dumps(_fill(schema, h))
    shape = schema["items"]["anyOf"][h % len(schema["items"]["anyOf"])]["properties"]
    return json.dumps([{"name": shape["name"]["enum"][0], "parameters": _fill(shape["parameters"], h)}])


def _fill(schema: dict[str, Any], h: int) -> Any:
    """A value of the JSON schema ``schema`` (its properties filled by type; enums' first)."""
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type", "object")
    if kind == "object":
        return {k: _fill(v, h) for k, v in (schema.get("properties") or {}).items()}
    return {"integer": h % 100, "number": h % 100 / 4, "boolean": bool(h % 2), "array": [],
            "null": None}.get(kind, f"x{h % 1000}")


def _answer(prompt: str, output: OutputSpec) -> str:
    h = int(hashlib.sha256(prompt.encode()).hexdigest(), 16)
    if output.kind == "label":
        return output.labels[h % len(output.labels)]
    if output.kind == "json":
        props = (output.json_schema or {}).get("properties", {})
        return json.dumps({k: "x" for k in props})
    return f"answer-{h % 1000}"
