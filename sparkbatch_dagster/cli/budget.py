"""``sparkbatch run``'s brake flags: ``--estimate``, ``--max-cost``, ``--deadline`` become
``labeled_outputs``' launchpad config, checked before anything runs; a brake's stop is said
with this command's own file, job and range (docs/estimate.md, "Estimate, then run, under a budget").

Example::

    label_config(argparse.Namespace(estimate=True, max_cost=2.5, deadline="2h"))
    # {"estimate": True, "max_cost_usd": 2.5, "deadline": "2026-12-01T14:00:00+00:00"}
"""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import BudgetStop


def label_config(args: argparse.Namespace) -> dict[str, Any]:
    """``labeled_outputs``' config from ``sparkbatch run``'s flags, checked before anything runs (a
    duration deadline becomes the time it ends, counted from now)."""
    from ..run.brake import check_max_cost, parse_deadline

    config: dict[str, Any] = {"estimate": True} if args.estimate else {}
    if args.max_cost is not None:
        config["max_cost_usd"] = check_max_cost(args.max_cost, "--max-cost")
    if args.deadline:
        config["deadline"] = parse_deadline(args.deadline).isoformat()
    return config


def continue_with(exc: BaseException, args: argparse.Namespace) -> BaseException:
    """A brake's stop names ``sparkbatch run``; say it with this command's file, job and range."""
    stop = exc if isinstance(exc, BudgetStop) else getattr(exc, "user_exception", None)
    if not isinstance(stop, BudgetStop) or args.command != "run":
        return exc
    same = f"sparkbatch run -f {args.file}" + (f" --job {args.job}" if args.job else "") + \
        (f" --range {args.range}" if args.range else "")
    return BudgetStop(str(stop).replace("`sparkbatch run", f"`{same}"), stop.raise_to_usd)
