"""Memory that cannot wedge the host: on a unified-memory GPU (DGX Spark, GB10) the KV cache is
sized in bytes from MemAvailable minus a reserve, and a setting the free memory cannot give is
refused before loading. No GB10 is lent here: its device facts and memory figures are injected
(``memory.device`` / ``memory.host``); the CPU backend's check and log lines run for real."""

from __future__ import annotations

import builtins
import json
import os
from pathlib import Path
from typing import Any

import pytest

from sparkbatch_dagster import VLLMResource
from sparkbatch_dagster.engines import FakeEngine, LazyEngine, settings
from sparkbatch_dagster.engines.base import EngineRequest
from sparkbatch_dagster.engines.config import EngineSettings
from sparkbatch_dagster.engines.offline import vllm_offline
from sparkbatch_dagster.engines.platform import memory, model
from sparkbatch_dagster.engines.platform.memory import GIB, Device, Host
from sparkbatch_dagster.engines.server import server_process
from sparkbatch_dagster.engines.start import model_identity, sized_memory
from sparkbatch_dagster.errors import ConfigError
from sparkbatch_dagster.home import digests
from sparkbatch_dagster.spec import OutputSpec, SamplingSpec

GB10 = Device("NVIDIA GB10", True, int(121.7 * GIB))
H200 = Device("NVIDIA H200", False, int(139.8 * GIB))
#: A GB10 whose OS and desktop hold about 12 GiB; half the rest is page cache.
SPARK = Host(total=int(121.7 * GIB), available=110 * GIB, free=55 * GIB)
WEIGHTS = 16 * 10**9  # an 8B model in bf16


class Loaded(Exception):
    """Raised by the stand-ins for vLLM's engine and `vllm serve`: what they were started with."""

    def __init__(self, args: Any) -> None:
        super().__init__("a model would load here")
        self.given = args


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKBATCH_CACHE_DIR", str(tmp_path / "cache"))
    model._identity.cache_clear()


def weights_folder(root: Path, size: int = WEIGHTS) -> Path:
    """A model folder whose one weight file has ``size`` bytes (sparse: no disk used)."""
    folder = root / "spark-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    weights = folder / "model.safetensors"
    with open(weights, "wb") as fh:
        fh.truncate(size)
    # Its digest cached, as after a first run: hashing 16 GB of zeros would take a minute here.
    st, key = weights.stat(), str(weights.resolve())
    cache = digests.cache_path()
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({key: [st.st_size, st.st_mtime_ns, "0" * 64]}))
    return folder


def simulate(monkeypatch: pytest.MonkeyPatch, dev: Device = GB10, mem: Host = SPARK) -> None:
    """This process on ``dev`` with ``mem``; vLLM and `vllm serve` raise :class:`Loaded` with
    what they were given instead of loading."""
    monkeypatch.setattr(settings, "on_cpu", lambda: False)
    monkeypatch.setattr(memory, "device", lambda: dev)
    monkeypatch.setattr(memory, "host", lambda: mem)

    def engine(cfg: EngineSettings) -> None:
        raise Loaded(cfg.llm_kwargs)

    def serve(cfg: EngineSettings, name: str, engines: int = 1) -> None:
        raise Loaded(server_process.started_args(cfg, engines))

    monkeypatch.setattr(vllm_offline, "VLLMOfflineEngine", engine)
    monkeypatch.setattr(server_process, "ServerProcess", serve)


def test_sizing_stays_out_of_the_model_identity(tmp_path, monkeypatch):
    folder = str(weights_folder(tmp_path))
    cfg = VLLMResource(model=folder).engine_settings()
    before = model_identity(cfg)
    simulate(monkeypatch)
    sized, note = sized_memory(cfg, dict(cfg.llm_kwargs), folder, 1)
    assert "kv_cache_memory_bytes" in sized and "kv_cache_memory_bytes" not in cfg.answer_settings
    assert model_identity(VLLMResource(model=folder).engine_settings()) == before
    assert "MemAvailable 110.0 GiB, reserve 8 GiB, weights 14.9 GiB" in note


def test_page_cache_in_the_way_of_vllms_own_check_is_explained():
    plan = memory.size_unified(GB10, Host(SPARK.total, 110 * GIB, free=30 * GIB), WEIGHTS)
    assert "MemFree is 30.0 GiB" in plan.note and "drop_caches" in plan.note
    assert "MemFree" not in memory.size_unified(GB10, Host(SPARK.total, 110 * GIB, free=105 * GIB), WEIGHTS).note


def test_a_gpu_named_gb10_counts_as_integrated():
    assert memory.device_from("NVIDIA GB10", False, 10).integrated
    assert memory.device_from("NVIDIA Jetson", True, 10).integrated
    assert not memory.device_from("NVIDIA H200", False, 10).integrated


def test_engine_kwargs_may_not_set_the_kv_bytes():
    with pytest.raises(ConfigError, match=r"\['kv_cache_memory_bytes'\].*set the fields instead"):
        VLLMResource(engine_kwargs={"kv_cache_memory_bytes": 2**30}).engine_settings()


def test_weight_digests_leave_no_page_cache_and_a_warm_identity_reads_no_weights(tmp_path, monkeypatch):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(os.urandom(3 << 20))
    advised: list[tuple[str, int]] = []
    real_fadvise = os.posix_fadvise

    def fadvise(fd: int, offset: int, length: int, advice: int) -> None:
        advised.append((os.readlink(f"/proc/self/fd/{fd}"), advice))
        real_fadvise(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", fadvise)
    first = model.model_identity(str(folder))
    weights = str((folder / "model.safetensors").resolve())
    assert (weights, os.POSIX_FADV_DONTNEED) in advised

    opened: list[str] = []
    real_open, real_os_open = builtins.open, os.open
    monkeypatch.setattr(builtins, "open", lambda f, *a, **k: (opened.append(str(f)), real_open(f, *a, **k))[1])
    monkeypatch.setattr(os, "open", lambda f, *a, **k: (opened.append(str(f)), real_os_open(f, *a, **k))[1])
    model._identity.cache_clear()  # a new process: only the digest cache is left
    assert model.model_identity(str(folder)) == first
    assert not [f for f in opened if f.endswith("model.safetensors")]


def test_inputs_keep_their_page_cache(tmp_path, monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(os, "posix_fadvise", lambda *a: calls.append(a[3]))
    f = tmp_path / "rows.bin"
    f.write_bytes(b"rows")
    digests.file_digest(f)  # sharding reads an input again right after: its cache helps
    assert calls == []


def test_the_log_says_what_was_free_before_and_after(monkeypatch):
    figures = iter([Host(100 * GIB, 90 * GIB, 50 * GIB), Host(100 * GIB, 60 * GIB, 20 * GIB)])
    monkeypatch.setattr(memory, "host", lambda: next(figures))
    started = FakeEngine()
    started.memory_note = "unified memory (NVIDIA GB10): KV cache 30.0 GiB"
    lines: list[str] = []
    engine = LazyEngine(started.model_id, lambda: started, log=lines.append)
    list(engine.generate([EngineRequest("a", [{"role": "user", "content": "x"}])], SamplingSpec(max_tokens=2),
                         OutputSpec()))
    assert "(MemAvailable 90.0 of 100.0 GiB)" in lines[0]
    assert "MemAvailable 90.0 GiB before the start, 60.0 GiB after (30.0 GiB taken); unified memory" in lines[1]
