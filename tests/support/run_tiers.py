"""Run the suite tier by tier and say what each took: what `make test` and `make check` call.

    python tests/support/run_tiers.py                  # every tier: unit, e2e, real, browser
    python tests/support/run_tiers.py unit             # one tier
    python tests/support/run_tiers.py e2e -- -k bucket # pytest's own options after --

Each tier is one pytest session: the unit and e2e tiers spread over ``SPARKBATCH_TEST_WORKERS``
processes (pytest-xdist; default 2, the cores of the machines this runs on), the real tier in one
process around one warm engine, the browser tier in one. A tier that fails does not stop the next:
the table at the end names every tier's outcome and time, and its last line counts every test.
The exit status is the worst tier's (5, "no tests", counts as a pass for a tier filtered to nothing
by ``-k``)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ORDER = ("unit", "e2e", "real", "browser")
#: Tiers whose tests are independent processes' worth of work: spread over workers. The real tier
#: shares one engine per pytest process (a second worker would start a second one), the browser
#: tier one `dagster dev`.
PARALLEL = {"unit", "e2e"}


@dataclass
class Outcome:
    tier: str
    status: int
    seconds: float
    passed: int = 0
    failed: int = 0
    skipped: int = 0


def pytest_command(tier: str, extra: list[str], report: Path) -> list[str]:
    workers = os.environ.get("SPARKBATCH_TEST_WORKERS", "2")
    cmd = [sys.executable, "-m", "pytest", f"tests/{tier}", "-q", "--durations=10", f"--junitxml={report}"]
    if tier in PARALLEL and workers not in ("0", "1"):
        # loadgroup: a module marked xdist_group (the fault harness) runs on one worker, in order.
        cmd += ["-n", workers, "--dist", "loadgroup"]
    return cmd + extra


def counts(report: Path) -> tuple[int, int, int]:
    """Passed, failed (errors included) and skipped, from a tier's JUnit XML."""
    if not report.exists():
        return 0, 0, 0
    root = ET.parse(report).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    tests = sum(int(s.get("tests", 0)) for s in suites)
    failed = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
    skipped = sum(int(s.get("skipped", 0)) for s in suites)
    return tests - failed - skipped, failed, skipped


def run_tier(tier: str, extra: list[str], reports: Path) -> Outcome:
    report = reports / f"{tier}.xml"
    report.unlink(missing_ok=True)
    print(f"\n=== tier {tier}: tests/{tier}/ ===", flush=True)
    started = time.monotonic()
    status = subprocess.call(pytest_command(tier, extra, report), cwd=REPO)
    return Outcome(tier, status, time.monotonic() - started, *counts(report))


def table(outcomes: list[Outcome]) -> str:
    lines = ["", "tier      time      passed  failed  skipped  status"]
    for o in outcomes:
        verdict = "ok" if o.status in (0, 5) else f"FAILED (pytest exit {o.status})"
        minutes, seconds = divmod(round(o.seconds), 60)
        lines.append(f"{o.tier:<9} {minutes:>3}:{seconds:02d}  {o.passed:>8} {o.failed:>7} {o.skipped:>8}  {verdict}")
    total = round(sum(o.seconds for o in outcomes))
    lines.append(f"{'all':<9} {total // 60:>3}:{total % 60:02d}")
    # One closing line a CI reads, over every tier.
    lines.append(f"tiers: {sum(o.passed for o in outcomes)} passed, {sum(o.failed for o in outcomes)} failed, "
                 f"{sum(o.skipped for o in outcomes)} skipped")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1:]
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("tiers", nargs="*", help=f"which of {', '.join(ORDER)} (default: all)")
    args = parser.parse_args(argv)
    unknown = [t for t in args.tiers if t not in ORDER]
    if unknown:
        parser.error(f"no tier {', '.join(unknown)}: the tiers are {', '.join(ORDER)} (folders under tests/)")
    args.tiers = args.tiers or list(ORDER)
    reports = REPO / ".pytest_cache" / "tiers"
    reports.mkdir(parents=True, exist_ok=True)
    outcomes = [run_tier(tier, extra, reports) for tier in ORDER if tier in args.tiers]
    print(table(outcomes), flush=True)
    bad = [o.status for o in outcomes if o.status not in (0, 5)]
    return max(bad) if bad else 0


if __name__ == "__main__":
    sys.exit(main())
