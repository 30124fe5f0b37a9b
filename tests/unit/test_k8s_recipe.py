"""docs/deploy-k8s.md: the Kubernetes Job dagster-k8s's K8sRunLauncher would submit for a run of
labeled_outputs (Kubernetes API mocked), from the recipe's own dagster.yaml and the helpers in
sparkbatch_dagster.definitions.deploy: GPU request, node selector, pool, environment."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml
from dagster import Definitions, define_asset_job, instance_for_test

from sparkbatch_dagster import VLLMResource, build_batch_assets
from sparkbatch_dagster.definitions.deploy import (
    GPU_POOL,
    K8S_CONFIG_TAG,
    gpu_pool_instance_config,
    k8s_gpu_config,
    k8s_gpu_container_context,
    k8s_gpu_tags,
)
from testkit import make_spec

if not os.environ.get("MAKELEVEL"):  # `make test` installs it: there a missing dagster-k8s fails the test
    pytest.importorskip("dagster_k8s", reason="the k8s extra (dagster-k8s) is not installed")

DOC = Path(__file__).resolve().parents[2] / "docs" / "deploy-k8s.md"
H200 = {"nvidia.com/gpu.product": "NVIDIA-H200"}
GPU_ENV = {"SPARKBATCH_MODEL": "/models/qwen-7b"}
KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def recipe_instance_yaml() -> dict[str, Any]:
    """The ```yaml block of the recipe that starts with '# dagster.yaml'."""
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.S)
    found = [b for b in blocks if b.startswith("# dagster.yaml")]
    assert len(found) == 1, "docs/deploy-k8s.md must hold one ```yaml block starting with '# dagster.yaml'"
    return dict(yaml.safe_load(found[0]))


def test_recipe_yaml_carries_the_helper_pool_config():
    config = recipe_instance_yaml()
    assert config["concurrency"] == gpu_pool_instance_config()["concurrency"]
    assert config["run_launcher"]["class"] == "K8sRunLauncher"


@pytest.fixture
def k8s_instance(tmp_path, monkeypatch):
    """A Dagster instance configured by the recipe's dagster.yaml (out of the cluster: a
    kubeconfig for an API server nobody listens on), its Kubernetes batch API a mock."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    config = recipe_instance_yaml()
    launcher = config["run_launcher"]["config"]
    launcher.update(load_incluster_config=False, kubeconfig_file=str(kubeconfig))
    batch_api = mock.MagicMock()
    with mock.patch("kubernetes.client.BatchV1Api", return_value=batch_api), \
            instance_for_test(overrides=config) as instance:
        yield instance, batch_api


def gpu_defs(tmp_path, tags: dict[str, str] | None):
    spec = make_spec(tmp_path, n=20, shards=2)
    job = build_batch_assets(spec=spec)
    label = define_asset_job("things_label", selection=[job.keys["labeled_outputs"]],
                             partitions_def=job.partitions_def, tags=tags)
    defs = Definitions(assets=job.assets, jobs=[label], resources={"vllm": VLLMResource()})  # never started here
    return job, defs.resolve_job_def("things_label")


def launch(instance, job_def, container_context: dict[str, Any] | None = None):
    """Create a run of ``job_def`` as the daemon would (with the job's tags and a code origin in the
    user code image) and hand it to the instance's launcher; returns the run and the Job body."""
    from dagster._core.code_pointer import FileCodePointer
    from dagster._core.launcher import LaunchRunContext
    from dagster._core.origin import JobPythonOrigin, RepositoryPythonOrigin
    from dagster_k8s import K8sRunLauncher

    origin = JobPythonOrigin(job_def.name, RepositoryPythonOrigin(
        executable_path=sys.executable, container_image="registry.example.com/sparkbatch:1.0",
        code_pointer=FileCodePointer(python_file="/app/definitions.py", fn_name="defs", working_directory="/app"),
        container_context=container_context))
    run = instance.create_run_for_job(job_def, tags=dict(job_def.run_tags), job_code_origin=origin)
    launcher = instance.run_launcher
    assert isinstance(launcher, K8sRunLauncher)
    launcher.launch_run(LaunchRunContext(dagster_run=run, workspace=None))
    return run


