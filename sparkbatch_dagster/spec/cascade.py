"""A cascade of models: a first model answers every row, the rows it is unsure of go to the next.

``JobSpec.cascade`` lists the stages in order. Each stage is a model (with engine settings, as an
estimate candidate has: ``"gemma-3-270m"``, ``"/models/qwen-8b@quantization=fp8"``) and, on every
stage but the last, ``below``: a row whose confidence (``engines/answers/confidence.py``) is under it, or
that the stage could not answer, goes on to the next stage. A stage without a model is the job's
configured one (``VLLMResource.model``). Example (YAML)::

    cascade:
      - below: 0.8              # the configured model first; rows it is less than 0.8 sure of...
      - model: gemma-3-270m     # ...are asked again here, and its answer stands
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .hardware import ModelCandidate


class CascadeStage(BaseModel):
    """One stage of :attr:`JobSpec.cascade`: ``model`` (None: the job's configured model) with
    ``engine_kwargs`` merged over the resource's, and ``below`` (every stage but the last)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = Field(default=None, description="A model, optionally with @key=value engine settings; "
                              "None = the configured model (VLLMResource.model).")
    engine_kwargs: dict[str, Any] = Field(default_factory=dict, description="Merged over the resource's.")
    below: float | None = Field(default=None, description="Rows answered with a confidence under this go on to "
                                "the next stage (0 < below <= 1); not on the last stage.")

    @field_validator("model", mode="after")
    @classmethod
    def _split_settings(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("cascade stage model is empty: name a model, or leave it out for the configured one")
        return value

    def candidate(self) -> ModelCandidate | None:
        """The stage as an estimate candidate (model and engine settings); None for the configured model."""
        if self.model is None:
            return None
        parsed = ModelCandidate.parse(self.model) if "@" in self.model else ModelCandidate(model=self.model)
        return ModelCandidate(model=parsed.model, engine_kwargs={**parsed.engine_kwargs, **self.engine_kwargs})


def check_cascade(stages: list[CascadeStage], kind: str, confidence: bool = True) -> None:
    """Raise ValueError naming what is wrong with a cascade and the fix."""
    if not stages:
        return
    if len(stages) < 2:
        raise ValueError("cascade has one stage: list at least two (the first answers every row, the next the "
                         "rows it is unsure of), or leave cascade out")
    if kind == "text":
        raise ValueError("cascade needs an answer's confidence, which free text has none of: use output.kind "
                         "'label' or 'json', or leave cascade out")
    if not confidence:
        raise ValueError("cascade escalates on each answer's confidence, and output.confidence is off: set "
                         "output.confidence=True (the default), or leave cascade out")
    for i, stage in enumerate(stages[:-1]):
        if stage.below is None or not 0 < stage.below <= 1:
            raise ValueError(f"cascade stage {i + 1} has below={stage.below!r}: every stage but the last needs a "
                             "confidence threshold 0 < below <= 1 (rows under it go to the next stage), e.g. 0.8")
    if stages[-1].below is not None:
        raise ValueError(f"the last cascade stage has below={stages[-1].below!r}, but nothing comes after it: "
                         "leave below out of the last stage")
    if sum(stage.model is None for stage in stages) > 1:
        raise ValueError("more than one cascade stage leaves out model (the configured one): name the others")
