"""Test-only resources. Nothing here is part of ``VLLMResource``'s launchpad schema.

    from sparkbatch_dagster.testing import FakeVLLMResource

    defs = Definitions(assets=job.assets, resources={"vllm": FakeVLLMResource(delay_s=0.01)})

:class:`FakeVLLMResource` has ``VLLMResource``'s lifecycle (lazy start, ``keep_warm``, close,
shutdown) and answers with :class:`~sparkbatch_dagster.engines.fake.FakeEngine`: no vLLM, no
model files. It never stands in for the real-engine tests. With ``data_parallel_size`` > 1 its
fake engines run in worker processes of a
:class:`~sparkbatch_dagster.engines.offline.data_parallel.DataParallelEngine` (:func:`fake_worker`), the
multi-engine path in seconds. :func:`dummy_model` writes a model folder of a given shape with no
weights, for vLLM's ``load_format="dummy"`` (real engine, random weights).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from pydantic import Field

from .definitions.resource import VLLMResource
from .engines.base import Engine
from .engines.platform.model import answer_settings, model_identity
from .engines.settings import CPU_DEFAULTS, split_devices, visible_gpus
from .home import JobHome
from .run.records import ShardStats
from .run.runner import ProgressFn, ShardRun
from .spec import JobSpec

#: /proc/cpuinfo's flags of a 2-core AMD EPYC seen running this project: AVX and FMA, no AVX2, no
#: AVX-512, no native bf16. ``SPARKBATCH_CPU_FLAGS=<these>`` makes the resource choose as it would there.
NO_AVX2 = ("fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht "
           "syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm rep_good nopl cpuid extd_apicid tsc_known_freq pni "
           "pclmulqdq ssse3 fma cx16 sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx f16c rdrand hypervisor "
           "lahf_lm cmp_legacy cr8_legacy abm sse4a misalignsse 3dnowprefetch osvw topoext")


def fake_worker(settings: dict[str, Any]) -> Engine:
    """A :class:`FakeEngine` in a data-parallel worker process, from ``FakeEngine``'s keyword
    arguments. With ``trace_path``, this worker traces to ``<trace_path>.<pid>`` and writes
    ``<trace_path>.<pid>.json``: its pid and the ``CUDA_VISIBLE_DEVICES`` it sees."""
    from .engines.fake import FakeEngine

    fake = dict(settings)
    if fake.get("trace_path"):
        fake["trace_path"] = f"{fake['trace_path']}.{os.getpid()}"
        seen = {"pid": os.getpid(), "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}
        # Written whole then renamed: a test polling for it never reads half a file.
        tmp = f"{fake['trace_path']}.json.tmp"
        with open(tmp, "w") as f:
            json.dump(seen, f)
        os.replace(tmp, f"{fake['trace_path']}.json")
    return FakeEngine(**fake)


def fake_compile() -> bool | None:
    """What a fake engine's start compiles: one file in ``TORCHINDUCTOR_CACHE_DIR`` when that is
    a compile cache's key folder (``engines/platform/compile_cache.py``; set only around a start that has
    one). True: it was there already (a warm start, or one restored from the home); False: this
    start wrote it (random bytes: a test tells which machine compiled); None: no cache folder."""
    from .engines.platform.compile_cache import cache_root

    folder = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not folder or cache_root() not in Path(folder).parents:
        return None
    graph = Path(folder) / "fxgraph" / "fake-graph.bin"
    if graph.is_file():
        return True
    graph.parent.mkdir(parents=True, exist_ok=True)
    graph.write_bytes(os.urandom(64 * 1024))
    return False


class FakeVLLMResource(VLLMResource):
    """``VLLMResource`` whose engine is a :class:`FakeEngine` with these settings.

    ``model`` names the fake model (``"fake-model"`` when unset; a model folder, such as a test's
    ``config.json`` and weights file, gets the real identity of its files, so new weights there
    are a new model); a fixed ``answer`` makes it another model identity, since it answers
    differently. The vLLM settings it inherits are
    ignored, except ``keep_warm`` and ``data_parallel_size`` (None: one engine, in this process;
    N: N fake engines in worker processes, each with its own ``CUDA_VISIBLE_DEVICES`` when that
    variable is set here, as with GPUs, and each with its own ``fail_after``,
    ``transient_first`` and gate).

    ``gate_path`` and ``gate_after`` make a barrier for tests that need one event to happen while
    the engine is mid-job (a second process started, a kill): the engine gives ``gate_after``
    answers, then holds until the file ``gate_path`` exists. The test waits for what it needs
    (rows traced, a lease taken, another process waiting), then creates the file::

        FakeVLLMResource(trace_path=str(trace), gate_path=str(tmp_path / "go"), gate_after=35)
    """

    delay_s: float = Field(default=0.0, ge=0.0, description="Seconds of sleep per request (kill tests' window).")
    fail_after: int | None = Field(
        default=None, ge=0, description="Raise EngineError after this many results (an engine crash)."
    )
    answer: str | None = Field(
        default=None, description="A fixed answer for every request; None = a label picked by a hash of the prompt."
    )
    trace_path: str | None = Field(
        default=None, description="Append each finished request id to this file (line-buffered)."
    )
    transient_first: int = Field(
        default=0, ge=0, description="The first N requests fail as a flaky server's would (retryable)."
    )
    gate_path: str | None = Field(
        default=None, description="Hold before answer gate_after + 1 until this file exists (tests' barrier)."
    )
    gate_after: int = Field(default=0, ge=0, description="Answers given before the gate_path hold.")
    knows: dict[str, str] | None = Field(
        default=None, description="Words the fake model knows, each with its label: it answers those surely and "
        "guesses the rest as surely (an overconfident model: FakeEngine's knows). Another model's identity.",
    )
    gpu_lock: bool = Field(
        default=False, description="Take the GPU lock as VLLMResource does (engines/gpu_lock.py, in "
        "$SPARKBATCH_GPU_LOCK_DIR): the GPUs of CUDA_VISIBLE_DEVICES its engines would use, else cpu0. Off by "
        "default: tests that play two boxes on one machine run two engines at once on purpose.",
    )
    compile_cache: bool = Field(
        default=False, description="VLLMResource's compile cache, for the tests that cover it: the fake start "
        "'compiles' one file into the cache folder a run gives it (fake_compile). Off by default: a fake engine "
        "has nothing to compile, and other tests' homes stay as they were.",
    )

    def model_name(self) -> str:
        return self.resolved().model or "fake-model"

    def model_identity(self) -> str:
        from .spec import fingerprint

        cfg = self.resolved()
        name = cfg.model_name()
        # Engine settings that change answers (a quantization) make another model, as for the real one.
        settings = answer_settings(cfg.dtype, cfg.max_model_len, cfg.engine_kwargs)
        extra = {k: v for k, v in settings.items() if k not in ("dtype", "max_model_len")}
        key: Any = [cfg.answer, extra] if extra else cfg.answer
        if self.knows:  # a model that knows other words answers otherwise
            key = [key, dict(sorted(self.knows.items()))]
        if (Path(name).expanduser() / "config.json").is_file():  # a model folder: its files, as the real one
            return model_identity(name, {**settings, "fake_answer": cfg.answer} if cfg.answer else settings)
        return name if key is None else f"{name}@{fingerprint(key)[:12]}"

    def dtype_choice(self) -> tuple[str, str]:
        return self.resolved().dtype, "as configured (fake engine: no platform to ask)"

    def resolved_max_num_seqs(self) -> int:
        return self.resolved().max_num_seqs or int(CPU_DEFAULTS["max_num_seqs"])  # no platform to ask

    def _start(self) -> Engine:
        from .engines.fake import FakeEngine

        # Named as the run names its rows, as the real start names its engine.
        fake: dict[str, Any] = dict(model_id=self.model_identity(), delay_s=self.delay_s, fail_after=self.fail_after,
                                    answer=self.answer, trace_path=self.trace_path,
                                    transient_first=self.transient_first, gate_path=self.gate_path,
                                    gate_after=self.gate_after, knows=self.knows)
        found = fake_compile()
        if (self.data_parallel_size or 1) == 1:
            engine = FakeEngine(**fake)
            engine.compiled_from_cache = found
            return engine
        from .engines.offline.data_parallel import DataParallelEngine

        # GPUs when CUDA_VISIBLE_DEVICES names some (as VLLMResource splits them), else no devices at all.
        gpus = visible_gpus() if "CUDA_VISIBLE_DEVICES" in os.environ else None
        envs = split_devices(self.data_parallel_size, self.tensor_parallel_size, gpus) if gpus is not None \
            else [{} for _ in range(self.data_parallel_size or 1)]
        return DataParallelEngine(fake_worker, fake, envs, model_id=fake["model_id"],
                                  window=self.window or 64, batch=16)

    def _lock_devices(self) -> list[str]:
        if not self.gpu_lock:
            return []
        if "CUDA_VISIBLE_DEVICES" not in os.environ:
            return ["cpu0"]
        return visible_gpus()[:(self.data_parallel_size or 1) * self.tensor_parallel_size]


#: Model bodies for :func:`dummy_model`, all with SmolLM2's 49k vocabulary and tokenizer.
DUMMY_SHAPES: dict[str, dict[str, int]] = {
    # A few MB: splits over 2 tensor-parallel ranks (heads divisible by 2) on a laptop CPU in seconds.
    "tiny": {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2},
    # Llama-3.2-1B-like and Llama-3.1-8B-like.
    "1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
           "num_key_value_heads": 8},
    "8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8},
    # Llama-3.1-70B-like: 141 GB in bf16, more than one H200 holds (tensor_parallel_size=2).
    "70b": {"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
            "num_key_value_heads": 8},
}
_TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                    "generation_config.json"]


def dummy_model(shape: str, out: str | Path, tokenizer: str | Path | None = None) -> Path:
    """A Llama model folder of ``shape`` (a :data:`DUMMY_SHAPES` key): ``config.json`` and the
    SmolLM2 tokenizer, no weights. vLLM with ``engine_kwargs={"load_format": "dummy"}`` gives it
    random weights: real speed and memory, meaningless answers (structured outputs still hold)::

        VLLMResource(model=str(dummy_model("tiny", tmp_path / "tiny")), engine_kwargs={"load_format": "dummy"})

    ``tokenizer``: a folder with SmolLM2's ``config.json`` and tokenizer (default: the embedded one)."""
    if shape not in DUMMY_SHAPES:
        raise ValueError(f"unknown shape {shape!r}: choose from {sorted(DUMMY_SHAPES)}")
    if tokenizer is None:
        from .engines.platform.model import DEFAULT_MODEL_NAME, ensure_embedded

        tokenizer = ensure_embedded(DEFAULT_MODEL_NAME)
    src, folder = Path(tokenizer).expanduser(), Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    body = DUMMY_SHAPES[shape]
    config = {**json.loads((src / "config.json").read_text()), **body, "max_position_embeddings": 8192,
              "torch_dtype": "bfloat16", "tie_word_embeddings": shape in ("tiny", "1b"),
              "head_dim": body["hidden_size"] // body["num_attention_heads"]}
    config.pop("quantization_config", None)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    for name in _TOKENIZER_FILES:
        if (src / name).exists():
            shutil.copy(src / name, folder / name)
    return folder


#: A Qwen3-style chat template (ChatML, as SmolLM2's) for :func:`reasoning_model`: the generation
#: prompt opens the thinking (as Qwen3's thinking templates and DeepSeek-R1's do), and
#: ``enable_thinking=False`` closes an empty one instead (as Qwen3's hybrid template does).
QWEN3_STYLE_TEMPLATE = (
    "{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{ '<think>\\n' }}{%- endif %}{%- endif %}"
)


def reasoning_model(out: str | Path, tokenizer: str | Path | None = None) -> Path:
    """A tiny reasoning model folder: :func:`dummy_model`'s ``tiny`` shape with ``<think>`` and
    ``</think>`` added to SmolLM2's tokenizer as tokens of their own (not special: decoded text
    keeps them, as Qwen3's does) and :data:`QWEN3_STYLE_TEMPLATE`. Random weights with vLLM's
    ``load_format="dummy"``: the model never ends its thinking by itself, so the budget is what
    ends it (what tests of the mechanics need)::

        VLLMResource(model=str(reasoning_model(tmp_path / "r")), engine_kwargs={"load_format": "dummy"})
    """
    from transformers import AutoTokenizer

    folder = dummy_model("tiny", out, tokenizer)
    tok = AutoTokenizer.from_pretrained(folder)
    tok.add_tokens(["<think>", "</think>"])
    tok.chat_template = QWEN3_STYLE_TEMPLATE
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    tok.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["vocab_size"] = max(int(config["vocab_size"]), -(-len(tok) // 64) * 64)  # room for the new ids
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def label_shard(spec: JobSpec, home: JobHome, version: str, key: str, engine: Engine,
                progress: ProgressFn | None = None) -> ShardStats:
    """Label every row of one shard and finalize it; return the shard's statistics: one
    :class:`~sparkbatch_dagster.run.runner.ShardRun` over one key, as the tests drive a shard."""
    return ShardRun(spec, home, version, engine, progress).run([key])[0]
