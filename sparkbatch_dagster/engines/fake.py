"""A deterministic engine for fast unit tests. Never a stand-in for the real-engine tests."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Iterator

from ..errors import EngineError
from ..spec import OutputSpec, SamplingSpec
from .base import Engine, EngineRequest, EngineResult


class FakeEngine(Engine):
    """Answers from a hash of the prompt: same prompt, same answer.

    Args:
        delay_s: sleep per request, to give kill tests a window.
        fail_after: raise :class:`EngineError` after this many results (an engine crash).
        answer: a fixed answer for every request (to produce unparseable output on purpose).
        trace_path: append each finished request id to this file (line-buffered).
        transient_first: the first N requests fail as a flaky server's would (``retryable``).
    """

    def __init__(
        self,
        model_id: str = "fake-model",
        delay_s: float = 0.0,
        fail_after: int | None = None,
        answer: str | None = None,
        trace_path: str | None = None,
        transient_first: int = 0,
    ) -> None:
        self.model_id = model_id
        self.delay_s = delay_s
        self.fail_after = fail_after
        self.answer = answer
        self.requests_seen = 0
        self.transient_first = transient_first
        # Kill tests read this file to learn how many rows were generated before the kill.
        self._trace = open(trace_path, "a", buffering=1) if trace_path else None  # noqa: SIM115

    def generate(
        self, requests: Iterable[EngineRequest], sampling: SamplingSpec, output: OutputSpec
    ) -> Iterator[EngineResult]:
        for req in requests:
            if self.fail_after is not None and self.requests_seen >= self.fail_after:
                raise EngineError(f"fake engine died after {self.requests_seen} requests")
            self.requests_seen += 1
            if self.delay_s:
                time.sleep(self.delay_s)
            if self.requests_seen <= self.transient_first:
                yield EngineResult(id=req.id, text=None, error="server_error: HTTP 503 after 5 retries", retryable=True)
                continue
            prompt = "\n".join(m["content"] for m in req.messages)
            text = self.answer if self.answer is not None else _answer(prompt, output)
            words = text.split(" ")
            cut = len(words) > sampling.max_tokens  # a word a token: an answer longer than max_tokens is cut
            if cut:
                text = " ".join(words[: sampling.max_tokens])
            if self._trace:
                self._trace.write(req.id + "\n")
            yield EngineResult(
                id=req.id,
                text=text,
                prompt_tokens=len(prompt.split()) + 4,
                output_tokens=max(1, len(text.split())),
                finish_reason="length" if cut else "stop",
            )


def _answer(prompt: str, output: OutputSpec) -> str:
    h = int(hashlib.sha256(prompt.encode()).hexdigest(), 16)
    if output.kind == "label":
        return output.labels[h % len(output.labels)]
    if output.kind == "json":
        props = (output.json_schema or {}).get("properties", {})
        return json.dumps({k: "x" for k in props})
    return f"answer-{h % 1000}"
