"""engines/config.py: the engine's settings declared once (the resource's fields) and resolved
once, then handed whole to whichever backend starts: the offline engine, the data-parallel
workers (it pickles), the server client and its `vllm serve`, and the worker node."""

import pickle
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from sparkbatch_dagster import VLLMResource
from sparkbatch_dagster.engines import FakeEngine
from sparkbatch_dagster.engines.config import EngineConfig, EngineSettings
from sparkbatch_dagster.engines.offline import data_parallel, vllm_offline
from sparkbatch_dagster.engines.server import server_process, vllm_server
from sparkbatch_dagster.engines.server.multinode import worker_node
from sparkbatch_dagster.engines.start import start
from unit.test_memory import H200, simulate, weights_folder

#: A value other than the default for every engine field a start reads without the network.
SET = {"max_num_seqs": 64, "label_decoding": "grammar", "server_token_ids": True, "window": 99, "max_retries": 2,
       "request_timeout_s": 5.0, "engine_start_timeout_s": 7.0, "server_start_timeout_s": 8.0, "max_in_flight": 3,
       "server_prompts_per_request": 4, "memory_reserve_gb": 9.0, "max_model_len": 512, "dtype": "float16",
       "enable_prefix_caching": False, "engine_kwargs": {"enforce_eager": True}}


def test_every_engine_field_is_the_resources_and_reaches_the_settings_as_set():
    assert set(EngineConfig.model_fields) <= set(VLLMResource.model_fields)
    assert all(VLLMResource.model_fields[n].description == f.description for n, f in EngineConfig.model_fields.items())
    assert set(VLLMResource.model_fields) - set(EngineConfig.model_fields) == {"keep_warm", "compile_cache"}
    cfg = VLLMResource(**SET).engine_settings()
    assert {name: getattr(cfg, name) for name in SET} == SET
    assert cfg.llm_kwargs["max_num_seqs"] == 64 and cfg.answer_settings["max_model_len"] == 512


def test_the_settings_are_frozen_pickle_and_refuse_unknown_fields():
    cfg = VLLMResource(**SET).engine_settings()
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    with pytest.raises(ValidationError, match="frozen"):
        cfg.max_num_seqs = 1  # type: ignore[misc]
    with pytest.raises(ValidationError, match="no_such_setting"):
        EngineSettings(no_such_setting=1)  # type: ignore[call-arg]


def _started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **fields: Any) -> list[Any]:
    """What start() hands the backend it builds, for a discrete GPU box with two GPUs."""
    simulate(monkeypatch, dev=H200)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    handed: list[Any] = []

    def built(*args: Any, **kwargs: Any) -> FakeEngine:
        handed.append(args)
        return FakeEngine()

    monkeypatch.setattr(vllm_offline, "VLLMOfflineEngine", built)
    monkeypatch.setattr(data_parallel, "DataParallelEngine", built)
    monkeypatch.setattr(server_process, "ServerProcess", lambda *args: handed.append(args) or type("S", (), {
        "url": "http://127.0.0.1:1"})())
    monkeypatch.setattr(vllm_server, "VLLMServerEngine", built)
    folder = tmp_path / "spark-model" if (tmp_path / "spark-model").is_dir() else weights_folder(tmp_path)
    start(VLLMResource(model=str(folder), **SET, **fields).engine_settings())
    return handed


def test_the_offline_engine_and_its_workers_get_the_settings_whole(tmp_path, monkeypatch):
    [(one,)] = _started(tmp_path, monkeypatch, data_parallel_size=1)
    assert isinstance(one, EngineSettings) and one.label_decoding == "grammar" and one.max_num_seqs == 64
    assert one.model == str((tmp_path / "spark-model").resolve()) and one.queue() == (99, 32)
    [(factory, workers, envs)] = _started(tmp_path, monkeypatch, data_parallel_size=2)
    assert pickle.loads(pickle.dumps(workers)) == workers  # it crosses to the worker processes as it is
    assert workers == one.model_copy(update={"data_parallel_size": 2})
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0", "1"]


def test_the_server_and_its_client_get_the_settings_whole(tmp_path, monkeypatch):
    (served, name, engines), (client, url, asked, server, count) = _started(tmp_path, monkeypatch, engine="server",
                                                                           data_parallel_size=1)
    assert served is client and client.label_decoding == "grammar" and client.server_prompts_per_request == 4
    assert (url, asked, engines, count) == ("http://127.0.0.1:1", name, 1, 1) and client.in_flight() == 3
    assert "--max-num-seqs" in server_process.started_args(served)


def test_the_worker_node_gets_the_settings_whole():
    cfg = VLLMResource(model="org/m", tensor_parallel_size=2, engine_kwargs={
        "nnodes": 2, "master_addr": "10.0.0.1"}).engine_settings()
    cmd = worker_node(cfg, 1, print_only=True, log=lambda _: None)["command"]
    assert "org/m" in cmd and cmd[cmd.index("--tensor-parallel-size") + 1] == "2" and "--headless" in cmd
