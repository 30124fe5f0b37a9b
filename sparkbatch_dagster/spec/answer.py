"""What a job's model must produce for each row and how it samples: :class:`OutputSpec` and
:class:`SamplingSpec`, parts of :class:`~.job_spec.JobSpec`. Their ``identity()`` is what names
the output version and the result store's answers (``JobSpec.prompt_fingerprint``).

Example::

    OutputSpec(kind="label", labels=["billing", "tech", "sales"])
    SamplingSpec(max_tokens=8, temperature=0.0)
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class OutputSpec(BaseModel):
    """What the model must produce for each row.

    - ``label``: exactly one of ``labels``, enforced by vLLM structured outputs.
    - ``json``: an object matching ``json_schema``, enforced the same way.
    - ``text``: free text, optionally constrained by ``regex``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["label", "json", "text"] = "text"
    labels: list[str] = Field(default_factory=list, description="Allowed labels (kind='label').")
    json_schema: dict[str, Any] | None = Field(default=None, description="JSON schema (kind='json').")
    regex: str | None = Field(default=None, description="Optional regex for kind='text'.")
    confidence: bool = Field(default=True, description=(
        "Give each label or JSON row a confidence from the engine's log-probabilities (docs/labels.md). "
        "Off: no log-probabilities are asked (they cost time on a fast GPU) and the column is null. It does "
        "not change the answers, so it is not part of the output version."))
    keep_reasoning: bool = Field(
        default=False, description="With sampling.reasoning on: keep each answer's thinking text in a `reasoning` "
        "column (and in the result store, so a reused answer keeps it). Off: only its token count is kept.",
    )

    @model_validator(mode="after")
    def _check_kind(self) -> OutputSpec:
        if self.kind == "label":
            if len(self.labels) < 2:
                raise ValueError("output.kind='label' needs at least two labels: set output.labels")
            if len(set(self.labels)) != len(self.labels):
                raise ValueError("output.labels has duplicates: list each label once")
        if self.kind == "json" and not self.json_schema:
            raise ValueError("output.kind='json' needs output.json_schema (a JSON schema dict)")
        if self.regex is not None:
            re.compile(self.regex)
        return self

    def identity(self) -> dict[str, Any]:
        """What of the spec shapes an answer (the fingerprints'): all but ``confidence``, and
        ``keep_reasoning`` only when on (so the versions of jobs written before it existed stay
        what they were)."""
        data = self.model_dump(exclude={"confidence"})
        if not self.keep_reasoning:
            data.pop("keep_reasoning")
        return data


class SamplingSpec(BaseModel):
    """Sampling settings; part of the fingerprint, so changing them starts a new output version."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_tokens: int = Field(default=64, ge=1, le=32768)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int = 0
    ignore_eos: bool = Field(default=False, description="Always generate max_tokens (benchmarks).")
    reasoning: Literal["off", "auto"] | int = Field(
        default="off", description="A reasoning model's thinking: 'off' (the chat template's default prompt, the "
        "grammar from the first token), a budget in tokens (the model thinks at most that long, then answers under "
        "the grammar), or 'auto' (a budget of 1024 when the chat template thinks, else off). max_tokens counts the "
        "thinking too: it must hold the budget plus the answer. docs/reasoning.md.",
    )

    @field_validator("reasoning")
    @classmethod
    def _check_reasoning(cls, value: str | int) -> str | int:
        if isinstance(value, int) and not isinstance(value, bool) and value < 1:
            raise ValueError(f"reasoning={value} must be 'off', 'auto' or a thinking budget of at least 1 token "
                             "(e.g. 512)")
        return value

    @model_validator(mode="after")
    def _check_room(self) -> SamplingSpec:
        budget = self.reasoning
        if isinstance(budget, int) and self.max_tokens < budget + 2:
            raise ValueError(f"max_tokens={self.max_tokens} cannot hold the thinking budget reasoning={budget} plus "
                             f"the end of the thinking and an answer: raise max_tokens to at least {budget + 2} "
                             f"plus the answer's length (e.g. {budget + 64}), or lower reasoning")
        return self

    def identity(self) -> dict[str, Any]:
        """What names the output version: every field, ``reasoning`` only when on (so the
        versions of jobs written before it existed stay what they were)."""
        data = self.model_dump()
        if self.reasoning == "off":
            data.pop("reasoning")
        return data
