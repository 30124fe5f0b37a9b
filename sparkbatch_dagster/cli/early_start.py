"""`sparkbatch run`'s engine, started before the run shards (issue 61): sharding, the Dagster run's
start and the first shards' reading, rendering and store lookups run while ``vllm.LLM(...)``
loads (``definitions/prestart.py``)."""

from __future__ import annotations

import logging
from typing import Any

from ..definitions.factory import BatchJob
from ..definitions.prestart import Prestart
from ..definitions.resource import VLLMResource


def start_engine_early(job: BatchJob, defs: Any, only: tuple[str, str] | None) -> Prestart | None:
    """Begin the engine's start now (``import vllm`` here, the rest in a thread) when this run will
    label: sharding, the Dagster run's start and the first shards' reading, rendering and store
    lookups then run while vLLM loads, not before it (issue 61; ``definitions/prestart.py``).
    None, and nothing started, for a cascade (its stages start when their rows need them),
    servers someone else runs, or a job whose shards are all done under this version: a rerun
    with nothing to label starts no engine (one whose input grew starts its engine at its first
    prompt, as every run did before)."""
    resource = defs.resources.get(job.resource_key)
    if not isinstance(resource, VLLMResource) or job.spec.cascade:
        return None
    manifest = job.home.read_manifest()
    if manifest is not None:
        done = set(job.done_partitions(resource))
        if all(k in done or (only and not only[0] <= k <= only[1]) for k in manifest["keys"]):
            return None
    resource.use_home(job.home, logging.getLogger("sparkbatch"))  # the compile cache travels with it
    return resource.prestart()
