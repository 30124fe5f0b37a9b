"""``sparkbatch run-batch`` and ``sparkbatch export-batch``: a provider batch file end to end, as
``vllm run-batch -i in.jsonl -o out.jsonl`` runs one, but as a job (partitions, resume, reuse,
the estimate and the bill; docs/batch-files.md)::

    sparkbatch run-batch -i requests.jsonl -o results.jsonl --errors errors.jsonl --model /models/qwen-7b
    sparkbatch export-batch -i requests.jsonl -o results.jsonl     # what is finished so far (while it runs)
    sparkbatch serve-batch --root /data/batches --model /models/qwen-7b   # the Batch API (serve_batch.py)

``--engine-file engine.py`` gives the engine as Python (a file that sets ``resource``, such as
``resource = VLLMResource(model="/models/qwen-7b", max_num_seqs=512)``) instead of ``--model``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..definitions.batch_files import batch_file_job, export_batch
from ..definitions.resource import VLLMResource
from ..errors import ConfigError
from ..spec import SamplingSpec


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """The three commands' arguments, on ``sparkbatch``'s sub-parsers."""
    for name, text in (("run-batch", "run an OpenAI or Anthropic batch file end to end, then write its results"),
                       ("export-batch", "write a batch-file job's finished rows as the provider's result files")):
        p = sub.add_parser(name, help=text, parents=[common])
        p.add_argument("-i", "--input", required=True, help="the batch file (JSONL: one request a line)")
        p.add_argument("-o", "--output", required=True, help="results file (JSONL)")
        p.add_argument("--errors", help="error file; default: error lines go to the results file (as vllm run-batch)")
        p.add_argument("--format", default="auto", choices=["auto", "openai_batch", "anthropic_batch"],
                       help="the file's provider (auto: from its first line)")
        p.add_argument("--home", help="the job's folder (default: <input>.sparkbatch beside the file)")
        p.add_argument("--job-name", help="the job's name (default: from the file's name)")
        p.add_argument("--result-store", help="folder of stored answers, shared with other jobs (default: "
                       "<home>/results); an identical request answered there before is not generated again")
        _job_options(p, name)
    p = sub.add_parser("serve-batch", parents=[common],
                       help="serve OpenAI's Files and Batches endpoints and Anthropic's Message Batches: each batch a "
                       "job on this box",
                       description="Serve the Batch APIs on this box, each batch a job: OpenAI's /v1/files and "
                       "/v1/batches (for openai.OpenAI(base_url='http://HOST:PORT/v1')) and Anthropic's "
                       "/v1/messages/batches (for anthropic.Anthropic(base_url='http://HOST:PORT')); the OpenAPI "
                       "document is /openapi.json. docs/batch-files.md.")
    p.add_argument("--root", default="sparkbatch-batches", help="folder of the files and batches (default "
                   "./sparkbatch-batches); a server started again on it carries on")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback; another needs --api-key)")
    p.add_argument("--port", type=int, default=8400, help="port (default 8400)")
    p.add_argument("--api-key", default=os.environ.get("SPARKBATCH_API_KEY"),
                   help="the key clients must send (default $SPARKBATCH_API_KEY; none on loopback)")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="another Host name clients use (repeatable; loopback names and --host are allowed already)")
    p.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="a web page origin allowed to call, e.g. https://notebook.example.com (repeatable; "
                   "default: loopback pages only)")
    p.add_argument("--max-upload-mb", type=int, default=512, help="the largest request body taken, in MiB (512)")
    _job_options(p, "serve-batch")


def _sampling(args: argparse.Namespace) -> SamplingSpec:
    """What a line that sets none gets; a temperature only where given (else the APIs' 1.0)."""
    given = getattr(args, "temperature", None)
    return SamplingSpec(max_tokens=args.max_tokens, **({"temperature": given} if given is not None else {}))


def _job_options(p: argparse.ArgumentParser, name: str) -> None:
    """The engine and the job's options, as each of the three commands takes them."""
    p.add_argument("--max-tokens", type=int, default=256, help="max_tokens of a line that sets none (256)")
    if name == "run-batch":
        p.add_argument("--temperature", type=float, help="temperature of a line that sets none (default: 1.0, as "
                       "the hosted APIs; each such line is then a draw, generated every time; 0: greedy, reusable)")
    elif name == "serve-batch":
        p.description = (p.description or "") + " A line without temperature samples at 1.0 with no seed, as " \
            "the hosted APIs: a draw, generated every time and never reused."
    p.add_argument("--shard-size", type=int, default=10_000, help="requests per partition (10000)")
    p.add_argument("--model", help="model path or embedded name (default: VLLMResource's, SmolLM2)"
                   + ("; the model whose rows to write" if name == "export-batch" else ""))
    p.add_argument("--engine-file", help="a Python file that sets `resource` (a VLLMResource): the engine's "
                   "settings, instead of --model")
    if name != "export-batch":
        p.add_argument("--hourly-rate", type=float, default=0.79, help="the box's price per hour, for the bill")


def engine(args: argparse.Namespace) -> VLLMResource:
    """The engine resource of ``--engine-file`` (its ``resource``), else ``VLLMResource(model=--model)``."""
    if not getattr(args, "engine_file", None):
        return VLLMResource(model=getattr(args, "model", None))
    if getattr(args, "model", None):
        raise ConfigError("give --model or --engine-file, not both: the engine file sets the model")
    import runpy

    try:
        found = runpy.run_path(args.engine_file).get("resource")
    except OSError as exc:
        raise ConfigError(f"--engine-file {args.engine_file}: {exc}") from exc
    if not isinstance(found, VLLMResource):
        raise ConfigError(f"--engine-file {args.engine_file} must set `resource` to a VLLMResource, e.g. "
                          "resource = VLLMResource(model='/models/qwen-7b')")
    return found


def command(args: argparse.Namespace, run: Callable[[Any, Any], dict[str, Any]]) -> dict[str, Any]:
    """Run (``run-batch``, through ``run``: ``sparkbatch run``'s) or only export
    (``export-batch``); return the summary line."""
    resource = engine(args)
    if args.command == "serve-batch":
        from .serve_batch import serve_batch

        return serve_batch(args, resource)
    extra: dict[str, Any] = {"hourly_rate_usd": args.hourly_rate} if getattr(args, "hourly_rate", None) is not None \
        else {}
    if args.result_store:
        extra["result_store"] = str(Path(args.result_store).resolve())
    job, defs = batch_file_job(args.input, args.format, home=args.home, resource=resource, name=args.job_name,
                               sampling=_sampling(args), shard_size=args.shard_size, **extra)
    out, errors = Path(args.output), Path(args.errors) if args.errors else None
    if args.command == "export-batch":
        return export_batch(job, out, errors, resource).to_json()
    return run_batch(job, defs, out, errors, run)


def run_batch(job: Any, defs: Any, out: Path, errors: Path | None,
              run: Callable[[Any, Any], dict[str, Any]]) -> dict[str, Any]:
    """Run the job with ``run`` (``sparkbatch run``'s machinery: missing partitions only; passed
    in, as ``commands.run_batch`` does, so this module never imports ``commands``), then export.
    A run that stops (a cancel, a failure) still exports the rows it finished, then re-raises."""
    resource = defs.resources[job.resource_key]  # its output version: the rows this run wrote, committed or not
    try:
        summary = run(job, defs)
    except BaseException:
        try:
            partial = export_batch(job, out, errors, resource)
            print(f"sparkbatch: the run stopped; {partial.written + partial.errors} finished rows written to "
                  f"{out}, {partial.remaining} remain: run the same command again to finish them", file=sys.stderr)
        except Exception as exc:  # noqa: BLE001 - nothing was finished: the run's own error says why
            print(f"sparkbatch: no partial export ({exc})", file=sys.stderr)
        raise
    return {**summary, "export": export_batch(job, out, errors, resource).to_json()}
