"""A model split over devices: tensor parallel on one machine, and one engine over two machines
on vLLM's own multi-node mode: the settings checked before any model loads, the worker node's
command, its restart for the next engine, and real jobs on a Llama-shaped model with random
weights split in two (two CPU ranks of one engine; two vLLM process trees on loopback run twice
through `sparkbatch run` with one `sparkbatch worker-node`)."""

from __future__ import annotations

import pytest

from sparkbatch_dagster import ConfigError, VLLMResource
from sparkbatch_dagster.engines.server.multinode import check, worker_command


def test_bad_multi_node_settings_stop_before_any_model_loads():
    with pytest.raises(ConfigError, match=r"nnodes=2 but no master_addr: set engine_kwargs\['master_addr'\]"):
        check({"nnodes": 2}, 2)
    with pytest.raises(ConfigError, match="= 3 does not split evenly over 2 nodes"):
        check({"nnodes": 2, "master_addr": "10.0.0.1"}, 3)
    with pytest.raises(ConfigError, match="sets node_rank: the resource runs on the first node"):
        check({"nnodes": 2, "master_addr": "10.0.0.1", "node_rank": 1}, 2)
    with pytest.raises(ConfigError, match="data_parallel_size=2 with nnodes=2: an engine over several machines runs"):
        check({"nnodes": 2, "master_addr": "10.0.0.1"}, 2, data_parallel_size=2)
    check({"nnodes": 2, "master_addr": "10.0.0.1", "pipeline_parallel_size": 2}, 1)  # 2 GPUs, one per node
    res = VLLMResource(tensor_parallel_size=3, engine_kwargs={"nnodes": 2, "master_addr": "10.0.0.1"})
    with pytest.raises(ConfigError, match="does not split evenly"):
        res.get_engine()  # before vLLM is imported or a model resolved


def test_the_worker_nodes_command_is_vllms_headless_serve_with_the_same_settings():
    kw = {"tensor_parallel_size": 2, "nnodes": 2, "master_addr": "10.0.0.1", "max_num_seqs": 8}
    cmd = worker_command("/models/m", kw, 1)
    assert cmd[1:5] == ["-m", "sparkbatch_dagster.engines.platform.vllm_cli", "serve", "/models/m"]
    flags = " ".join(cmd[5:])
    assert "--tensor-parallel-size 2 --nnodes 2 --master-addr 10.0.0.1 --max-num-seqs 8" in flags
    assert flags.endswith("--node-rank 1 --headless")
    with pytest.raises(ConfigError, match="--node-rank 2 is not a worker of nnodes=2: use 1 to 1"):
        worker_command("/models/m", kw, 2)
    with pytest.raises(ConfigError, match="runs on one machine .* no worker node is needed"):
        worker_command("/models/m", {"tensor_parallel_size": 2}, 1)


def test_the_multi_node_settings_leave_the_model_identity_alone():
    one = VLLMResource(engine_kwargs={"load_format": "dummy"}).model_identity()
    two = VLLMResource(tensor_parallel_size=2, engine_kwargs={
        "load_format": "dummy", "nnodes": 2, "master_addr": "10.0.0.1", "master_port": 29555}).model_identity()
    assert one == two  # the same answers: one split of the model is not a new output version
