"""Starting an engine from one resolved settings object: a client of running servers, a `vllm
serve` started here, or the offline engine (one, or one per data-parallel GPU group).

:class:`~.config.EngineSettings` is what a ``VLLMResource`` resolves to (its EnvVars read, the
embedded model converted, the platform's defaults applied), frozen; the start reads nothing
else, and hands it on whole (:meth:`~.config.EngineSettings.started`: the model resolved, the
KV cache sized) to the backend it starts.

Everything is checked before a model loads (API key, multi-node settings, memory), and the
rows' model identity is fixed before the engine answers anything.
"""

from __future__ import annotations

from typing import Any

from . import settings
from .base import Engine
from .config import EngineSettings
from .platform import memory
from .server import multinode


def model_identity(cfg: EngineSettings) -> str:
    """Who answers: ``<name>@<hash>`` over the weights, tokenizer, chat template and
    ``answer_settings``; for servers someone else runs, what their ``/v1/models`` says they serve
    (every one must serve that model)."""
    if cfg.endpoints:
        from .server.endpoints import check_endpoints, served_identity

        return served_identity(check_endpoints(list(cfg.endpoints), cfg.model_name(), cfg.checked_api_key())[0])
    from .platform.model import model_identity as identity

    return identity(cfg.model_name(), dict(cfg.answer_settings))


def start(cfg: EngineSettings) -> Engine:
    """The engine ``cfg`` describes, started."""
    from .server.prompt_groups import prompts_per_request
    from .server.vllm_server import VLLMServerEngine

    cfg.checked_api_key()  # before any process starts: a missing key must not leak a server
    prompts_per_request(cfg, started_here=not cfg.endpoints)  # a wrong setting too
    if cfg.endpoints:
        from .server.endpoints import served_identity

        engine = VLLMServerEngine(cfg, list(cfg.endpoints), cfg.model_name())
        engine.model_id = served_identity(engine.served)  # the preflight checked every server
        return engine
    kwargs = dict(cfg.llm_kwargs)
    multinode.check(kwargs, cfg.tensor_parallel_size, cfg.data_parallel_size)
    # One engine per GPU group (data_parallel_size), checked before any model is loaded.
    envs = cfg.engine_envs()
    engines = cfg.engine_count
    model = cfg.model_name()
    settings.check_memory(kwargs, copies=engines)
    settings.prepare_platform()
    name = model_identity(cfg)  # rows name the model the same way on every machine
    # Memory is read last, right before loading: the identity's hashing (a cold one reads every
    # weight file) leaves no page cache behind (home/digests.py), and nothing else runs between.
    kwargs, note = sized_memory(cfg, kwargs, model, engines)
    run = cfg.started(model, kwargs)
    if cfg.engine == "server":
        from .server.server_process import ServerProcess

        with settings.environment(envs[0]):  # `vllm serve` inherits it (CPU core binding)
            server = ServerProcess(run, name, engines)
        served = VLLMServerEngine(run, server.url, name, server, engines)
        served.memory_note = note
        return served
    offline = _offline(run, envs)
    offline.model_id, offline.memory_note = name, note
    return offline


def sized_memory(cfg: EngineSettings, kwargs: dict[str, Any], model: str, copies: int) -> tuple[dict[str, Any], str]:
    """``kwargs`` with the KV cache sized in bytes from the free memory on a unified-memory GPU
    (:func:`.memory.size_unified`), and the log line saying how; elsewhere as they are (a
    discrete GPU checks itself, the CPU backend was checked by ``settings.check_memory``)."""
    if settings.on_cpu():
        return kwargs, ""
    dev = memory.device()
    if dev is None or not dev.integrated:
        return kwargs, ""
    from .platform.model import weights_gb

    size = weights_gb(model)
    weights = None if size is None else int(size * 1e9 / settings.nodes(kwargs))  # this machine's share
    kv = kwargs.get("kv_cache_memory_bytes")
    plan = memory.size_unified(dev, memory.host(), weights, reserve_gb=cfg.memory_reserve_gb,
                               fraction=cfg.gpu_memory_utilization, kv_cache_gb=None if kv is None else kv / memory.GIB,
                               copies=copies, ranks=settings.local_share(kwargs))
    return plan.kwargs(kwargs), plan.note


def _offline(run: EngineSettings, envs: list[dict[str, str]]) -> Engine:
    if len(envs) > 1:  # the same engine in a process per GPU group, one stream across them
        from .offline.data_parallel import DataParallelEngine
        from .offline.worker_process import offline_worker

        window, chunk = run.queue()
        return DataParallelEngine(offline_worker, run, envs, window=window + 2 * chunk, batch=chunk)
    from .offline.vllm_offline import VLLMOfflineEngine

    with settings.environment(envs[0]):  # the engine core and its workers inherit it (CPU core binding)
        return VLLMOfflineEngine(run)
