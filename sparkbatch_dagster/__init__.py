"""sparkbatch-dagster: large offline LLM batch jobs as partitioned Dagster assets.

Example::

    from dagster import Definitions
    from sparkbatch_dagster import JobSpec, OutputSpec, VLLMResource, build_batch_assets

    spec = JobSpec(name="sections", input="packages.parquet", id_column="package",
                   text_columns=["description"], user_template="{{ description }}\\nSection?",
                   output=OutputSpec(kind="label", labels=["admin", "devel", "libs"]))
    job = build_batch_assets(spec=spec)
    defs = Definitions(assets=job.assets, resources={"vllm": VLLMResource()})

Or, with ``dg``, a folder with a defs.yaml (``type: sparkbatch_dagster.BatchInferenceComponent``,
the same fields as attributes): see :class:`BatchInferenceComponent`.

Importing this package loads neither vllm nor torch. The code is laid out in rooms, one per
layer, in the order data flows (each room's ``__init__`` says what it owns and may import):
``spec`` -> ``home`` -> ``inputs`` -> ``engines`` -> ``run`` -> ``estimate`` -> ``definitions``
-> ``cli``; ``errors`` is under them all and ``testing`` is the fake engine for users' tests.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import ConfigError, EngineError, InputError, SparkbatchError
from .spec import EstimateSpec, JobSpec, NodeOption, OutputSpec, SamplingSpec, SinkSpec

if TYPE_CHECKING:
    from .definitions.component import BatchInferenceComponent
    from .definitions.factory import BatchJob, build_batch_assets
    from .definitions.resource import VLLMResource

#: The Dagster surface, imported on first use (PEP 562): ``import dagster`` (which loads
#: ``dagster.components``) costs about a CPU second, and a process that imports only a room below
#: ``definitions`` (an engine's subprocess, ``python -m sparkbatch_dagster.engines...``) goes
#: through this file without needing Dagster at all.
_LAZY = {
    "BatchInferenceComponent": ".definitions.component",
    "BatchJob": ".definitions.factory",
    "build_batch_assets": ".definitions.factory",
    "VLLMResource": ".definitions.resource",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value  # once: later lookups never come back here
    return value


def __dir__() -> list[str]:
    # dg finds the component by dir() and getattr (dagster.components.core.package_entry), so the
    # names not yet imported are listed too.
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "BatchInferenceComponent",
    "BatchJob",
    "ConfigError",
    "EngineError",
    "EstimateSpec",
    "InputError",
    "JobSpec",
    "NodeOption",
    "OutputSpec",
    "SamplingSpec",
    "SinkSpec",
    "SparkbatchError",
    "VLLMResource",
    "build_batch_assets",
]
