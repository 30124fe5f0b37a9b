"""What defs.yaml takes from this deployment's Python: where ``debian_packages`` writes the
input (``SPARKBATCH_HOME``, ``SPARKBATCH_DEMO_ROWS``: one place decides, for the builder and
the job) and the deployment's engine (``resources/``, also used by the benchmarks)."""

import dagster as dg

from sparkbatch_dagster import VLLMResource


@dg.template_var
def demo_home() -> str:
    from assets.debian import HOME

    return str(HOME)


@dg.template_var
def demo_input() -> str:
    from assets.debian import INPUT

    return str(INPUT)


@dg.template_var
def deployment_engine() -> VLLMResource:
    from resources import vllm_resource

    return vllm_resource()
