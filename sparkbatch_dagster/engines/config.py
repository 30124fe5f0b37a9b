"""The engine's settings: declared once (:class:`EngineConfig`, the fields ``VLLMResource``
inherits), and resolved once (:class:`EngineSettings`, what every backend is handed as is).

``VLLMResource`` is ``ConfigurableResource`` plus :class:`EngineConfig`: a field added here is a
resource field, in its Dagster schema and the component's YAML, and reaches the engines with
nothing copied by name. ``VLLMResource.engine_settings()`` resolves the fields (EnvVars read, the
platform's defaults applied) into one frozen :class:`EngineSettings`, which ``engines/start.py``
hands to the offline engine, the data-parallel workers (it pickles), the server client, the
`vllm serve` it starts and ``sparkbatch worker-node``; each backend reads what it needs. Example::

    cfg = EngineSettings(model="m", engine="server", max_num_seqs=64, endpoints=("http://127.0.0.1:8000",))
    cfg.in_flight(), cfg.label_decoding   # 256 requests per server, "auto"
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..errors import ConfigError
from . import settings


class EngineConfig(BaseModel):
    """The engine's settings as a user writes them: ``VLLMResource``'s fields, except its own
    lifecycle's (``keep_warm``, ``compile_cache``). Their docs are the resource's docs."""

    model_config = ConfigDict(frozen=True)

    model: str | None = Field(
        default=None, description="Local HF folder, hub name, or embedded model name (SmolLM2-135M-Instruct, "
        "gemma-3-270m); None = the embedded SmolLM2. From the environment: EnvVar(\"MY_MODEL\") or {{ env.MY_MODEL }}.",
    )
    engine: Literal["offline", "server"] = Field(
        default="offline", description="offline: vllm.LLM in this process; server: an OpenAI-compatible endpoint "
        "(server_url or server_urls, or `vllm serve` started here).",
    )
    gpu_memory_utilization: float | None = Field(
        default=None, gt=0.0, le=0.98, description="Fraction of GPU memory (of RAM on the CPU backend) vLLM may use. "
        "None = resolved when the engine starts: 0.9 on a GPU, 0.3 on the CPU backend; on a unified-memory GPU "
        "(DGX Spark) the KV cache is sized in bytes from the free memory instead, and a set value more than that "
        "memory can give is refused before loading.",
    )
    kv_cache_memory_gb: float | None = Field(
        default=None, gt=0.0, description="Exact KV cache size in GiB (per GPU); wins over gpu_memory_utilization. "
        "Refused before loading when the free memory cannot give it (CPU backend, unified memory).",
    )
    memory_reserve_gb: float | None = Field(
        default=None, ge=1.0, le=64.0, description="Unified-memory GPU (DGX Spark): GiB of MemAvailable kept for the "
        "OS, Dagster and this process when the KV cache is sized. None = 8: measured here, a run process peaks near "
        "0.3 GiB and `dagster dev` holds about 0.7 GiB; DGX OS's own share could not be measured, so the default keeps "
        "a wide margin. Ignored elsewhere.",
    )
    max_num_seqs: int | None = Field(
        default=None, ge=1, le=16384, description="Sequences vLLM batches at once. None = resolved when the engine "
        "starts: 1024 on a GPU (and for a server_url someone else runs), 256 on the CPU backend.",
    )
    max_model_len: int | None = Field(
        default=None, ge=16, description="Context length; None = the model's. Part of the model identity."
    )
    enable_prefix_caching: bool = Field(default=True, description="Reuse the KV cache of the shared template.")
    tensor_parallel_size: int = Field(default=1, ge=1, le=64, description="GPUs one model is split over.")
    data_parallel_size: int | None = Field(
        default=None, ge=1, le=64, description="Engines this run drives, one per group of tensor_parallel_size GPUs. "
        "Offline: each in its own process with its own CUDA_VISIBLE_DEVICES; the run's partitions stream across all "
        "of them. A `vllm serve` started here: its --data-parallel-size (vLLM's own engines behind one endpoint). "
        "None = one per visible GPU group (CUDA_VISIBLE_DEVICES, else every GPU), 1 on the CPU backend. Speed only: "
        "the answers and the model identity stay the same.",
    )
    label_decoding: Literal["auto", "grammar"] = Field(
        default="auto", description="auto: a label job decoded greedily whose labels each begin with a token of "
        "their own (none spelling the start of another label) gets one decode step with only those tokens allowed, "
        "instead of vLLM's choice grammar (docs/engine.md: speed, and the answers against the grammar's); other "
        "label sets keep the grammar. Server mode needs the tokenizer here (server_token_ids). grammar: always the "
        "grammar.",
    )
    dtype: str = Field(default="auto", description="Weights' dtype for vLLM (auto, bfloat16, float16, float32). "
                       "auto = the model's own, except float32 on a CPU without native bf16 (no avx512_bf16 / "
                       "amx_bf16), where bf16 runs on slow fallback kernels; preview, the estimate and the run's log "
                       "say which was chosen and why.")
    window: int | None = Field(
        default=None, ge=1, description="Offline: requests queued in the engine; None = 16 x max_num_seqs."
    )
    engine_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="More vllm.LLM arguments (`vllm serve` flags in server mode), passed as "
        "they are; keys outside THROUGHPUT_ONLY are part of the model identity (trust_remote_code with the "
        "folder's Python files; chat_template, tokenizer and generation_config by the bytes of the file or "
        "folder they name).",
    )
    server_url: str | None = Field(
        default=None, description="engine='server': a running server's base URL; None (and no server_urls) starts "
        "`vllm serve` here."
    )
    server_urls: list[str] = Field(
        default_factory=list, description="engine='server': several running servers' base URLs (one per GPU or "
        "machine), all serving model=; instead of server_url. Each gets up to max_in_flight requests, the next one "
        "goes to the server with the fewest in flight, and a server that dies mid-run has its rows re-sent to the "
        "others.",
    )
    api_key: str | None = Field(
        default=None, description="engine='server': the server's API key. Pass EnvVar(\"MY_KEY\") (Python) or "
        "{{ env.MY_KEY }} (YAML); never a literal key in code.",
    )
    max_in_flight: int | None = Field(
        default=None, ge=1, description="Server requests in flight, per server; None = 4 x max_num_seqs x its engines."
    )
    request_timeout_s: float = Field(default=600.0, gt=0, description="Server mode: seconds to wait for one answer.")
    server_token_ids: bool | None = Field(
        default=None, description="Server mode: apply the model's chat template and tokenizer in this process and "
        "send token ids to /v1/completions (the server then neither renders nor tokenizes); needs the tokenizer "
        "folder the server loaded (its /v1/models root) readable here. Off: messages to /v1/chat/completions. "
        "None: on for a `vllm serve` started here (unless engine_kwargs sets its chat_template), off for "
        "server_url(s).",
    )
    server_prompts_per_request: int | None = Field(
        default=None, ge=1, le=256, description="Server mode with server_token_ids: rows that start together go "
        "as one /v1/completions request of up to this many prompts, each row still answered, retried and failed "
        "on its own. None: 16 for a `vllm serve` started here, 1 for server_url(s) (set it for a vLLM server: it "
        "must answer each choice's token_ids, which vLLM's return_token_ids gives).",
    )
    max_retries: int = Field(default=5, ge=0, le=20, description="Server mode: retries on 429/5xx/connection errors.")
    server_start_timeout_s: float = Field(
        default=900.0, gt=0, description="Seconds a `vllm serve` started here may take to become healthy."
    )
    engine_start_timeout_s: float = Field(
        default=1800.0, gt=0, description="Offline: seconds the engine may take to start (loading, compiling and, "
        "with nnodes, the other machines' workers joining); then it is stopped and the run fails, naming the fix.",
    )


class EngineSettings(EngineConfig):
    """One engine's settings, resolved: built once by ``VLLMResource.engine_settings()``, frozen,
    and handed as is to whichever backend starts (it pickles: the data-parallel workers get it).

    Its :class:`EngineConfig` fields are the resource's, EnvVars read; ``max_num_seqs`` is the
    platform's default where the resource left it unset. The start hands the backend a copy with
    ``model`` resolved to what loads and ``llm_kwargs`` sized for this machine's memory
    (:meth:`started`). Example::

        cfg = VLLMResource(max_num_seqs=64).engine_settings()
        cfg.model_name(), cfg.engine_count
        engine = start(cfg)
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_num_seqs: int = Field(default=int(settings.GPU_DEFAULTS["max_num_seqs"]), ge=1)  # type: ignore[assignment]
    #: Running servers' base URLs (server_url or server_urls); empty when this process starts the engine.
    endpoints: tuple[str, ...] = ()
    #: ``vllm.LLM`` arguments (``vllm serve`` flags in server mode), engine_kwargs included.
    llm_kwargs: dict[str, Any] = Field(default_factory=dict)
    #: What changes answers besides the weights: dtype, max_model_len, answer-changing engine_kwargs.
    answer_settings: dict[str, Any] = Field(default_factory=dict)

    @property
    def engine_count(self) -> int:
        """Engines a run of these settings drives at once: one per server of ``endpoints``; for a
        `vllm serve` started here its --data-parallel-size, counted as offline mode counts engines
        (engine_kwargs' own data_parallel_size wins; one engine over machines runs alone);
        offline, one per GPU group."""
        if self.endpoints:
            return len(self.endpoints)
        return self._served_engines() if self.engine == "server" else len(self.engine_envs())

    def _served_engines(self) -> int:
        kwargs = self.llm_kwargs
        if "data_parallel_size" in kwargs:
            return int(kwargs["data_parallel_size"])
        if settings.nodes(kwargs) > 1:
            return 1
        return len(settings.data_parallel_envs(self.data_parallel_size, settings.local_share(kwargs)))

    def engine_envs(self) -> list[dict[str, str]]:
        """The environment of each engine started here: one per data-parallel GPU group (offline
        mode; one engine when it spans machines or is a server started here)."""
        kwargs = self.llm_kwargs
        share, nodes = settings.local_share(kwargs), settings.nodes(kwargs)
        if self.engine != "offline" and nodes == 1 and settings.on_cpu():
            # vLLM starts a server's data-parallel engines from its one environment: every engine's
            # cores in one binding, "|" between ranks, data-parallel rank first, as vLLM splits it.
            # (Its own "auto" binds them all to one core: two engines warmed up in 281 s, one in 39 s.)
            each = settings.data_parallel_envs(self._served_engines(), share)
            return [{key: "|".join(env[key] for env in each) for key in each[0]}]  # none when the user binds
        # A server started here is one engine; so is one that spans machines (a worker node serves one).
        alone = self.engine != "offline" or nodes > 1
        return settings.data_parallel_envs(1 if alone else self.data_parallel_size, share)

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
        return settings.visible_gpus()[:self.engine_count * settings.local_share(self.llm_kwargs)]

    def model_name(self) -> str:
        """What the engine will load, resolved (the embedded default is converted if needed), or
        the served model name for running servers."""
        if self.endpoints:
            if not self.model:
                raise ConfigError("engine='server' with server_url(s) needs model= (the served model name)")
            return self.model
        from .platform.model import resolve_model

        return resolve_model(self.model)

    def checked_api_key(self) -> str | None:
        """Server mode's API key, refused when its variable is set but empty."""
        if self.engine != "server" or self.api_key is None:
            return None
        if not self.api_key:
            raise ConfigError("VLLMResource.api_key is empty (its environment variable is set to ''): set it to "
                              "the server's key, or leave api_key unset for a server without one")
        return self.api_key

    def sampling_defaults(self) -> dict[str, Any]:
        """What the model's own generation config adds to every request (both modes apply it);
        nothing for servers someone else runs, whose own config and identity are theirs."""
        if self.endpoints:
            return {}
        from .platform.model import generation_defaults

        return generation_defaults(self.model_name())

    def in_flight(self, engines: int = 1) -> int:
        """Requests the server client keeps in flight per server: by default enough to keep every
        engine's batch full (a server with data parallel has several)."""
        return self.max_in_flight or 4 * self.max_num_seqs * engines

    def queue(self) -> tuple[int, int]:
        """The offline engine's (window, chunk): requests queued in the engine (a deep queue: it
        never waits for this process to hand it the next ones), and requests encoded per call."""
        return self.window or 16 * self.max_num_seqs, max(1, self.max_num_seqs // 2)

    def started(self, model: str, llm_kwargs: dict[str, Any]) -> EngineSettings:
        """These settings as the start hands them to a backend: ``model`` resolved (the folder
        that loads), ``llm_kwargs`` sized for this machine's memory."""
        return self.model_copy(update={"model": model, "llm_kwargs": llm_kwargs})
