"""Run the suite tier by tier and say what each took: what `make test` and `make check` call.

    python tests/support/run_tiers.py                  # every tier: unit, e2e, real, browser
    python tests/support/run_tiers.py unit             # one tier
    python tests/support/run_tiers.py e2e -- -k bucket # pytest's own options after --
    python tests/support/run_tiers.py --long           # the tests marked long (make soak), every tier

Which tests: ``make test`` (the default) leaves out the tests marked ``long`` (docs/testing.md, "The
gate and the long tests"): a second or third case of a promise the gate already tries, on a costlier
process (more seeds of a seeded hunt, a second engine of the same kind, a model split over two
nodes); ``--long`` runs those alone, ``--all`` both.

Each tier is one pytest session: the unit and e2e tiers spread over ``SPARKBATCH_TEST_WORKERS``
processes (pytest-xdist; default 2, the cores of the machines this runs on), the real tier in one
process around one warm engine, the browser tier in one. After the unit tier, the real tier runs
beside the e2e tier and then the browser tier (``SPARKBATCH_TEST_OVERLAP=0``: each tier alone, in
order). A tier that fails does not stop the next: the table at the end names every tier's outcome
and time, and its last line counts every test (a tier that failed before it counted its tests, a
collection error say, counts as one failure). The exit status is the worst tier's (5, "no tests",
counts as a pass for a tier filtered to nothing by ``-k``)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
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


#: The marker expression of each selection (pytest ``-m``); a ``-m`` among pytest's own options comes later and wins.
SELECTIONS = {"gate": ["-m", "not long"], "long": ["-m", "long"], "all": []}


def pytest_command(tier: str, extra: list[str], report: Path) -> list[str]:
    workers = os.environ.get("SPARKBATCH_TEST_WORKERS", "2")
    cmd = [sys.executable, "-m", "pytest", f"tests/{tier}", "-q", "-rfEs", "--durations=10", f"--junitxml={report}"]
    if tier in PARALLEL and workers not in ("0", "1"):
        # loadfile: a module's tests on one worker, in order (the fault harness's last test reads what
        # its seeds injected; module fixtures start once). loadgroup would do it by mark, but with
        # pytest 9 xdist 3.8 no longer groups by it (seen: a group's tests on both workers).
        cmd += ["-n", workers, "--dist", "loadfile"]
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


LASTFAILED = Path("v/cache/lastfailed")


def merge_lastfailed(tier: str, own_cache: Path) -> None:
    """Fold a tier's failures, kept in a cache of its own while it ran beside another tier, into the
    project's pytest cache, so `--lf` after `make test` knows every tier's: pytest writes its cache
    once at the end of a session, and the session that ends last would drop the other's."""
    main = REPO / ".pytest_cache" / LASTFAILED
    theirs = json.loads((own_cache / LASTFAILED).read_text()) if (own_cache / LASTFAILED).exists() else {}
    ours = json.loads(main.read_text()) if main.exists() else {}
    prefix = f"tests/{tier}/"
    merged = {k: v for k, v in ours.items() if not k.startswith(prefix)}
    merged.update({k: v for k, v in theirs.items() if k.startswith(prefix)})
    main.parent.mkdir(parents=True, exist_ok=True)
    main.write_text(json.dumps(merged, indent=2, sort_keys=True))


def start_tier(tier: str, extra: list[str], reports: Path, log: Path | None) -> tuple[subprocess.Popen[bytes], float]:
    """Start a tier's pytest: its output to this terminal, or to ``log`` (and its pytest cache to a
    folder of its own) when it runs beside another."""
    (reports / f"{tier}.xml").unlink(missing_ok=True)
    out = log.open("wb") if log else None
    cmd = pytest_command(tier, extra, reports / f"{tier}.xml")
    if log:
        cmd += ["-o", f"cache_dir={reports / (tier + '-cache')}"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT if out else None)
    if out:
        out.close()
    return proc, time.monotonic()


def run_lane(lane: list[str], extra: list[str], reports: Path, logged: bool) -> list[Outcome]:
    """Run a lane's tiers one after the other, each its own pytest session."""
    outcomes = []
    for tier in lane:
        if not logged:
            print(f"\n=== tier {tier}: tests/{tier}/ ===", flush=True)
        proc, started = start_tier(tier, extra, reports, reports / f"{tier}.log" if logged else None)
        status = proc.wait()
        passed, failed, skipped = counts(reports / f"{tier}.xml")
        if status not in (0, 5):
            failed = max(failed, 1)
        outcomes.append(Outcome(tier, status, time.monotonic() - started, passed, failed, skipped))
        if logged:
            merge_lastfailed(tier, reports / f"{tier}-cache")
    return outcomes


def run_phase(lanes: list[list[str]], extra: list[str], reports: Path) -> list[Outcome]:
    """Run these lanes at once (one lane: in the foreground); each tier's output follows as the
    phase ends, in tier order."""
    if len(lanes) == 1:
        return run_lane(lanes[0], extra, reports, logged=False)
    tiers = [t for lane in lanes for t in lane]
    logs = ", ".join(f".pytest_cache/tiers/{t}.log" for t in tiers)
    print(f"\n=== at once: {' | '.join(' then '.join(lane) for lane in lanes)} "
          f"(each tier's output follows when all have ended; live: {logs}) ===", flush=True)
    with ThreadPoolExecutor(len(lanes)) as pool:
        done = [o for f in [pool.submit(run_lane, lane, extra, reports, True) for lane in lanes] for o in f.result()]
    for tier in sorted(tiers, key=ORDER.index):
        print(f"\n=== tier {tier}: tests/{tier}/ ===\n" + (reports / f"{tier}.log").read_text(errors="replace"),
              flush=True)
    return sorted(done, key=lambda o: ORDER.index(o.tier))


