"""Starting the engine a ``VLLMResource`` describes: a client of running servers, a `vllm serve`
started here, or the offline engine (one, or one per data-parallel GPU group).

Everything is checked before a model loads (API key, multi-node settings, memory), and the
rows' model identity is fixed before the engine answers anything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import multinode
from .engines import settings
from .engines.base import Engine
from .errors import ConfigError

if TYPE_CHECKING:
    from .engines.vllm_server import VLLMServerEngine
    from .resources import VLLMResource


def start(cfg: VLLMResource) -> Engine:
    """The engine of ``cfg`` (a resource whose EnvVars are read), started."""
    key = api_key(cfg)  # before any process starts: a missing key must not leak a server
    if urls := cfg._endpoints():
        from .engines.endpoints import served_identity

        engine = client(cfg, urls, cfg.model_name(), key)
        engine.model_id = served_identity(engine.served)  # the preflight checked every server
        return engine
    kwargs = cfg.llm_kwargs()
    multinode.check(kwargs, cfg.tensor_parallel_size, cfg.data_parallel_size)
    # One engine per GPU group (data_parallel_size), checked before any model is loaded.
    envs = cfg.engine_envs(kwargs)
    engines = cfg._server_data_parallel(kwargs) if cfg.engine == "server" else len(envs)
    model = cfg.model_name()
    settings.check_memory(kwargs, copies=engines)
    settings.prepare_platform()
    name = cfg.model_identity()  # rows name the model the same way on every machine
    if cfg.engine == "server":
        from .engines.server_process import ServerProcess, serve_args

        serve = {**kwargs, "data_parallel_size": engines} if engines > 1 else kwargs
        with settings.environment(envs[0]):  # `vllm serve` inherits it (CPU core binding)
            server = ServerProcess(model, name, serve_args(serve), cfg.server_start_timeout_s)
        return client(cfg, server.url, name, key, server, engines)
    offline = _offline(cfg, model, kwargs, envs)
    offline.model_id = name
    return offline


def _offline(cfg: VLLMResource, model: str, kwargs: dict[str, Any], envs: list[dict[str, str]]) -> Engine:
    from .engines.vllm_offline import VLLMOfflineEngine

    # A deep queue: the engine never waits for this process to hand it the next requests.
    seqs = cfg.resolved_max_num_seqs()
    window, chunk = cfg.window or 16 * seqs, max(1, seqs // 2)
    if len(envs) > 1:  # the same engine in a process per GPU group, one stream across them
        from .engines.data_parallel import DataParallelEngine, offline_worker

        worker = {"model": model, "llm_kwargs": kwargs, "window": window, "chunk": chunk,
                  "start_timeout_s": cfg.engine_start_timeout_s}
        return DataParallelEngine(offline_worker, worker, envs, window=window + 2 * chunk, batch=chunk)
    with settings.environment(envs[0]):  # the engine core and its workers inherit it (CPU core binding)
        return VLLMOfflineEngine(model, kwargs, window=window, chunk=chunk, start_timeout_s=cfg.engine_start_timeout_s)


def api_key(cfg: VLLMResource) -> str | None:
    """Server mode's API key, refused when its variable is set but empty."""
    if cfg.engine != "server" or cfg.api_key is None:
        return None
    if not cfg.api_key:
        raise ConfigError("VLLMResource.api_key is empty (its environment variable is set to ''): set it to "
                          "the server's key, or leave api_key unset for a server without one")
    return str(cfg.api_key)


def default_token_ids(cfg: VLLMResource, started_here: bool) -> bool:
    """What ``server_token_ids=None`` means for a server: on for one started here, off for others.

    A server started here has its tokenizer folder on this machine and renders with the model's
    own template (unless ``engine_kwargs`` gives it another), so the ids are the ones it would
    make, and its one HTTP frontend process then neither renders nor tokenizes (on an H200, 1B
    shape: 0.99 of the offline pipeline with ids, 0.70 with chat bodies, same run). Someone
    else's server may not have its tokenizer here.
    """
    return started_here and "chat_template" not in cfg.engine_kwargs


def client(cfg: VLLMResource, url: str | list[str], name: str, key: str | None, server: Any = None,
           engines: int = 1) -> VLLMServerEngine:
    """The server-mode client of ``url`` (one server or several), ``server`` the process we own."""
    from .engines.vllm_server import VLLMServerEngine

    token_ids = cfg.server_token_ids
    if token_ids is None:
        token_ids = default_token_ids(cfg, started_here=server is not None)
    # The default keeps every engine's batch full (a server with data parallel has several).
    return VLLMServerEngine(url, name, api_key=key, max_in_flight=cfg.max_in_flight
                            or 4 * cfg.resolved_max_num_seqs() * engines, timeout_s=cfg.request_timeout_s,
                            max_retries=cfg.max_retries, server=server, token_ids=token_ids)
