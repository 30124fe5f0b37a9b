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

Importing this package loads neither vllm nor torch.
"""

from .assets import BatchJob, build_batch_assets
from .component import BatchInferenceComponent
from .errors import ConfigError, EngineError, InputError, SparkbatchError
from .resources import VLLMResource
from .spec import EstimateSpec, JobSpec, NodeOption, OutputSpec, SamplingSpec

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
    "SparkbatchError",
    "VLLMResource",
    "build_batch_assets",
]
