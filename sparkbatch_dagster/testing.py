"""Test-only resources. Nothing here is part of ``VLLMResource``'s launchpad schema.

    from sparkbatch_dagster.testing import FakeVLLMResource

    defs = Definitions(assets=job.assets, resources={"vllm": FakeVLLMResource(delay_s=0.01)})

:class:`FakeVLLMResource` has ``VLLMResource``'s lifecycle (lazy start, ``keep_warm``, close,
shutdown) and answers with :class:`~sparkbatch_dagster.engines.fake.FakeEngine`: no vLLM, no
model files. It never stands in for the real-engine tests.
"""

from __future__ import annotations

from pydantic import Field

from .engines.base import Engine
from .engines.settings import CPU_DEFAULTS
from .resources import VLLMResource


class FakeVLLMResource(VLLMResource):
    """``VLLMResource`` whose engine is a :class:`FakeEngine` with these settings.

    ``model`` names the fake model (``"fake-model"`` when unset); a fixed ``answer`` makes it
    another model identity, since it answers differently. The vLLM settings it inherits are
    ignored, except ``keep_warm``.
    """

    delay_s: float = Field(default=0.0, ge=0.0, description="Seconds of sleep per request (kill tests' window).")
    fail_after: int | None = Field(
        default=None, ge=0, description="Raise EngineError after this many results (an engine crash)."
    )
    answer: str | None = Field(
        default=None, description="A fixed answer for every request; None = a label picked by a hash of the prompt."
    )
    trace_path: str | None = Field(
        default=None, description="Append each finished request id to this file (line-buffered)."
    )
    transient_first: int = Field(
        default=0, ge=0, description="The first N requests fail as a flaky server's would (retryable)."
    )

    def model_name(self) -> str:
        return self.resolved().model or "fake-model"

    def model_identity(self) -> str:
        from .spec import fingerprint

        cfg = self.resolved()
        name = cfg.model_name()
        return name if cfg.answer is None else f"{name}@{fingerprint(cfg.answer)[:12]}"

    def resolved_max_num_seqs(self) -> int:
        return self.resolved().max_num_seqs or int(CPU_DEFAULTS["max_num_seqs"])  # no platform to ask

    def _start(self) -> Engine:
        from .engines.fake import FakeEngine

        return FakeEngine(model_id=self.model_name(), delay_s=self.delay_s, fail_after=self.fail_after,
                          answer=self.answer, trace_path=self.trace_path, transient_first=self.transient_first)
