"""``sparkbatch review export`` and ``sparkbatch review import``: the arguments, where Label Studio
is (``--url`` / ``LABEL_STUDIO_URL``, ``--api-key`` / ``LABEL_STUDIO_API_KEY``), and after an import
that added labels, the job's ``human_labels`` asset materialized so the UI and the views show them.
What they do is :mod:`.label_studio`'s.

Example::

    sparkbatch review export -f definitions.py --limit 200
    sparkbatch review import -f definitions.py --project "tickets, week 12"
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from ..errors import SparkbatchError
from ..review.label_studio import Server, export_review
from ..review.label_studio_import import import_review
from . import console
from .locate import instance, load


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """``review`` and its two commands, on ``sparkbatch``'s sub-parsers."""
    p = sub.add_parser("review", help="send the review queue to Label Studio, read the reviewers' labels back")
    inner = p.add_subparsers(dest="review_command", required=True)
    for name, text in (("export", "create or update a Label Studio project with the review queue as tasks"),
                       ("import", "read the project's finished annotations back as the job's human labels")):
        q = inner.add_parser(name, help=text, parents=[common])
        q.add_argument("-f", "--file", default="definitions.py", help="file that builds the Definitions")
        q.add_argument("--job", help="job name, when the file defines several")
        q.add_argument("--url", help="Label Studio's address, e.g. http://localhost:8080 (default $LABEL_STUDIO_URL)")
        q.add_argument("--api-key", help="a Label Studio access token (default $LABEL_STUDIO_API_KEY)")
        q.add_argument("--project", help="the project's title (default: the job's name)")
        if name == "export":
            q.add_argument("--limit", type=int, help="send at most N rows of the queue, least sure first")
        else:
            q.add_argument("--dismiss-skipped", action="store_true",
                           help="take the rows whose tasks a reviewer skipped out of the review queue (without it a "
                                "skip means 'not now': the row stays queued and review_complete waits for it)")


def server_of(args: argparse.Namespace) -> Server:
    """Where Label Studio is, from the flags or the environment; a missing one named with both."""
    url = args.url or os.environ.get("LABEL_STUDIO_URL")
    key = args.api_key or os.environ.get("LABEL_STUDIO_API_KEY")
    if not url:
        raise SparkbatchError("no Label Studio address: pass --url or set LABEL_STUDIO_URL (e.g. http://localhost:8080)")
    if not key:
        raise SparkbatchError("no Label Studio API key: pass --api-key or set LABEL_STUDIO_API_KEY (the access token "
                              "of Account & Settings in Label Studio)")
    return Server(url, key)


def command(args: argparse.Namespace) -> dict[str, Any]:
    """Run ``review export`` or ``review import``; return its JSON line."""
    if getattr(args, "limit", None) is not None and args.limit < 1:
        raise SparkbatchError(f"--limit {args.limit} must be 1 or more: the number of queue rows to send")
    server = server_of(args)
    job, defs = load(args.file, args.job)
    args.job_home = job.home.root
    if args.review_command == "export":
        return export_review(job, defs.resources[job.resource_key], server, args.project, args.limit).to_json()
    result = import_review(job, server, args.project, args.dismiss_skipped).to_json()
    changed = result["path"] or result["dismissed"]
    return {**result, **(materialize_human_labels(job, defs) if changed else {"materialized": False})}


def materialize_human_labels(job: Any, defs: Any) -> dict[str, Any]:
    """Materialize the job's ``human_labels`` asset: ``materialized`` (False when the job has none)
    and ``review_complete``, its check (every queued row reviewed; a failed check is an answer here,
    not an error). A failed materialization says so, the labels being merged already."""
    from dagster import materialize

    key = job.keys.get("human_labels")
    if key is None:
        return {"materialized": False}
    done = materialize(list(defs.assets or job.assets), selection=[key], resources=defs.resources,
                       instance=instance(), run_config=console.run_config(), raise_on_error=False)
    if not any(e.asset_key == key for e in done.get_asset_materialization_events()):
        failed = [(e.step_failure_data.error.message.strip().splitlines() or ["?"])[-1]
                  for e in done.get_step_failure_events() if e.step_failure_data.error is not None]
        raise SparkbatchError(f"the human labels are merged, but materializing {key.to_user_string()} failed "
                              f"({'; '.join(failed) or 'see the run in the Dagster UI'}): materialize it again there")
    checks = [c.passed for c in done.get_asset_check_evaluations() if c.asset_key == key]
    return {"materialized": True, "review_complete": all(checks) if checks else None}
