"""A provider batch file as a job, and the job's rows as the provider's result files: the pieces
``sparkbatch run-batch`` / ``export-batch`` are made of, callable by any front end (a server of
the Files and Batches endpoints makes one job per batch the same way).

Example::

    job, defs = batch_file_job("requests.jsonl", resource=VLLMResource(model="/models/qwen-7b"))
    ...  # run it (cli.commands.run, or materialize the assets)
    export_batch(job, Path("out.jsonl"), Path("errors.jsonl"))
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..inputs.batch_input import sniff_format
from ..run.batch_export import ExportSummary, Tally, export, tally
from ..spec import BATCH_INPUTS, JobSpec, SamplingSpec
from .factory import BatchJob, build_batch_assets
from .resource import VLLMResource


def job_name(path: str | Path) -> str:
    """A job name from a file name: ``Requests-2026.jsonl`` -> ``batch_requests_2026``."""
    stem = re.sub(r"[^a-z0-9]+", "_", Path(str(path)).name.split(".")[0].lower()).strip("_")
    return f"batch_{stem}"[:63].rstrip("_")


def batch_file_job(input: str | Path, input_format: str = "auto", *, home: str | Path | None = None,
                   name: str | None = None, resource: VLLMResource | None = None,
                   sampling: SamplingSpec | None = None, shard_size: int | None = 10_000,
                   **spec: Any) -> tuple[BatchJob, Any]:
    """A job over a provider batch file: ``input_format`` ``openai_batch`` / ``anthropic_batch``
    (``auto``: sniffed from its first line), its home ``<file>.sparkbatch`` beside it unless
    given, the rows sharded by ``shard_size``; ``sampling``: what a line that sets none gets
    (its ``max_tokens``...); ``spec``: other :class:`JobSpec` fields (``hourly_rate_usd``...).
    Returns the job and a ``Definitions`` with ``resource`` (default: ``VLLMResource()``)."""
    from dagster import Definitions

    fmt = sniff_format(str(input)) if input_format == "auto" else input_format
    if fmt not in BATCH_INPUTS:
        raise ConfigError(f"input_format={input_format!r} is not a batch file format: use one of {list(BATCH_INPUTS)}")
    path = Path(str(input))
    where = str(path.resolve()) if "://" not in str(input) else str(input)
    job_spec = JobSpec(name=name or job_name(path), input=where, input_format=fmt,  # type: ignore[arg-type]
                       home=str(home or path.resolve().with_name(path.name + ".sparkbatch")),
                       sampling=sampling or SamplingSpec(max_tokens=256), shard_size=shard_size, **spec)
    vllm = resource or VLLMResource()
    job = build_batch_assets(spec=job_spec, resource=vllm)
    return job, Definitions(assets=job.assets, resources={job.resource_key: vllm})


def export_batch(job: BatchJob, out: Path, errors: Path | None = None, resource: VLLMResource | None = None,
                 version: str | None = None, cite_requests: bool = False) -> ExportSummary:
    """Write ``job``'s finished rows as its input format's result files: answers to ``out``, error
    rows to ``errors`` (``None``: to ``out`` too). Which output version: ``version``, else the one
    ``resource`` labels when it has rows (a run's, before its first commit too), else the latest
    committed one. Returns the counts (``written``, ``errors``, ``remaining``, ``complete``: its
    ``tally``) and what the rows cost (its ``usage``: ``input_tokens``, ``output_tokens``, ``reused``,
    ``model``). ``cite_requests``: errors cite a Message Batch's requests, not lines (serve-batch's)."""
    if job.spec.input_format not in BATCH_INPUTS:
        raise ConfigError(f"job {job.spec.name!r} reads input_format={job.spec.input_format!r}: only a batch-file job "
                          f"({', '.join(BATCH_INPUTS)}) exports batch result files; use read_outputs() for others")
    return export(job.home, _version(job, resource, version), job.spec.input_format, out, errors, cite_requests)


def batch_counts(job: BatchJob, resource: VLLMResource | None = None) -> Tally:
    """What :func:`export_batch` would return now (``written``, ``errors``, ``remaining``, ``rows``,
    ``complete``), writing no file: a progress poll's (``sparkbatch serve-batch``)."""
    return tally(job.home, _version(job, resource, None))


def _version(job: BatchJob, resource: VLLMResource | None, version: str | None) -> str:
    """The output version to export: ``version``, else the one ``resource`` labels when it has
    rows, else the latest committed one (the home refreshed from its bucket first)."""
    job.home.refresh()
    if version is None and resource is not None:
        mine = job.output_version(resource)
        version = mine if job.home.version_dir(mine).exists() else None
    return version or job.current_version()
