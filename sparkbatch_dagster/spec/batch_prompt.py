"""A batch file's staged request (:meth:`.batch_requests.BatchRequest.to_text`) as the run's
prompt: its messages as the engine gets them, its own sampling and output where they differ from
the job's, its tools. Its answer's name is :func:`.identity.answer_key` of exactly that, so a
plain system + user line with the job's settings is named as the column path's prompt of the same
text is (:class:`.prompts.RenderedPrompt`). Example::

    prompt = request_prompt(row["request"], spec.sampling)
    key = prompt.answer_key(spec.sampling, spec.output)      # None: a draw, generated every time
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from .answer import OutputSpec, SamplingSpec
from .batch_requests import BatchRequest, Message
from .batch_tools import Tools
from .identity import answer_key

__all__ = ["RequestPrompt", "request_prompt"]


@dataclass(frozen=True)
class RequestPrompt:
    """A batch-file row's request as a prompt: its turns, and the sampling and output it sets
    (None: the job's); ``tools`` go to the chat template (a forced call's schema is ``output``)."""

    turns: tuple[Message, ...]
    sampling: SamplingSpec | None = None
    output: OutputSpec | None = None
    tools: Tools | None = None

    def messages(self) -> list[dict[str, str]]:
        """The messages exactly as the engine gets them (an empty system message included, a
        turn's ``name`` kept)."""
        return [msgspec.to_builtins(m) for m in self.turns]

    @property
    def order(self) -> str:
        """Text that sorts prompts sharing a prefix next to each other (ordering only, never a name)."""
        return "\x1e".join(m.content for m in self.turns)

    def answer_key(self, sampling: SamplingSpec, output: OutputSpec) -> str | None:
        """Its answer's name under a job of ``sampling`` / ``output`` (its own where it sets them)."""
        return answer_key(self.messages(), self.tools, self.sampling or sampling, self.output or output)


def request_prompt(request: str, job: SamplingSpec) -> RequestPrompt:
    """The prompt of one normalized request (:meth:`BatchRequest.to_text`'s JSON)."""
    req = BatchRequest.from_text(request)
    sampling = SamplingSpec(**{**job.model_dump(), **req.sampling}) if req.sampling else None
    output: OutputSpec | None = OutputSpec(**msgspec.to_builtins(req.output)) if req.output else None
    if req.tools is not None and req.tools.forced():  # vLLM's way: the call is JSON under the tools' schema
        output = OutputSpec(kind="json", json_schema=req.tools.schema())
    return RequestPrompt(tuple(req.messages), sampling, output, req.tools)