def submitted_job(batch_api):
    calls = [c for c in batch_api.method_calls if c[0] == "create_namespaced_job"]
    assert len(calls) == 1, batch_api.method_calls
    _, _, kwargs = calls[0]
    assert kwargs["namespace"] == "dagster"
    return kwargs["body"]


def assert_gpu_pod(body, model: str = "/models/qwen-7b") -> None:
    pod = body.spec.template.spec
    (container,) = pod.containers
    assert container.image == "registry.example.com/sparkbatch:1.0"
    assert container.resources.limits["nvidia.com/gpu"] == "1"
    assert container.resources.requests["nvidia.com/gpu"] == "1"
    assert pod.node_selector == H200
    assert [(t.key, t.operator, t.effect) for t in pod.tolerations] == [("nvidia.com/gpu", "Exists", "NoSchedule")]
    env = {e.name: e.value for e in container.env}
    # The launcher's (dagster.yaml) and the tag's / container context's, side by side.
    assert env["HF_HOME"] == "/models/hf-cache"
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["SPARKBATCH_MODEL_CACHE"] == "/models/sparkbatch"
    assert env["SPARKBATCH_MODEL"] == model
    assert env["DAGSTER_RUN_JOB_NAME"] == "things_label"
    mounts = {m.name: m.mount_path for m in container.volume_mounts}
    assert mounts["jobs"] == "/data" and mounts["models"] == "/models"
    assert {v.name: v.persistent_volume_claim.claim_name for v in pod.volumes if v.persistent_volume_claim} == {
        "jobs": "sparkbatch-jobs", "models": "models"}


def test_gpu_pool_limit_is_the_number_of_machines(k8s_instance):
    from dagster._core.instance.config import PoolGranularity

    instance, _ = k8s_instance
    assert instance.get_concurrency_config().pool_config.pool_granularity == PoolGranularity.RUN
    instance.event_log_storage.set_concurrency_slots(GPU_POOL, 4)  # dagster instance concurrency set gpu 4
    assert instance.event_log_storage.get_concurrency_info(GPU_POOL).slot_count == 4


def test_run_tags_put_the_run_pod_on_a_gpu_machine(tmp_path, k8s_instance):
    instance, batch_api = k8s_instance
    tags = k8s_gpu_tags(gpus=1, node_selector=H200, env=GPU_ENV, cpu="8", memory="64Gi")
    _, job_def = gpu_defs(tmp_path, tags)
    run = launch(instance, job_def)
    assert json.loads(run.tags[K8S_CONFIG_TAG]) == k8s_gpu_config(1, node_selector=H200, env=GPU_ENV, cpu="8",
                                                                  memory="64Gi")
    body = submitted_job(batch_api)
    assert_gpu_pod(body)
    container = body.spec.template.spec.containers[0]
    assert container.resources.requests["cpu"] == "8"
    assert container.resources.limits["memory"] == container.resources.requests["memory"] == "64Gi"
    assert body.metadata.labels["dagster/job"] == "things_label"


def test_code_location_container_context_does_the_same_without_tags(tmp_path, k8s_instance):
    instance, batch_api = k8s_instance
    _, job_def = gpu_defs(tmp_path, None)
    context = k8s_gpu_container_context(node_selector=H200, env={"SPARKBATCH_MODEL": "/models/llama-8b"})
    run = launch(instance, job_def, container_context=json.loads(json.dumps(context)))
    assert K8S_CONFIG_TAG not in run.tags
    assert_gpu_pod(submitted_job(batch_api), model="/models/llama-8b")


def test_a_run_of_labeled_outputs_needs_the_gpu_pool(tmp_path, k8s_instance):
    instance, _ = k8s_instance
    job, job_def = gpu_defs(tmp_path, k8s_gpu_tags(node_selector=H200))
    labeled = next(a for a in job.assets if job.keys["labeled_outputs"] in a.keys)
    assert labeled.op.pool == GPU_POOL
    run = instance.create_run_for_job(job_def, tags=dict(job_def.run_tags))
    assert run.run_op_concurrency is not None and GPU_POOL in (run.run_op_concurrency.all_pools or set())


def test_helper_refuses_zero_gpus():
    with pytest.raises(ValueError, match="at least one GPU"):
        k8s_gpu_config(0)
