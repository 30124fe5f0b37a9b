"""Starting an engine from one resolved settings object: a client of running servers, a `vllm
serve` started here, or the offline engine (one, or one per data-parallel GPU group).

:class:`EngineSettings` is what a ``VLLMResource`` resolves to (its EnvVars read, the embedded
model converted, the platform's defaults applied), frozen; the start reads nothing else. What
is derived from it (the engine count, each engine's environment, the model identity) is
computed here once, for the start and for the resource alike.

Everything is checked before a model loads (API key, multi-node settings, memory), and the
rows' model identity is fixed before the engine answers anything.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..errors import ConfigError
from . import memory, multinode, settings
from .base import Engine

if TYPE_CHECKING:
    from .vllm_server import VLLMServerEngine


def engine_envs(mode: str, kwargs: Mapping[str, Any], data_parallel_size: int | None) -> list[dict[str, str]]:
    """The environment of each engine a run starts here: one per data-parallel GPU group
    (offline mode; one engine when it spans machines or is a server started here)."""
    share, nodes = multinode.local_share(kwargs), multinode.nodes(kwargs)
    if mode != "offline" and nodes == 1 and settings.on_cpu():
        # vLLM starts a server's data-parallel engines from its one environment: every engine's
        # cores in one binding, "|" between ranks, data-parallel rank first, as vLLM splits it.
        # (Its own "auto" binds them all to one core: two engines warmed up in 281 s, one in 39 s.)
        each = settings.data_parallel_envs(engine_count(mode, (), kwargs, data_parallel_size), share)
        return [{key: "|".join(env[key] for env in each) for key in each[0]}]  # none when the user binds
    # A server started here is one engine; so is one that spans machines (a worker node serves one).
    alone = mode != "offline" or nodes > 1
    return settings.data_parallel_envs(1 if alone else data_parallel_size, share)


def engine_count(mode: str, endpoints: Sequence[str], kwargs: Mapping[str, Any], data_parallel_size: int | None) -> int:
    """Engines a run drives at once: one per server of ``endpoints``; for a `vllm serve` started
    here its --data-parallel-size, counted as offline mode counts engines (engine_kwargs' own
    data_parallel_size wins; one engine over machines runs alone); offline, one per GPU group."""
    if endpoints:
        return len(endpoints)
    if mode == "server":
        if "data_parallel_size" in kwargs:
            return int(kwargs["data_parallel_size"])
        if multinode.nodes(kwargs) > 1:
            return 1
        return len(settings.data_parallel_envs(data_parallel_size, multinode.local_share(kwargs)))
    return len(engine_envs(mode, kwargs, data_parallel_size))


@dataclass(frozen=True)
class EngineSettings:
    """One engine's settings, resolved: built by ``VLLMResource.engine_settings()``.

    Example::

        settings = VLLMResource(max_num_seqs=64).engine_settings()
        settings.model_name(), settings.engine_count, settings.model_identity()
        engine = start(settings)
    """

    mode: Literal["offline", "server"]
    #: As configured: a local folder, a hub name, an embedded model's name (None: the embedded
    #: default), or the name running servers serve; :meth:`model_name` resolves it.
    model: str | None
    #: Running servers' base URLs; empty when this process starts the engine.
    endpoints: tuple[str, ...]
    #: ``vllm.LLM`` arguments (``vllm serve`` flags in server mode), engine_kwargs included.
    llm_kwargs: Mapping[str, Any]
    #: What changes answers besides the weights: dtype, max_model_len, answer-changing engine_kwargs.
    answer_settings: Mapping[str, Any]
    engine_kwargs: Mapping[str, Any]
    max_num_seqs: int
    tensor_parallel_size: int = 1
    data_parallel_size: int | None = None
    window: int | None = None
    api_key: str | None = None
    max_in_flight: int | None = None
    request_timeout_s: float = 600.0
    max_retries: int = 5
    server_token_ids: bool | None = None
    server_prompts_per_request: int | None = None
    server_start_timeout_s: float = 900.0
    engine_start_timeout_s: float = 1800.0
    #: As configured (None: the platform's default, already in :attr:`llm_kwargs`): on unified
    #: memory a configured fraction is checked against the free memory, an unset one is sized.
    gpu_memory_utilization: float | None = None
    #: GiB kept out of an engine's reach on unified memory; None = ``memory.DEFAULT_RESERVE_GB``.
    memory_reserve_gb: float | None = None
    #: "auto": labels decoded in one step where their first tokens tell them apart
    #: (``label_tokens``); "grammar": vLLM's choice grammar always.
    label_decoding: str = "auto"

    @property
    def engine_count(self) -> int:
        """Engines a run of these settings drives at once (see :func:`engine_count`)."""
        return engine_count(self.mode, self.endpoints, self.llm_kwargs, self.data_parallel_size)

    def model_name(self) -> str:
        """What the engine will load, resolved (the embedded default is converted if needed), or
        the served model name for running servers."""
        if self.endpoints:
            if not self.model:
                raise ConfigError("engine='server' with server_url(s) needs model= (the served model name)")
            return self.model
        from .model import resolve_model

        return resolve_model(self.model)

    def engine_envs(self) -> list[dict[str, str]]:
        """The environment of each engine started here (see :func:`engine_envs`)."""
        return engine_envs(self.mode, self.llm_kwargs, self.data_parallel_size)

    def devices(self) -> list[str]:
        """What an engine of these settings occupies on this box, named for its lock
        (``engines/gpu_lock.py``): the visible GPUs its engines use, in order, as
        ``CUDA_VISIBLE_DEVICES`` names them; ``cpu0`` on the CPU backend (two engines there fight
        for the same cores); nothing for servers someone else runs."""
        if self.endpoints:
            return []
        if settings.on_cpu():
            return ["cpu0"]
        # data_parallel_size engines of this machine's tensor-parallel share each (as they are split).
        return settings.visible_gpus()[:self.engine_count * multinode.local_share(self.llm_kwargs)]

    def checked_api_key(self) -> str | None:
        """Server mode's API key, refused when its variable is set but empty."""
        if self.mode != "server" or self.api_key is None:
            return None
        if not self.api_key:
            raise ConfigError("VLLMResource.api_key is empty (its environment variable is set to ''): set it to "
                              "the server's key, or leave api_key unset for a server without one")
        return self.api_key

    def model_identity(self) -> str:
        """Who answers: ``<name>@<hash>`` over the weights, tokenizer, chat template and
        :attr:`answer_settings`; for servers someone else runs, what their ``/v1/models`` says
        they serve (every one must serve that model)."""
        if self.endpoints:
            from .endpoints import check_endpoints, served_identity

            return served_identity(check_endpoints(list(self.endpoints), self.model_name(), self.checked_api_key())[0])
        from .model import model_identity

        return model_identity(self.model_name(), dict(self.answer_settings))

    def sampling_defaults(self) -> dict[str, Any]:
        """What the model's own generation config adds to every request (both modes apply it);
        nothing for servers someone else runs, whose own config and identity are theirs."""
        if self.endpoints:
            return {}
        from .model import generation_defaults

        return generation_defaults(self.model_name())


