"""The one Definitions object of this deployment (loaded by workspace.yaml and the CLI)."""

from dagster import Definitions

from assets import debian_job, debian_packages
from resources import vllm_resource

defs = Definitions(assets=[debian_packages, *debian_job.assets], resources={"vllm": vllm_resource()})
