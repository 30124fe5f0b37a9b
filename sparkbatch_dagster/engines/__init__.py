"""Engines: one small interface (:class:`Engine`), several backends, and how one starts.

Top-level modules, the base every sub-room builds on:

- :mod:`.base`: the interface, the request and result types, and :class:`LazyEngine` (its start in a thread);
- :mod:`.config`: the engine's settings, declared once (the resource's fields) and resolved once, handed whole;
- :mod:`.settings`: what a resource's settings become on this machine: platform defaults, the memory check;
- :mod:`.gpu_lock`: one engine per GPU on the box;
- :mod:`.fake`: a deterministic engine for tests;
- :mod:`.start`: which backend starts, from the resolved settings.

Sub-rooms, bottom to top (each ``__init__`` lists its modules):

- :mod:`.platform`: the machine: memory, CPU, processes, model files, compile cache; no engine;
- :mod:`.answers`: what an answer is made of, for any backend: labels, confidence, reasoning, sampling;
- :mod:`.offline`: the offline backend, ``vllm.LLM`` in this process or one per data-parallel GPU group;
- :mod:`.server`: the server backend, a client of ``vllm serve`` (running, or started here).

``platform`` imports nothing else of ``engines``; the base builds on it, ``answers`` on both, the
backends (``fake``, ``offline``, ``server``) on all three and never on each other, ``start`` on
them all (``tests/unit/test_layout.py``).

May import: ``errors``, ``spec``, ``home``. Backends import vllm lazily, so importing this
package never loads vllm or torch.
"""

from .base import Engine, EngineRequest, EngineResult, LazyEngine
from .fake import FakeEngine

__all__ = ["Engine", "EngineRequest", "EngineResult", "FakeEngine", "LazyEngine"]