def start(cfg: EngineSettings) -> Engine:
    """The engine ``cfg`` describes, started."""
    key = cfg.checked_api_key()  # before any process starts: a missing key must not leak a server
    prompts_per_request(cfg, started_here=not cfg.endpoints)  # a wrong setting too
    if cfg.endpoints:
        from .endpoints import served_identity

        engine = client(cfg, list(cfg.endpoints), cfg.model_name(), key)
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
    name = cfg.model_identity()  # rows name the model the same way on every machine
    # Memory is read last, right before loading: the identity's hashing (a cold one reads every
    # weight file) leaves no page cache behind (home/digests.py), and nothing else runs between.
    kwargs, note = sized_memory(cfg, kwargs, model, engines)
    if cfg.mode == "server":
        from .server_process import ServerProcess, batch_server_defaults, serve_args

        serve = {**kwargs, "data_parallel_size": engines} if engines > 1 else kwargs
        serve = batch_server_defaults(serve, cpu=settings.on_cpu(), cores=settings.usable_cores(), engines=engines,
                                      nodes=multinode.nodes(serve))
        with settings.environment(envs[0]):  # `vllm serve` inherits it (CPU core binding)
            server = ServerProcess(model, name, serve_args(serve), cfg.server_start_timeout_s,
                                   connections=in_flight(cfg, engines))
        served = client(cfg, server.url, name, key, server, engines)
        served.memory_note = note
        return served
    offline = _offline(cfg, model, kwargs, envs)
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
    from .model import weights_gb

    size = weights_gb(model)
    weights = None if size is None else int(size * 1e9 / multinode.nodes(kwargs))  # this machine's share
    kv = kwargs.get("kv_cache_memory_bytes")
    plan = memory.size_unified(dev, memory.host(), weights, reserve_gb=cfg.memory_reserve_gb,
                               fraction=cfg.gpu_memory_utilization, kv_cache_gb=None if kv is None else kv / memory.GIB,
                               copies=copies, ranks=multinode.local_share(kwargs))
    return plan.kwargs(kwargs), plan.note


