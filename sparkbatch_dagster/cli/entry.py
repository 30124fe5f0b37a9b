"""``sparkbatch``: drive a job's assets from a shell, filling only the gaps.

    sparkbatch estimate -f definitions.py  time a sample: duration, cost per node option, model choice
    sparkbatch run -f definitions.py       shard if needed, label missing partitions, analytics
    sparkbatch run --range A:B             only partitions A..B (one process per GPU)
    sparkbatch run --estimate --max-cost 2.5 --deadline 2h   time a sample on the run's engine, then label
                                           under a brake (docs/estimate.md)
    sparkbatch status -f definitions.py    which partitions are done, and what to run next
    sparkbatch preview -f definitions.py   rendered prompts, token counts, what a run would generate
    sparkbatch sql -f definitions.py "FROM label_distribution"   query the results with DuckDB
    sparkbatch prepare-model [NAME ...]    convert embedded models once (default: SmolLM2)
    sparkbatch run-batch -i in.jsonl -o out.jsonl   an OpenAI/Anthropic batch file end to end (cli/batch.py)
    sparkbatch export-batch -i in.jsonl -o out.jsonl   its finished rows as the provider's result files
    sparkbatch review export -f definitions.py   the review queue into a Label Studio project
    sparkbatch review import -f definitions.py   its finished annotations back as human labels

Stdout carries one JSON line, the result; logs, the progress bar and advice go to stderr, and
an error is one ``sparkbatch:`` line with its fix (``--debug``: logs, warnings, tracebacks).

The commands themselves are :mod:`.commands`; this module turns arguments into one of them.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import SparkbatchError, storage_error
from ..home import check_key
from . import batch, console, review
from .budget import continue_with, label_config
from .commands import estimate, run, run_json, sql, status
from .locate import load

# At exit, Python's last collections walk every object still alive (Dagster, DuckDB, the run's
# records) before the process frees them all anyway: half a second and more of each command's end
# (benchmarks/cli_cost.py). Frozen, they are left to the exit, as vLLM's engine core does on ROCm.
# What must reach the disk never waits for a finalizer: a command survives SIGKILL at any point.
# Registered at import, so it runs after the handlers registered later (LIFO), and only at the exit.
atexit.register(gc.freeze)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sparkbatch", description=__doc__.splitlines()[0] if __doc__ else None)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", help="show framework logs, warnings and tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (("run", "label every partition not yet done"), ("status", "show done/missing partitions"),
                       ("estimate", "time a sample; predict duration and cost; compare models"),
                       ("preview", "show rendered prompts and per-shard counts, without an engine"),
                       ("sql", "query the job's DuckDB views (labeled, label_distribution, review, reliability, "
                               "run_metrics)"),
                       ("worker-node", "join this machine to a multi-node engine (docs/multi-node.md)")):
        p = sub.add_parser(name, help=text, parents=[common])
        p.add_argument("-f", "--file", default="definitions.py", help="file that builds the Definitions")
        p.add_argument("--job", help="job name, when the file defines several")
        if name == "run":
            p.add_argument("--range", help="only partitions FIRST:LAST, e.g. shard-00000:shard-00003")
            p.add_argument("--estimate", action="store_true",
                           help="time a sample on the run's engine first, print the prediction, then label (one start)")
            p.add_argument("--max-cost", type=float, metavar="USD",
                           help="refuse, or stop cleanly, when the predicted bill exceeds it (JobSpec.max_cost_usd)")
            p.add_argument("--deadline", help="when the rental ends: 2026-12-01T18:00:00+00:00, or 2h30m from now; "
                                              "stops cleanly in time to commit (JobSpec.deadline)")
        if name == "estimate":
            p.add_argument("--sample-rows", type=int, help="rows to time (default: the spec's, 80)")
            p.add_argument("--models", help="candidates to compare, comma-separated; engine settings after '@', "
                           "joined by '+' (e.g. gemma-3-270m,/models/qwen-8b@quantization=fp8)")
            p.add_argument("--hourly-rate", type=float, metavar="USD",
                           help="this machine's price per hour: adds the option 'this machine' at the measured speed")
            p.add_argument("--accuracy-bar", type=float, help="least sample accuracy a model needs")
            p.add_argument("--hosted-prices", metavar="FILE",
                           help="your table of hosted batch prices (YAML or CSV: name, input_per_million_usd, "
                                "output_per_million_usd): the job's tokens priced at each, beside the box's options")
        if name == "preview":
            p.add_argument("-n", type=int, default=5, help="prompts to show (default 5)")
        if name == "sql":
            p.add_argument("query", help='e.g. "FROM label_distribution"')
        if name == "worker-node":
            p.add_argument("--node-rank", type=int, required=True, help="this machine's rank, 1 to nnodes-1")
            p.add_argument("--once", action="store_true", help="serve one engine of the first node, then exit")
            p.add_argument("--print", dest="print_only", action="store_true",
                           help="print the vLLM command; start nothing")
    batch.add_parsers(sub, common)
    review.add_parsers(sub, common)
    p = sub.add_parser("prepare-model", help="convert embedded models once", parents=[common])
    p.add_argument("names", nargs="*", help="embedded model names (default: SmolLM2-135M-Instruct)")
    return parser


def _price_file(path: str | None) -> str | None:
    """``--hosted-prices``: checked now, before any engine starts; the asset reads it by its path."""
    if path is None:
        return None
    from ..spec import EstimateSpec

    fields: dict[str, Any] = {"hosted_prices": path}
    EstimateSpec(**fields)  # a bad table stops here, naming the file, row and value
    return str(Path(path).resolve())


def _command(args: argparse.Namespace) -> dict[str, Any]:
    if args.command == "prepare-model":
        from ..engines.platform.model import DEFAULT_MODEL_NAME, EMBEDDED, ensure_embedded

        unknown = sorted(set(args.names) - set(EMBEDDED))
        if unknown:
            raise SparkbatchError(f"unknown embedded model(s) {unknown}: choose from {sorted(EMBEDDED)}")
        return {n: str(ensure_embedded(n)) for n in args.names or [DEFAULT_MODEL_NAME]}
    if args.command in ("run-batch", "export-batch", "serve-batch"):
        return batch.command(args, _noting_home(args, run_json))
    if args.command == "review":
        return review.command(args)
    job, defs = load(args.file, args.job)
    args.job_home = job.home.root
    resource = defs.resources[job.resource_key]
    if args.command == "status":
        st = status(job, resource, args.file)
        for line in st.warnings:
            print(f"sparkbatch: warning: {line}", file=sys.stderr)
        return st.to_json()
    if args.command == "worker-node":
        from ..engines.server.multinode import worker_node

        return worker_node(resource.engine_settings(), args.node_rank, once=args.once, print_only=args.print_only,
                           log=lambda m: print(f"sparkbatch: {m}", file=sys.stderr))
    if args.command == "sql":
        return sql(job, resource, args.query)
    if args.command == "preview":
        from .preview import describe, planning_home, preview

        with planning_home(job) as home:  # read-only: a changed input is sharded in a scratch folder
            report = preview(job, resource, args.n, home)
        print("\n".join(describe(report)), file=sys.stderr)
        return report.to_json()  # the edge: the printed JSON line
    if args.command == "estimate":
        overrides = {"sample_rows": args.sample_rows, "accuracy_bar": args.accuracy_bar,
                     "hourly_rate_usd": args.hourly_rate, "hosted_prices": _price_file(args.hosted_prices),
                     "models": [m.strip() for m in args.models.split(",") if m.strip()] if args.models else None}
        return estimate(job, defs, {k: v for k, v in overrides.items() if v is not None})
    only = None
    if args.range:
        first, sep, last = args.range.partition(":")
        if not sep:
            raise SparkbatchError(f"--range {args.range!r} must look like shard-00000:shard-00003")
        only = (check_key(first), check_key(last))
    return run(job, defs, only, label_config(args)).to_json()  # the edge: the printed JSON line


def _noting_home(args: argparse.Namespace, run: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """``run`` that first notes its job's home, which a full or read-only disk's line names."""
    def noted(job: Any, *rest: Any) -> dict[str, Any]:
        args.job_home = job.home.root
        return run(job, *rest)

    return noted


def _one_line(exc: Exception, args: argparse.Namespace) -> BaseException:
    """The error to tell: a full, read-only or forbidden home as one :class:`StorageError` line
    (wherever the write failed: a part file, DuckDB's metrics, a lock), else ``exc``."""
    return storage_error(exc, getattr(args, "job_home", None)) or continue_with(exc, args)


def main(argv: list[str] | None = None) -> int:
    """The ``sparkbatch`` command: one JSON line on stdout, or one ``sparkbatch:`` error line on
    stderr; returns the exit code. Example::

        main(["status", "-f", "definitions.py"])   # 0, and the status as one JSON line
    """
    args = _parser().parse_args(argv)
    console.configure(args.debug)
    try:
        with console.json_stdout() as emit:
            emit(_command(args))
        return 0
    except Exception as exc:
        told = _one_line(exc, args)
        line = console.error_line(told)
        if line is None or console.debugging():
            raise
        print(line, file=sys.stderr)
        return console.exit_code(told)

