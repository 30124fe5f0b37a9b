"""``VLLMResource``: owns the engine's lifecycle for one Dagster run, nothing else.

The engine starts lazily on the first prompt that needs generating (a run whose partitions are
all done, or whose answers are all in the result store, never pays the minute of engine
start), is reused by every partition of the run, and is shut down in
``teardown_after_execution`` (or kept warm for the next run in this process: ``keep_warm``).
While it lives it holds its GPUs' locks (``engines/gpu_lock.py``): one engine per GPU on the box.
The resource stays plain settings: :meth:`VLLMResource.engine_settings` resolves them into the
one frozen value the engines room starts from (``engines/start.py``); what they become for vLLM
lives there too (``engines/settings.py``, ``engines/server_process.py``), model conversion and
identity in ``engines/model.py``. Unit tests inject a fake engine with
``sparkbatch_dagster.testing.FakeVLLMResource``, a class of its own.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import logging
from collections.abc import Callable
from typing import Any, Literal

from dagster import ConfigurableResource, EnvVar, InitResourceContext
from pydantic import Field, PrivateAttr
from typing_extensions import Self

from ..engines import settings
from ..engines.base import Engine
from ..engines.endpoints import configured_urls
from ..engines.gpu_lock import HeldEngine
from ..engines.model import THROUGHPUT_ONLY, answer_settings
from ..engines.settings import on_cpu
from ..engines.start import EngineSettings, start
from ..errors import ConfigError
from ..run.progress import tell
from .compile_cache import for_resource

__all__ = ["THROUGHPUT_ONLY", "VLLMResource", "close_warm_engines", "on_cpu"]

#: Engines kept warm between runs of this process (``keep_warm``), by settings; each is reused
#: only while it answers as the model the settings give now (its ``model_id``).
_WARM: dict[str, HeldEngine] = {}
#: What ``EnvVar("X")`` and ``EnvVar.int("X")`` leave in a field until a run reads them.
_ENV_VARS = (EnvVar, type(EnvVar.int("_")))


@atexit.register
def close_warm_engines() -> None:
    """Shut down every engine kept warm by ``keep_warm=True`` resources (also run at exit)."""
    while _WARM:
        _WARM.popitem()[1].close()


class VLLMResource(ConfigurableResource):  # type: ignore[misc]
    """vLLM tuned for a dedicated box; one definition serves a GPU and the CPU backend alike
    (settings left at None are resolved for the platform when the engine starts).

    Example::

        Definitions(assets=job.assets, resources={"vllm": VLLMResource(model=EnvVar("MY_MODEL"))})

    ``model`` left unset uses the embedded SmolLM2-135M-Instruct.
    """

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
    keep_warm: bool = Field(
        default=False, description="Keep the engine running after a run, for the next run in this process "
        "with the same settings and model files (notebooks, test sessions): one engine start instead of one per "
        "run. It keeps its GPUs too: another run's engine on them waits until shutdown() or this process ends.",
    )
    compile_cache: bool = Field(
        default=True, description="Keep the engine's compile cache (vLLM's torch.compile, Inductor's and Triton's) "
        "in the job's home, one archive per vLLM build, device, model, dtype and compiled settings: a new machine "
        "restores it before its engine starts instead of compiling (an H200's first start: 76 s cold, 15 s warm), "
        "and a start that compiled saves it. Costs the archive's room in the home and one upload per new key "
        "(docs/engine.md). False: vLLM's and torch's own caches on this machine only.",
    )

    _held: HeldEngine | None = PrivateAttr(default=None)
    _cold_starts: int = PrivateAttr(default=0)
    _run_id: str | None = PrivateAttr(default=None)  # in the GPU lock: whose engine another run waits for
    _warn: Callable[[str], None] | None = PrivateAttr(default=None)  # the run's log (outside a run: logging)
    _cache_home: tuple[Any, Any] | None = PrivateAttr(default=None)  # (home, log) from use_home
    _cache_run: Any = PrivateAttr(default=None)  # the compile cache of this resource's cold start

    # --- lifecycle ---------------------------------------------------------------------------

    def setup_for_execution(self, context: InitResourceContext) -> None:
        self._held, self._cache_home, self._cache_run = None, None, None
        self._run_id = context.run_id
        self._warn = context.log.warning if context.log is not None else None

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        self.close()

    def get_engine(self) -> Engine:
        """The run's engine, started on first use (or the warm one, with ``keep_warm``, while it
        answers as the model these settings give now). A start first takes its GPUs' locks,
        waiting for another run's engine on them to stop (``engines/gpu_lock.py``)."""
        if self._held is None:
            cfg = self.resolved()
            key = cfg._warm_key()
            held = _WARM.get(key) if cfg.keep_warm else None
            if held is not None and held.engine.model_id != cfg.model_identity():
                # New weights (or template) under the same settings: the warm engine would answer as
                # the old model under the new identity. Stopped first: its memory is the new one's.
                del _WARM[key]
                held.close()
                held = None
            if held is None:
                self._cold_starts += 1
                holder = {"run_id": self._run_id, "model": cfg.model}
                self._cache_run = for_resource(cfg, *self._cache_home) if self._cache_home else None
                with self._cache_run.starting() if self._cache_run else contextlib.nullcontext():
                    held = HeldEngine.start(cfg._lock_devices(), holder, self._say, cfg._start)
                if cfg.keep_warm:
                    _WARM[key] = held
            else:
                held.engine.gpu_wait_s = 0.0
            self._held = held
        return self._held.engine

    def _say(self, line: str) -> None:
        """The wait for another run's GPU: in this run's log, and above `sparkbatch run`'s progress
        bar (whose console shows no Dagster log), so a run that waits does not look hung."""
        (self._warn or logging.getLogger("sparkbatch").warning)(line)
        tell(line)

    def cold_starts(self) -> int:
        """Engines this resource object started itself (a warm one it found is not counted): the
        ``engine_starts`` a run's attempt records, and the CLI summary adds up."""
        return self._cold_starts

    def close(self) -> None:
        """End of a run: stop the engine and free its GPUs, unless ``keep_warm`` keeps them. The
        stop runs in the background (``engines/gpu_lock.py``): the GPUs stay locked until vLLM is
        gone, and the next engine start of this process, or its exit, waits for it."""
        # The compile cache first, in the run (its log is the run's): the engine is idle, so
        # what it compiled is on disk; a stop writes nothing more.
        if self._cache_run is not None:
            self._cache_run.finish()
            self._cache_run = None
        if self._held is not None and not self.keep_warm:
            self._held.close(background=True)
        self._held = None

    def use_home(self, home: Any, log: Any) -> None:
        """Where this run's compile cache travels (``compile_cache``): the run's job home, and its
        log for what the cache did (``definitions/compile_cache.py``). Without one, a start uses
        vLLM's and torch's own caches on this machine."""
        self._cache_home = (home, log)

    def shutdown(self) -> None:
        """Stop the engine even when it is kept warm, and free its GPUs."""
        held = _WARM.pop(self.resolved()._warm_key(), None) or self._held
        self._held = None
        if held is not None:
            held.close()

    # --- who answers: what the engines room resolves from these settings ------------------------

    def engine_settings(self) -> EngineSettings:
        """These settings resolved for an engine start (EnvVars read, platform defaults applied):
        the one value ``engines.start`` reads. Cheap: the model is resolved on use."""
        cfg = self.resolved()
        return EngineSettings(
            mode=cfg.engine, model=cfg.model, endpoints=tuple(cfg._endpoints()), llm_kwargs=cfg.llm_kwargs(),
            answer_settings=answer_settings(cfg.dtype_choice()[0], cfg.max_model_len, cfg.engine_kwargs),
            engine_kwargs=dict(cfg.engine_kwargs), max_num_seqs=cfg.resolved_max_num_seqs(),
            tensor_parallel_size=cfg.tensor_parallel_size, data_parallel_size=cfg.data_parallel_size,
            window=cfg.window, api_key=None if cfg.api_key is None else str(cfg.api_key),
            max_in_flight=cfg.max_in_flight, request_timeout_s=cfg.request_timeout_s, max_retries=cfg.max_retries,
            server_token_ids=cfg.server_token_ids, server_prompts_per_request=cfg.server_prompts_per_request,
            server_start_timeout_s=cfg.server_start_timeout_s,
            engine_start_timeout_s=cfg.engine_start_timeout_s, gpu_memory_utilization=cfg.gpu_memory_utilization,
            memory_reserve_gb=cfg.memory_reserve_gb, label_decoding=cfg.label_decoding,
        )

    def model_name(self) -> str:
        """What the engine will load, resolved (the embedded default is converted if needed)."""
        return self.engine_settings().model_name()

    def model_identity(self) -> str:
        """Who answers: ``<name>@<hash>`` over the weights, tokenizer, chat template and
        output-affecting settings; for a server someone else runs, what its ``/v1/models``
        says it serves. Computed without starting an engine, and again on every call: weights
        copied over the same folder change it at once (file digests are cached, so it is cheap)."""
        return self.engine_settings().model_identity()

    def with_model(self, model: str, engine_kwargs: dict[str, Any] | None = None) -> Self:
        """The same settings with another model: a candidate in a model comparison;
        ``engine_kwargs`` (a precision: ``{"quantization": "fp8"}``) merge over this resource's."""
        return self.with_fields(model=model, engine_kwargs={**self.engine_kwargs, **(engine_kwargs or {})})

    def with_fields(self, **update: Any) -> Self:
        """The same settings with ``update``'s fields changed (a cascade stage's share of the GPU)."""
        fields = {name: getattr(self, name) for name in type(self).model_fields}
        return type(self)(**{**fields, **update})

    def llm_kwargs(self) -> dict[str, Any]:
        """The ``vllm.LLM`` arguments of the offline engine (``vllm serve`` flags in server mode)."""
        return settings.llm_kwargs(
            max_num_seqs=self.resolved_max_num_seqs(), gpu_memory_utilization=self.gpu_memory_utilization,
            kv_cache_memory_gb=self.kv_cache_memory_gb, max_model_len=self.max_model_len,
            enable_prefix_caching=self.enable_prefix_caching, tensor_parallel_size=self.tensor_parallel_size,
            dtype=self.dtype_choice()[0], engine_kwargs=self.engine_kwargs)

    def dtype_choice(self) -> tuple[str, str]:
        """The dtype vLLM gets (``dtype``, with ``"auto"`` resolved for this machine) and why:
        float32 on a CPU without native bf16 (``settings.choose_dtype``). Part of the model
        identity, as vLLM's dtype always was."""
        cfg = self.resolved()
        if cfg._endpoints():  # someone else's server: its own dtype
            return cfg.dtype, "the server's own"
        return settings.choose_dtype(cfg.dtype, on_cpu(), settings.cpu_flags())

    def engine_envs(self) -> list[dict[str, str]]:
        """The environment of each engine a run starts here: one per data-parallel GPU group
        (offline mode; one engine when it spans machines or is a server started here)."""
        return self.engine_settings().engine_envs()

    def engine_count(self) -> int:
        """Engines a run of this resource drives at once: one per data-parallel GPU group (offline,
        or inside a `vllm serve` started here), one per server of ``server_url(s)``."""
        return self.engine_settings().engine_count

    def resolved_max_num_seqs(self) -> int:
        """``max_num_seqs``, or this platform's default for it (1024 on a GPU, 256 on the CPU)."""
        cfg = self.resolved()
        if cfg.max_num_seqs is not None:
            return cfg.max_num_seqs
        if cfg._endpoints():  # someone else's server: its platform, not ours
            return int(settings.GPU_DEFAULTS["max_num_seqs"])
        return int(settings.platform_default("max_num_seqs"))

    def resolved(self) -> Self:
        """This resource with the EnvVars it was given read, as Dagster reads them when a run
        starts; for use outside a run (the CLI's status and preview, a notebook). Inside a run,
        and with no EnvVar, it is the resource itself."""
        env = {name: value for name in type(self).model_fields
               if isinstance(value := getattr(self, name), _ENV_VARS)}
        if not env:
            return self
        unset = [f"{name}=EnvVar({var.env_var_name!r})" for name, var in env.items() if var.get_value() is None]
        if unset:
            raise ConfigError(f"{type(self).__name__}({', '.join(unset)}) reads an environment variable that is not "
                              "set: export it (or set the field another way)")
        fields = {name: getattr(self, name) for name in type(self).model_fields}
        return type(self)(**{**fields, **{name: var.get_value() for name, var in env.items()}})

    # --- start (one engine per run; the resource itself stays plain settings) -------------------

    def _warm_key(self) -> str:
        fields = {name: getattr(self, name) for name in type(self).model_fields if name != "keep_warm"}
        text = json.dumps([type(self).__module__, type(self).__qualname__, fields], sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()  # no API key in plain text, even in memory

    def _start(self) -> Engine:
        return start(self.engine_settings())

    def _lock_devices(self) -> list[str]:
        """The devices this resource's engine occupies on this box, for their locks."""
        return self.engine_settings().devices()

    def _endpoints(self) -> list[str]:
        """engine='server': the running servers' base URLs (server_url or server_urls); [] when
        `vllm serve` starts here (and in offline mode)."""
        return configured_urls(self.server_url, self.server_urls) if self.engine == "server" else []
