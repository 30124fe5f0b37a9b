"""Run pods on GPU machines with Dagster's own Kubernetes launcher (``dagster-k8s``).

The recipe is ``docs/deploy-k8s.md``. These helpers only build plain config values (no
dagster-k8s import), so they cost nothing where Kubernetes is not used::

    from dagster import define_asset_job
    from sparkbatch_dagster.definitions.deploy import k8s_gpu_tags

    # run_metrics and analytics follow by themselves (AutomationCondition) in runs without a GPU.
    gpu_job = define_asset_job("tickets_gpu", selection=[job.keys["labeled_outputs"]],
                               tags=k8s_gpu_tags(node_selector={"nvidia.com/gpu.product": "NVIDIA-H200"},
                                                 env={"SPARKBATCH_MODEL": "/models/qwen-7b"}))

``K8sRunLauncher`` reads the ``dagster-k8s/config`` tag of each run (and the code location's
``container_context``, see :func:`k8s_gpu_container_context`): the run pod then asks for
``gpus`` of ``nvidia.com/gpu`` on a node that matches ``node_selector``. How many such runs go
at once is the ``gpu`` pool's limit: :func:`gpu_pool_instance_config` and ``dagster instance
concurrency set gpu <machines>``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

#: The Dagster concurrency pool of the steps that hold a GPU (``labeled_outputs``).
GPU_POOL = "gpu"
#: The extended resource the NVIDIA device plugin advertises.
GPU_RESOURCE = "nvidia.com/gpu"
#: The run tag ``K8sRunLauncher`` and ``k8s_job_executor`` read.
K8S_CONFIG_TAG = "dagster-k8s/config"
#: Environment of the run pod by default (none: the engine's defaults follow the platform it
#: starts on; pass the model path etc. as ``env``).
DEFAULT_ENV: dict[str, str] = {}


def k8s_gpu_config(
    gpus: int = 1,
    *,
    node_selector: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    cpu: str | None = None,
    memory: str | None = None,
    tolerate_gpu_taint: bool = True,
) -> dict[str, Any]:
    """The ``dagster-k8s/config`` value for a run pod on one GPU machine.

    Args:
        gpus: ``nvidia.com/gpu`` limit (and request) of the pod; one vLLM engine uses them all
            (``tensor_parallel_size`` in ``VLLMResource.engine_kwargs`` when more than 1).
        node_selector: labels of the GPU nodes, e.g. ``{"nvidia.com/gpu.product": "NVIDIA-H200"}``.
        env: environment of the run container, over :data:`DEFAULT_ENV` (model path, HF cache, ...).
        cpu, memory: requests for the pod (vLLM tokenizes and Dagster writes Parquet on the CPU).
        tolerate_gpu_taint: tolerate the ``nvidia.com/gpu`` NoSchedule taint GPU node pools carry.
    """
    if gpus < 1:
        raise ValueError(f"gpus={gpus}: a run pod of labeled_outputs needs at least one GPU")
    limits: dict[str, Any] = {GPU_RESOURCE: str(gpus)}
    requests: dict[str, Any] = {GPU_RESOURCE: str(gpus)}
    if cpu:
        requests["cpu"] = cpu
    if memory:
        requests["memory"] = limits["memory"] = memory
    pod_spec: dict[str, Any] = {}
    if node_selector:
        pod_spec["node_selector"] = dict(node_selector)
    if tolerate_gpu_taint:
        pod_spec["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    environment = {**DEFAULT_ENV, **(env or {})}
    return {
        "container_config": {
            "resources": {"limits": limits, "requests": requests},
            "env": [{"name": k, "value": str(v)} for k, v in sorted(environment.items())],
        },
        "pod_spec_config": pod_spec,
    }


def k8s_gpu_tags(gpus: int = 1, **kwargs: Any) -> dict[str, str]:
    """Run tags that put a run on a GPU machine: ``{"dagster-k8s/config": <json>}`` (for
    ``define_asset_job(tags=...)``, a ``RunRequest`` or a backfill's tags). Arguments as
    :func:`k8s_gpu_config`."""
    return {K8S_CONFIG_TAG: json.dumps(k8s_gpu_config(gpus, **kwargs), sort_keys=True)}


def k8s_gpu_container_context(gpus: int = 1, **kwargs: Any) -> dict[str, Any]:
    """A code location's ``container_context`` (``dagster api grpc --container-context``) that
    puts every run of the location on a GPU machine. Arguments as :func:`k8s_gpu_config`."""
    return {"k8s": {"run_k8s_config": k8s_gpu_config(gpus, **kwargs)}}


def gpu_pool_instance_config() -> dict[str, Any]:
    """The ``dagster.yaml`` part that makes pools limit *runs*: a run whose ``gpu`` slots are
    all taken stays queued (no pod, no GPU node held) until one is free. The limit itself is
    set once per instance: ``dagster instance concurrency set gpu <GPU machines>``."""
    return {"concurrency": {"pools": {"granularity": "run"}}}


def pool_limit(instance: Any, pool: str) -> int | None:
    """How many steps the instance lets into ``pool`` at once (its own limit, or the instance's
    ``concurrency.pools.default_limit``); None: no limit."""
    try:
        limit = instance.event_log_storage.get_concurrency_info(pool).limit
    except Exception:  # an instance storage without concurrency support: no limit it can enforce
        return None
    return None if limit is None else int(limit)
