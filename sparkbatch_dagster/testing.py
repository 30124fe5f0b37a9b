"""Test-only resources. Nothing here is part of ``VLLMResource``'s launchpad schema.

    from sparkbatch_dagster.testing import FakeVLLMResource

    defs = Definitions(assets=job.assets, resources={"vllm": FakeVLLMResource(delay_s=0.01)})

:class:`FakeVLLMResource` has ``VLLMResource``'s lifecycle (lazy start, ``keep_warm``, close,
shutdown) and answers with :class:`~sparkbatch_dagster.engines.fake.FakeEngine`: no vLLM, no
model files. It never stands in for the real-engine tests. With ``data_parallel_size`` > 1 its
fake engines run in worker processes of a
:class:`~sparkbatch_dagster.engines.data_parallel.DataParallelEngine` (:func:`fake_worker`), the
multi-engine path in seconds.
"""

from __future__ import annotations

import json
import os
from typing import Any

from pydantic import Field

from .engines.base import Engine
from .engines.settings import CPU_DEFAULTS, split_devices, visible_gpus
from .resources import VLLMResource


def fake_worker(settings: dict[str, Any]) -> Engine:
    """A :class:`FakeEngine` in a data-parallel worker process, from ``FakeEngine``'s keyword
    arguments. With ``trace_path``, this worker traces to ``<trace_path>.<pid>`` and writes
    ``<trace_path>.<pid>.json``: its pid and the ``CUDA_VISIBLE_DEVICES`` it sees."""
    from .engines.fake import FakeEngine

    fake = dict(settings)
    if fake.get("trace_path"):
        fake["trace_path"] = f"{fake['trace_path']}.{os.getpid()}"
        seen = {"pid": os.getpid(), "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}
        # Written whole then renamed: a test polling for it never reads half a file.
        tmp = f"{fake['trace_path']}.json.tmp"
        with open(tmp, "w") as f:
            json.dump(seen, f)
        os.replace(tmp, f"{fake['trace_path']}.json")
    return FakeEngine(**fake)


class FakeVLLMResource(VLLMResource):
    """``VLLMResource`` whose engine is a :class:`FakeEngine` with these settings.

    ``model`` names the fake model (``"fake-model"`` when unset); a fixed ``answer`` makes it
    another model identity, since it answers differently. The vLLM settings it inherits are
    ignored, except ``keep_warm`` and ``data_parallel_size`` (None: one engine, in this process;
    N: N fake engines in worker processes, each with its own ``CUDA_VISIBLE_DEVICES`` when that
    variable is set here, as with GPUs, and each with its own ``fail_after`` and
    ``transient_first``).
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

        fake: dict[str, Any] = dict(model_id=self.model_name(), delay_s=self.delay_s, fail_after=self.fail_after,
                                    answer=self.answer, trace_path=self.trace_path,
                                    transient_first=self.transient_first)
        if (self.data_parallel_size or 1) == 1:
            return FakeEngine(**fake)
        from .engines.data_parallel import DataParallelEngine

        # GPUs when CUDA_VISIBLE_DEVICES names some (as VLLMResource splits them), else no devices at all.
        gpus = visible_gpus() if "CUDA_VISIBLE_DEVICES" in os.environ else None
        envs = split_devices(self.data_parallel_size, self.tensor_parallel_size, gpus) if gpus is not None \
            else [{} for _ in range(self.data_parallel_size or 1)]
        return DataParallelEngine(fake_worker, fake, envs, model_id=self.model_name(),
                                  window=self.window or 64, batch=16)
