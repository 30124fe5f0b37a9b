"""Engines: one small interface (:class:`Engine`), several backends.

Backends are imported lazily by :func:`sparkbatch_dagster.resources.VLLMResource` so that
importing this package never loads vllm or torch.
"""

from .base import Engine, EngineRequest, EngineResult, LazyEngine
from .fake import FakeEngine

__all__ = ["Engine", "EngineRequest", "EngineResult", "FakeEngine", "LazyEngine"]
