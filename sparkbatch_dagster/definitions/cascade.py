"""A job's cascade (``JobSpec.cascade``) on the job's ``VLLMResource``: one resource per stage,
the cascade's identity, and its engine (``run/cascade.py``).

A stage without a model is the job's resource itself; the others are that resource with the
stage's model and engine settings (as the estimate builds a candidate's). On a GPU the stages'
engines stay up together for the run, so each gets an equal share of the memory fraction the
job's resource has (``gpu_memory_utilization``). The cascade's identity, which names the output
version and the job's own answers in the result store, is made of every stage's identity and
threshold: ``cascade(SmolLM2-135M-Instruct@3f2a<0.8, gemma-3-270m@9c1d)``. Example::

    plan = CascadePlan(spec, resource)
    engine = LazyEngine(plan.model_id, plan.start)   # the stages start when they are needed
    ...
    plan.close()
"""

from __future__ import annotations

from typing import Any

from ..engines.base import Engine
from ..home import JobHome
from ..run.cascade import CascadeEngine, Stage
from ..run.result_store import open_store
from ..spec import JobSpec
from .resource import VLLMResource


def stage_resources(spec: JobSpec, resource: VLLMResource) -> list[VLLMResource]:
    """The resource of each stage of ``spec.cascade``, in order."""
    out: list[VLLMResource] = []
    share = _memory_share(resource, len(spec.cascade))
    for stage in spec.cascade:
        candidate = stage.candidate()
        res = resource if candidate is None else resource.with_model(candidate.model, candidate.engine_kwargs or None)
        if share is not None:
            res = res.with_fields(gpu_memory_utilization=share)
        out.append(res)
    return out


def _memory_share(resource: VLLMResource, stages: int) -> float | None:
    """Each stage's share of the GPU memory fraction; None on the CPU (each engine has its own
    KV cache size there, ``kv_cache_memory_gb``) and with a fixed KV cache size."""
    from ..engines import settings

    if settings.on_cpu() or resource.kv_cache_memory_gb is not None:
        return None
    whole = resource.gpu_memory_utilization or float(settings.platform_default("gpu_memory_utilization"))
    return round(whole / stages, 4)


def identity(spec: JobSpec, names: list[str]) -> str:
    """The cascade's identity from its stages' identities and thresholds."""
    parts = [f"{name}<{stage.below:g}" if stage.below is not None else name for name, stage in zip(names, spec.cascade,
                                                                                                      strict=True)]
    return f"cascade({', '.join(parts)})"


def model_identity(spec: JobSpec, resource: VLLMResource) -> str:
    """Who answers a job's rows: the resource's model, or the cascade (:func:`identity`)."""
    if not spec.cascade:
        return resource.model_identity()
    return identity(spec, [res.model_identity() for res in stage_resources(spec, resource)])


class CascadePlan:
    """A run's cascade: its stage resources, identity and engine (started lazily, stage by stage)."""

    def __init__(self, spec: JobSpec, resource: VLLMResource, home: JobHome | None = None,
                 log: Any = None) -> None:
        self.spec, self.resource, self.home, self.log = spec, resource, home, log
        self.resources = stage_resources(spec, resource)
        self.names = [res.model_identity() for res in self.resources]
        self.model_id = identity(spec, self.names)
        if home is not None and log is not None:
            for res in self.resources:
                res.use_home(home, log)
        self.engine: CascadeEngine | None = None

    def start(self) -> Engine:
        """The cascade's engine; each stage's own engine starts on the first row its store lacks."""
        stages = [Stage(name, res.get_engine, res.close, stage.below,
                        open_store(self.spec, self.home, name) if self.home is not None else None)
                  for name, res, stage in zip(self.names, self.resources, self.spec.cascade, strict=True)]
        self.engine = CascadeEngine(self.model_id, stages, self.spec)
        return self.engine

    def cold_starts(self) -> int:
        """Engines the stage resources started (the job's own resource counted once)."""
        return sum(res.cold_starts() for res in {id(r): r for r in self.resources}.values())

    def close(self) -> None:
        """The run's end: every stage's engine stops (a keep_warm resource keeps its own), and the
        log says how many rows each stage answered."""
        if self.engine is not None:
            if self.log is not None and any(self.engine.answered.values()):
                self.log.info("cascade: rows answered in this run, by stage: " + ", ".join(
                    f"{name} {n}" for name, n in self.engine.answered.items()))
            self.engine.close()
