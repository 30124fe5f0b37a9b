"""Data parallel inside one run: several engines, each in its own process with its own GPU
group, one stream of results; the run's guarantees (every row once, per-partition events,
resume) are those of one engine. Fake engines in worker processes, no vLLM (one real CPU test)."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest

from sparkbatch_dagster import ConfigError, VLLMResource
from sparkbatch_dagster.engines import settings
from sparkbatch_dagster.engines.gpu_lock import wait_for_stops
from sparkbatch_dagster.testing import FakeVLLMResource
from testkit import live_children


def _workers() -> list[Any]:
    """The worker processes left, once every engine stopping in the background has stopped (a
    run's end stops its engine behind the run: gpu_lock.HeldEngine.close)."""
    wait_for_stops()
    return live_children("spawn_main")  # a worker's command line; the resource tracker's is not


def test_split_devices():
    gpus = ["0", "1", "2", "3"]
    assert settings.split_devices(None, 1, gpus) == [{"CUDA_VISIBLE_DEVICES": g} for g in gpus]
    assert settings.split_devices(None, 2, gpus) == [{"CUDA_VISIBLE_DEVICES": "0,1"}, {"CUDA_VISIBLE_DEVICES": "2,3"}]
    assert settings.split_devices(None, 4, gpus) == [{}]  # one engine: this process, as before
    assert settings.split_devices(1, 1, gpus) == [{}]
    assert settings.split_devices(None, 1, ["0"]) == [{}]
    assert settings.split_devices(None, 1, []) == [{}]  # vLLM itself says there is no GPU
    uuids = ["GPU-aa", "GPU-bb"]
    assert settings.split_devices(2, 1, uuids) == [{"CUDA_VISIBLE_DEVICES": u} for u in uuids]
    assert settings.split_devices(None, 1, None) == [{}]  # the CPU backend: one engine unless asked


def test_cpu_engines_get_their_own_cores(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert settings.split_devices(2, 1, None) == [{"VLLM_CPU_OMP_THREADS_BIND": "0,1"},
                                                  {"VLLM_CPU_OMP_THREADS_BIND": "2,3"}]
    with pytest.raises(ConfigError, match=r"data_parallel_size=5 CPU engines x tensor_parallel_size=1 need a core"):
        settings.split_devices(5, 1, None)
    # Tensor-parallel ranks on the CPU: vLLM's own binding wants a NUMA node per rank; each gets its cores.
    assert settings.split_devices(None, 2, None) == [{"VLLM_CPU_OMP_THREADS_BIND": "0,1|2,3"}]
    assert settings.split_devices(2, 2, None) == [{"VLLM_CPU_OMP_THREADS_BIND": "0|1"},
                                                  {"VLLM_CPU_OMP_THREADS_BIND": "2|3"}]
    with pytest.raises(ConfigError, match=r"data_parallel_size=3 CPU engines x tensor_parallel_size=2 need a core"):
        settings.split_devices(3, 2, None)
    assert VLLMResource(engine="server", tensor_parallel_size=2).engine_envs() == [
        {"VLLM_CPU_OMP_THREADS_BIND": "0,1|2,3"}]  # a `vllm serve` started here: one engine, its ranks bound
    # A `vllm serve` with data-parallel engines on the CPU: vLLM's "auto" would bind all of them to one
    # core; each gets its own, in the "|" list vLLM splits by data-parallel rank.
    monkeypatch.setattr(settings, "on_cpu", lambda: True)
    assert VLLMResource(engine="server", data_parallel_size=2).engine_envs() == [
        {"VLLM_CPU_OMP_THREADS_BIND": "0,1|2,3"}]
    assert VLLMResource(engine="server", data_parallel_size=2, tensor_parallel_size=2).engine_envs() == [
        {"VLLM_CPU_OMP_THREADS_BIND": "0|1|2|3"}]
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # the user's own binding stands
    assert VLLMResource(engine="server", data_parallel_size=2).engine_envs() == [{}]
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0-3")  # the user's binding wins
    assert settings.split_devices(2, 1, None) == [{}, {}]


def test_the_default_is_one_engine_per_visible_gpu_group(monkeypatch):
    monkeypatch.setattr(settings, "on_cpu", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert settings.data_parallel_envs(None, 1) == [{"CUDA_VISIBLE_DEVICES": "3"}, {"CUDA_VISIBLE_DEVICES": "5"}]
    monkeypatch.setattr(settings, "on_cpu", lambda: True)
    assert settings.data_parallel_envs(None, 1) == [{}]


def test_too_many_engines_stop_before_any_model_loads(monkeypatch):
    monkeypatch.setattr(settings, "on_cpu", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"data_parallel_size=2 needs 2 GPUs .* but 1 are visible "
                                          r"\(CUDA_VISIBLE_DEVICES=0\): lower VLLMResource.data_parallel_size to 1"):
        VLLMResource(data_parallel_size=2).get_engine()
    assert time.monotonic() - started < 30
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    with pytest.raises(ConfigError, match=r"data_parallel_size=3 needs 6 GPUs .*tensor_parallel_size=2.*to 2"):
        FakeVLLMResource(data_parallel_size=3, tensor_parallel_size=2).get_engine()
    assert not _workers()


def test_data_parallel_size_changes_neither_identity_nor_code_version(tmp_path, monkeypatch):
    from sparkbatch_dagster.definitions.factory import _model_config

    monkeypatch.setenv("SPARKBATCH_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "tiny-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    (folder / "model.safetensors").write_bytes(os.urandom(64 * 1024))
    one, two = VLLMResource(model=str(folder)), VLLMResource(model=str(folder), data_parallel_size=2)
    assert one.model_identity() == two.model_identity()
    assert _model_config(one) == _model_config(two)
    assert FakeVLLMResource().model_identity() == FakeVLLMResource(data_parallel_size=2).model_identity()
