"""How one node option runs a model: how many GPUs one engine needs, how many engines the option
holds, and the settings that run it (the estimate prints them; nothing here starts anything).

    gpus_needed(weights_gb, memory_gb) -> place(tp, option) -> Placement(settings, engines, how)

Three shapes, all on vLLM's and Dagster's own machinery:

* the model fits one node: one engine per ``tensor_parallel_size`` GPUs of a node
  (``VLLMResource(data_parallel_size=...)``), and one Dagster run per node when there are several
  (a run launcher places them: ``docs/deploy-k8s.md``);
* the model needs more GPUs than a node has: one engine over ``nnodes`` nodes, vLLM's own
  multi-node mode (the first node runs the Dagster run with ``VLLMResource(tensor_parallel_size=tp,
  engine_kwargs={"nnodes": n, "master_addr": ...})``, every other node ``sparkbatch worker-node``:
  ``docs/multi-node.md``);
* the option cannot hold the model at all: no placement, and no price.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..spec import NodeOption

#: Weights may fill this share of a GPU's memory; the rest is left to the KV cache.
WEIGHTS_SHARE = 0.8


def gpus_needed(weights_gb: float | None, memory_gb: float) -> int:
    """Tensor-parallel size (a power of two) whose GPUs hold the weights with KV-cache room."""
    if weights_gb is None:
        return 1
    tp = 1
    while weights_gb > tp * memory_gb * WEIGHTS_SHARE:
        tp *= 2
    return tp


@dataclass(frozen=True)
class Placement:
    """One engine's ``tensor_parallel_size`` GPUs (over ``nnodes`` nodes) and how many such
    engines the option runs at once; ``settings`` are the ``VLLMResource`` fields that differ
    from its defaults, ``runs`` the Dagster runs that go at once."""

    tensor_parallel_size: int
    nnodes: int
    engines: int
    runs: int
    settings: dict[str, Any] = field(default_factory=dict)
    how: str = ""


def place(tp: int, option: NodeOption) -> Placement | None:
    """How ``option`` runs a model that needs ``tp`` GPUs per engine; None when it cannot."""
    per_node = option.gpus_per_node
    if tp <= per_node:
        engines_per_node = per_node // tp
        settings: dict[str, Any] = {}
        if tp > 1:
            settings["tensor_parallel_size"] = tp
        if engines_per_node > 1:
            settings["data_parallel_size"] = engines_per_node
        node = f"VLLMResource({_kw(settings)})" if settings else "the resource's defaults"
        how = f"one run, with {node}" if option.nodes == 1 else (
            f"{option.nodes} Dagster runs at once, one per node, each with {node}: a run launcher with a GPU "
            f"request per run and the 'gpu' pool limited to {option.nodes} (docs/deploy-k8s.md)")
        return Placement(tp, 1, engines_per_node * option.nodes, option.nodes, settings, how)
    # vLLM splits one engine over nodes with the same number of GPUs each.
    if tp % per_node or tp // per_node > option.nodes:
        return None
    nnodes = tp // per_node
    groups = option.nodes // nnodes
    settings = {"tensor_parallel_size": tp,
                "engine_kwargs": {"nnodes": nnodes, "master_addr": "<first node's address>"}}
    how = (f"one engine over {nnodes} nodes (vLLM multi-node): VLLMResource({_kw(settings)}) on the first "
           f"node, `sparkbatch worker-node --node-rank K` on each other node (docs/multi-node.md)")
    if groups > 1:
        how += f"; {groups} such groups, one Dagster run each"
    return Placement(tp, nnodes, groups, groups, settings, how)


def _kw(settings: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in settings.items())