def phases(tiers: list[str]) -> list[list[list[str]]]:
    """How the tiers run: phases one after the other, each a few lanes at once, each lane its tiers
    in order. The unit tier first, alone (it answers in seconds); then the e2e tier beside the real
    tier (one engine bound to one core, idle while it loads) and then the browser tier, unless
    SPARKBATCH_TEST_OVERLAP=0: every tier alone, in order. The browser tier follows the real one: the
    gate's real tier ends well before its e2e tier (21 against 34 minutes, 2026-12-07), and the
    browser's engine then starts after the real tier's session engine has stopped."""
    if os.environ.get("SPARKBATCH_TEST_OVERLAP", "1") == "0":
        return [[[t]] for t in tiers]
    out = [[[t]] for t in tiers if t == "unit"]
    lanes = [[t for t in tiers if t == "e2e"], [t for t in tiers if t in ("real", "browser")]]
    lanes = [lane for lane in lanes if lane]
    return out + ([lanes] if lanes else [])


def table(outcomes: list[Outcome], wall: int) -> str:
    lines = ["", "tier      time      passed  failed  skipped  status"]
    for o in outcomes:
        verdict = "ok" if o.status in (0, 5) else f"FAILED (pytest exit {o.status})"
        minutes, seconds = divmod(round(o.seconds), 60)
        lines.append(f"{o.tier:<9} {minutes:>3}:{seconds:02d}  {o.passed:>8} {o.failed:>7} {o.skipped:>8}  {verdict}")
    lines.append(f"{'all':<9} {wall // 60:>3}:{wall % 60:02d}  (wall clock; tiers run at once overlap)")
    # One closing line a CI reads, over every tier.
    lines.append(f"tiers: {sum(o.passed for o in outcomes)} passed, {sum(o.failed for o in outcomes)} failed, "
                 f"{sum(o.skipped for o in outcomes)} skipped")
    return "\n".join(lines)


def record(outcomes: list[Outcome], wall: int, load: float, argv: list[str], selection: str) -> dict[str, object]:
    """The run as a result file: each tier's time and counts, and what else the machine was doing."""
    git = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return {
        "benchmark": "test_tiers", "date": time.strftime("%Y-%m-%d"),
        "code": git.stdout.strip() + ("+dirty" if dirty else ""),
        "machine": f"{platform.machine()} CPU, {os.cpu_count()} cores",
        "command": "tests/support/run_tiers.py " + " ".join(argv),
        "selection": selection,
        # What else ran: SPARKBATCH_TEST_LOAD names it (say "one core kept busy"); the load average at the start.
        "load": os.environ.get("SPARKBATCH_TEST_LOAD", "none"), "load_average_at_start": round(load, 2),
        "overlap": os.environ.get("SPARKBATCH_TEST_OVERLAP", "1") != "0",
        "workers": int(os.environ.get("SPARKBATCH_TEST_WORKERS", "2")),
        "tiers": {o.tier: {"seconds": round(o.seconds, 1), "passed": o.passed, "failed": o.failed,
                           "skipped": o.skipped, "status": o.status} for o in outcomes},
        "wall_s": wall, "passed": sum(o.passed for o in outcomes), "failed": sum(o.failed for o in outcomes),
        "skipped": sum(o.skipped for o in outcomes),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1:]
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("tiers", nargs="*", help=f"which of {', '.join(ORDER)} (default: all)")
    parser.add_argument("--record", metavar="PATH", help="also write the run's figures as one JSON object (a "
                        "benchmarks/results/ file: docs/testing.md's table is rendered from those)")
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument("--long", dest="selection", action="store_const", const="long",
                        help="only the tests marked long (make soak); default: the gate, every test not marked long")
    chosen.add_argument("--all", dest="selection", action="store_const", const="all",
                        help="the gate and the long tests")
    parser.set_defaults(selection="gate")
    args = parser.parse_args(argv)
    unknown = [t for t in args.tiers if t not in ORDER]
    if unknown:
        parser.error(f"no tier {', '.join(unknown)}: the tiers are {', '.join(ORDER)} (folders under tests/)")
    args.tiers = args.tiers or list(ORDER)
    reports = REPO / ".pytest_cache" / "tiers"
    reports.mkdir(parents=True, exist_ok=True)
    started, load = time.monotonic(), os.getloadavg()[0]
    extra = SELECTIONS[args.selection] + extra
    outcomes = [o for phase in phases([t for t in ORDER if t in args.tiers]) for o in run_phase(phase, extra, reports)]
    wall = round(time.monotonic() - started)
    print(table(outcomes, wall), flush=True)
    if args.record:
        Path(args.record).write_text(json.dumps(record(outcomes, wall, load, argv, args.selection)) + "\n")
    bad = [o.status for o in outcomes if o.status not in (0, 5)]
    return max(bad) if bad else 0


if __name__ == "__main__":
    sys.exit(main())
