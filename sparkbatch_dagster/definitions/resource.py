"""``VLLMResource``: owns the engine's lifecycle for one Dagster run, nothing else.

The engine starts lazily on the first prompt that needs generating (a run whose partitions are
all done, or whose answers are all in the result store, never pays the minute of engine
start), is reused by every partition of the run, and is shut down in
``teardown_after_execution`` (or kept warm for the next run in this process: ``keep_warm``).
While it lives it holds its GPUs' locks (``engines/gpu_lock.py``): one engine per GPU on the box.
The resource stays plain settings: its engine fields are declared once, in
``engines/config.py`` (``EngineConfig``, which it inherits), and :meth:`VLLMResource.engine_settings`
resolves them into the one frozen ``EngineSettings`` the engines room starts from
(``engines/start.py``) and hands whole to each backend; what they become for vLLM lives there too
(``engines/settings.py``, ``engines/server/server_process.py``), model conversion and identity in
``engines/platform/model.py``. Unit tests inject a fake engine with
``sparkbatch_dagster.testing.FakeVLLMResource``, a class of its own.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from dagster import ConfigurableResource, EnvVar, InitResourceContext
from pydantic import Field, PrivateAttr
from typing_extensions import Self

from ..engines import settings
from ..engines.base import Engine
from ..engines.config import EngineConfig, EngineSettings
from ..engines.gpu_lock import HeldEngine
from ..engines.platform.cpu import cpu_flags
from ..engines.platform.model import answer_settings
from ..engines.server.endpoints import configured_urls
from ..engines.settings import on_cpu
from ..engines.start import model_identity, start
from ..errors import ConfigError
from ..run.progress import tell
from . import prestart
from .compile_cache import CompileCacheRun, for_resource

__all__ = ["VLLMResource", "close_warm_engines"]

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


class VLLMResource(ConfigurableResource, EngineConfig):  # type: ignore[misc]
    """vLLM tuned for a dedicated box; one definition serves a GPU and the CPU backend alike
    (settings left at None are resolved for the platform when the engine starts). The engine's
    fields are declared once, in :class:`~..engines.config.EngineConfig`; the two below are the
    resource's own lifecycle.

    Example::

        Definitions(assets=job.assets, resources={"vllm": VLLMResource(model=EnvVar("MY_MODEL"))})

    ``model`` left unset uses the embedded SmolLM2-135M-Instruct.
    """

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
                early = prestart.take(key)  # begun by `sparkbatch run` as it began (prestart())
                if early is not None:
                    held, self._cache_run = early.wait()
                else:
                    held, self._cache_run = self._start_held(cfg, self._run_id, self._cache_home)
                if cfg.keep_warm:
                    _WARM[key] = held
            else:
                held.engine.gpu_wait_s = 0.0
            self._held = held
        return self._held.engine

    def prestart(self) -> prestart.Prestart | None:
        """Begin this resource's engine start now, in a thread, for the next :meth:`get_engine` of
        this process with the same settings (a Dagster run's copy of this resource included),
        which then waits for it instead of starting another: ``sparkbatch run`` calls it first, so
        sharding and the run's preparation overlap the start (``definitions/prestart.py``). None,
        and nothing started, for servers someone else runs, a warm engine kept for these settings,
        or a start already pending. Call :meth:`use_home` first for the compile cache."""
        cfg = self.resolved()
        key = cfg._warm_key()
        if cfg._endpoints() or (cfg.keep_warm and key in _WARM) or prestart.pending(key):
            return None
        home, holder = self._cache_home, f"sparkbatch run (pid {os.getpid()})"
        # The thread restores the compile cache while this one imports vllm, then starts the engine.
        imported, failed = threading.Event(), list[BaseException]()

        def ready() -> None:
            imported.wait()
            if failed:
                raise RuntimeError("import vllm failed in the caller's thread") from failed[0]

        found = prestart.begin(key, lambda: cfg._start_held(cfg, holder, home, ready), lambda got: got[0].close())
        try:
            cfg._import_engine()
        except BaseException as exc:
            failed.append(exc)
            raise
        finally:
            imported.set()
        return found

    def _import_engine(self) -> None:
        """``import vllm`` here, in the caller's thread, for an offline engine in this process (the
        start's thread restores the compile cache meanwhile, then waits for it): beside the caller's
        sharding, in a thread, both slowed through the GIL (the job 8 s longer on an H200, issue 61).
        What overlaps the caller's work is then ``vllm.LLM(...)``, whose engine core works in its own
        process. Not for a fake, `vllm serve` or data-parallel workers."""
        if type(self)._start is not VLLMResource._start or self.engine == "server" \
                or self.engine_settings().engine_count > 1:
            return
        with contextlib.suppress(ImportError):  # no vllm: the start says so in its own words
            from vllm import LLM  # noqa: F401

    def _start_held(self, cfg: Self, run_id: str | None, cache_home: tuple[Any, Any] | None,
                    ready: Callable[[], object] | None = None) -> tuple[HeldEngine, CompileCacheRun | None]:
        """``cfg``'s engine started under its GPUs' locks, with its compile cache around the start;
        ``ready`` waits, after the cache's restore, for what else the start needs (:meth:`prestart`)."""
        cache = for_resource(cfg, *cache_home) if cache_home else None
        if cache is None and ready is not None:
            ready()
        with cache.starting(ready) if cache else contextlib.nullcontext():
            held = HeldEngine.start(cfg._lock_devices(), {"run_id": run_id, "model": cfg.model}, self._say, cfg._start)
        return held, cache

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
        # The engine's stop first, in the background: the compile cache's last save (in the run,
        # whose log is the run's) needs only the files, which the idle engine has written, and the
        # GPU is not held for it.
        if self._held is not None and not self.keep_warm:
            self._held.close(background=True)
        self._held = None
        if self._cache_run is not None:
            self._cache_run.finish()
            self._cache_run = None

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
        the one value ``engines.start`` reads, every engine field as it is. Cheap: the model is
        resolved on use."""
        cfg = self.resolved()
        fields = {name: getattr(cfg, name) for name in EngineConfig.model_fields}
        return EngineSettings(
            **{**fields, "max_num_seqs": cfg.resolved_max_num_seqs()}, endpoints=tuple(cfg._endpoints()),
            llm_kwargs=cfg.llm_kwargs(),
            answer_settings=answer_settings(cfg.dtype_choice()[0], cfg.max_model_len, cfg.engine_kwargs))

    def model_name(self) -> str:
        """What the engine will load, resolved (the embedded default is converted if needed)."""
        return self.engine_settings().model_name()

    def model_identity(self) -> str:
        """Who answers: ``<name>@<hash>`` over the weights, tokenizer, chat template and
        output-affecting settings; for a server someone else runs, what its ``/v1/models``
        says it serves. Computed without starting an engine, and again on every call: weights
        copied over the same folder change it at once (file digests are cached, so it is cheap)."""
        return model_identity(self.engine_settings())

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
        return settings.choose_dtype(cfg.dtype, on_cpu(), cpu_flags())

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