def _offline(cfg: EngineSettings, model: str, kwargs: dict[str, Any], envs: list[dict[str, str]]) -> Engine:
    from .vllm_offline import VLLMOfflineEngine

    # A deep queue: the engine never waits for this process to hand it the next requests.
    seqs = cfg.max_num_seqs
    window, chunk = cfg.window or 16 * seqs, max(1, seqs // 2)
    if len(envs) > 1:  # the same engine in a process per GPU group, one stream across them
        from .data_parallel import DataParallelEngine, offline_worker

        worker = {"model": model, "llm_kwargs": kwargs, "window": window, "chunk": chunk,
                  "start_timeout_s": cfg.engine_start_timeout_s, "sampling_defaults": cfg.sampling_defaults(),
                  "label_decoding": cfg.label_decoding}
        return DataParallelEngine(offline_worker, worker, envs, window=window + 2 * chunk, batch=chunk)
    with settings.environment(envs[0]):  # the engine core and its workers inherit it (CPU core binding)
        return VLLMOfflineEngine(model, kwargs, window=window, chunk=chunk,
                                 start_timeout_s=cfg.engine_start_timeout_s,
                                 sampling_defaults=cfg.sampling_defaults(), label_decoding=cfg.label_decoding)


def default_token_ids(cfg: EngineSettings, started_here: bool) -> bool:
    """What ``server_token_ids=None`` means for a server: on for one started here, off for others.

    A server started here has its tokenizer folder on this machine and renders with the model's
    own template (unless ``engine_kwargs`` gives it another), so the ids are the ones it would
    make, and its one HTTP frontend process then neither renders nor tokenizes (on an H200, 1B
    shape: 0.99 of the offline pipeline with ids, 0.70 with chat bodies, same run). Someone
    else's server may not have its tokenizer here.
    """
    return started_here and "chat_template" not in cfg.engine_kwargs


def prompts_per_request(cfg: EngineSettings, started_here: bool) -> int:
    """What ``server_prompts_per_request=None`` means: ``PROMPTS_PER_REQUEST`` for a `vllm serve`
    started here that gets token ids (vLLM answers a list of prompts choice by choice, with each
    choice's token ids), one for servers someone else runs, which may not."""
    from .prompt_groups import PROMPTS_PER_REQUEST

    token_ids = cfg.server_token_ids if cfg.server_token_ids is not None else default_token_ids(cfg, started_here)
    size = cfg.server_prompts_per_request
    if size is None:
        return PROMPTS_PER_REQUEST if started_here and token_ids else 1
    if size > 1 and not token_ids:
        raise ConfigError(f"server_prompts_per_request={size} needs server_token_ids (several prompts go to "
                          "/v1/completions as token ids): set server_token_ids=True, or server_prompts_per_request=1")
    return size


def in_flight(cfg: EngineSettings, engines: int = 1) -> int:
    """Requests the client keeps in flight per server: by default enough to keep every engine's
    batch full (a server with data parallel has several)."""
    return cfg.max_in_flight or 4 * cfg.max_num_seqs * engines


def client(cfg: EngineSettings, url: str | list[str], name: str, key: str | None, server: Any = None,
           engines: int = 1) -> VLLMServerEngine:
    """The server-mode client of ``url`` (one server or several), ``server`` the process we own."""
    from .vllm_server import VLLMServerEngine

    token_ids = cfg.server_token_ids
    if token_ids is None:
        token_ids = default_token_ids(cfg, started_here=server is not None)
    return VLLMServerEngine(url, name, api_key=key, max_in_flight=in_flight(cfg, engines),
                            timeout_s=cfg.request_timeout_s, max_retries=cfg.max_retries, server=server,
                            token_ids=token_ids,
                            sampling_defaults=cfg.sampling_defaults() if server is not None else {},
                            label_decoding=cfg.label_decoding,
                            prompts_per_request=prompts_per_request(cfg, started_here=server is not None))
