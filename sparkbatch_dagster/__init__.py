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

from .definitions.component import BatchInferenceComponent
from .definitions.factory import BatchJob, build_batch_assets
from .definitions.resource import VLLMResource
from .errors import ConfigError, EngineError, InputError, SparkbatchError
from .spec import EstimateSpec, JobSpec, NodeOption, OutputSpec, SamplingSpec, SinkSpec

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
