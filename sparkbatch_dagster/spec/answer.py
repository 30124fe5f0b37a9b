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

    # No fixed cap: the model's context is the limit (an answer longer than it is the engine's
    # error row, as the hosted APIs refuse a max_tokens above the model's).
    max_tokens: int = Field(default=64, ge=1)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = Field(default=0, description="The sampler's seed; None: none, each sampled answer a draw "
                             "(generated every time, never reused). Greedy decoding (temperature 0) does not read it.")
    ignore_eos: bool = Field(default=False, description="Always generate max_tokens (benchmarks).")
    reasoning: Literal["off", "auto"] | int = Field(
        default="off", description="A reasoning model's thinking: 'off' (the chat template's default prompt, the "
        "grammar from the first token), a budget in tokens (the model thinks at most that long, then answers under "
        "the grammar), or 'auto' (a budget of 1024 when the chat template thinks, else off). max_tokens counts the "
        "thinking too: it must hold the budget plus the answer. docs/reasoning.md.",
    )

    # Request fields of the providers' APIs, which vLLM honours per request (a batch file's line sets
    # them); a job may set them too. Off by default, and then not part of the identity.
    stop: tuple[str, ...] | None = Field(default=None, description="Stop strings: the answer ends before the first "
                                         "one it would write (OpenAI's stop, Anthropic's stop_sequences).")
    n: int = Field(default=1, ge=1, le=16, description="Answers per prompt (OpenAI's n): choices 1.. come with the "
                   "first, in the batch file's result line.")
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    top_k: int | None = Field(default=None, ge=1, description="Sample from the k likeliest tokens (Anthropic's top_k).")
    logit_bias: dict[int, float] | None = Field(default=None, description="Token id -> bias added to its logit, "
                                                "-100 to 100 (OpenAI's logit_bias).")
    logprobs: int | None = Field(default=None, ge=0, le=20, description="Return each answer token's log-probability "
                                 "and this many likeliest alternatives (OpenAI's logprobs + top_logprobs).")

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is not None and (not value or any(not s for s in value)):
            raise ValueError("stop must hold non-empty strings (leave it unset for none)")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _check_bias(cls, value: dict[int, float] | None) -> dict[int, float] | None:
        bad = next((k for k, v in (value or {}).items() if k < 0 or not -100 <= v <= 100), None)
        if bad is not None:
            raise ValueError(f"logit_bias[{bad}]: a token id must be >= 0 and its bias between -100 and 100")
        return value

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
        for key in _REQUEST_FIELDS:
            if data[key] == SamplingSpec.model_fields[key].default:
                data.pop(key)
        return data

    def extras_asked(self) -> bool:
        """Whether an answer must carry more than its text: the stop string that ended it,
        further choices, token log-probabilities (:class:`~sparkbatch_dagster.engines.base.Extras`)."""
        return bool(self.stop) or self.n > 1 or self.logprobs is not None


#: The request fields that name an answer only when set (jobs from before them keep their versions).
_REQUEST_FIELDS = ("stop", "n", "presence_penalty", "frequency_penalty", "top_k", "logit_bias", "logprobs")
