"""Engines: one small interface (:class:`Engine`), several backends, and how one starts.

Owns the interface and the lazy wrapper (:mod:`.base`; the start in a thread of its own), where a
labeling step's time goes, by named part (:mod:`.spans`), the resolved settings an engine starts
from and the start itself (:mod:`.start`: a client of running servers, a `vllm serve` started
here, offline vLLM, one engine per data-parallel GPU group), the backends (:mod:`.vllm_offline`,
:mod:`.data_parallel` + :mod:`.worker_process`, :mod:`.vllm_server` with :mod:`.endpoints`,
:mod:`.replicas`, :mod:`.token_prompts`, :mod:`.server_process`, :mod:`.vllm_cli`; :mod:`.fake`
for tests), the platform's defaults and memory check (:mod:`.settings`), memory on a unified-memory
GPU such as the DGX Spark's GB10, sized from what is free when the engine starts (:mod:`.memory`),
the model (:mod:`.model`: embedded models, identity, weight sizes), one engine over several
machines (:mod:`.multinode`), one engine per GPU on the box (:mod:`.gpu_lock`) and the compile
cache's folder, key and archive on this machine (:mod:`.compile_cache`).

May import: ``errors``, ``spec``, ``home``. Backends import vllm lazily, so importing this
package never loads vllm or torch.
"""

from .base import Engine, EngineRequest, EngineResult, LazyEngine
from .fake import FakeEngine

__all__ = ["Engine", "EngineRequest", "EngineResult", "FakeEngine", "LazyEngine"]
