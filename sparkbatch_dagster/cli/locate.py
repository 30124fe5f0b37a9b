"""Where the CLI finds things: the batch jobs of a definitions file, and the Dagster instance
its runs go through (``$DAGSTER_HOME``, as ``dagster dev`` uses it)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from ..definitions.deploy import GPU_POOL, pool_limit
from ..definitions.factory import BatchJob
from ..errors import SparkbatchError
from ..home import FileLock


def load(path: str, job_name: str | None) -> tuple[BatchJob, Any]:
    """Import a definitions file; return its BatchJob (by name when several) and Definitions.

    The Definitions is the file's module-level ``Definitions`` or its ``@dg.definitions``
    function's (``dg.load_from_defs_folder`` included); its jobs are found by their
    ``labeled_outputs`` asset, whether ``build_batch_assets`` or a defs.yaml built them."""
    from dagster import Definitions
    from dagster.components.definitions import LazyDefinitions

    from ..definitions.factory import find_job

    file = Path(path).resolve()
    if not file.exists():
        raise SparkbatchError(f"{path} does not exist: pass the file that builds your Definitions with -f")
    sys.path.insert(0, str(file.parent))
    mod_spec = importlib.util.spec_from_file_location(file.stem, file)
    assert mod_spec and mod_spec.loader
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    found: list[Any] = [v for v in vars(module).values() if isinstance(v, LazyDefinitions)]
    found = found or [v for v in vars(module).values() if isinstance(v, Definitions)]
    if len(found) != 1:
        raise SparkbatchError(f"{path} must define one Definitions object (or one @dg.definitions function) at "
                              f"module level; it has {len(found)}")
    defs = found[0]
    if isinstance(defs, LazyDefinitions):
        if defs.has_context_arg:
            raise SparkbatchError(f"{path}: the @dg.definitions function takes a ComponentLoadContext, which the "
                                  "CLI has none of: drop the argument (dg.load_from_defs_folder needs none)")
        defs = defs()
    jobs = {job.spec.name: job for a in defs.assets or [] for key in getattr(a, "keys", ())
            if (job := find_job(key)) is not None}
    if not jobs:
        raise SparkbatchError(f"{path} builds no batch job: its Definitions must hold the assets of "
                              "build_batch_assets(...) or of a BatchInferenceComponent defs.yaml")
    if job_name is None and len(jobs) > 1:
        raise SparkbatchError(f"{path} defines jobs {sorted(jobs)}: choose one with --job")
    name = job_name or next(iter(jobs))
    if name not in jobs:
        raise SparkbatchError(f"no job {name!r} in {path}; it has {sorted(jobs)}")
    return jobs[name], defs


def instance() -> Any:
    """The Dagster instance in $DAGSTER_HOME, its storage created under a file lock.

    Two runs started at once on a fresh instance (one per GPU) would otherwise both create
    the SQLite schemas and one would fail on the other's migration.
    """
    from dagster import DagsterInstance

    default = not os.environ.get("DAGSTER_HOME")
    if default:
        os.environ["DAGSTER_HOME"] = str(Path(".dagster_home").resolve())
    home = Path(os.environ["DAGSTER_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    lock = FileLock(home / ".sparkbatch-init.lock")
    lock.acquire(wait=True)
    try:
        inst = DagsterInstance.get()
        inst.get_runs(limit=1)
        inst.get_dynamic_partitions("sparkbatch-init")
        inst.all_instigator_state()
        if default and pool_limit(inst, GPU_POOL) is None:
            # The instance this CLI sets up runs one engine-starting run at a time: one run drives
            # every GPU of the box (one engine per GPU), so a second one at once would fight it.
            inst.event_log_storage.set_concurrency_slots(GPU_POOL, 1)
        return inst
    finally:
        lock.release()
