"""Read what ``throughput.py --profile DIR`` wrote: per process and thread, how many samples were
busy and where (the innermost frames by share, and the functions on most busy stacks).

    python -m benchmarks.engine.profile_top DIR [--top 12] [--match server-r1]

py-spy's raw format is one collapsed stack per line with its sample count; at ``--rate 100``
100 samples are one second of a thread running (idle threads are not sampled), so a thread's
total over the profile's seconds is the share of a core it kept busy.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

_FRAME = re.compile(r"^(?P<fn>[^ ]+) \((?P<file>[^:)]*)(?::\d+)?\)$")


def read(path: Path) -> dict[str, collections.Counter[tuple[str, ...]]]:
    """Stacks by owner (process and thread), outermost frame first, with their sample counts."""
    by_owner: dict[str, collections.Counter[tuple[str, ...]]] = collections.defaultdict(collections.Counter)
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        owner = []
        while frames and (frames[0].startswith("process ") or frames[0].startswith("thread ")):
            owner.append(frames.pop(0)[:60])
        by_owner[" / ".join(owner) or "?"][tuple(short(f) for f in frames)] += int(count)
    return by_owner


def short(frame: str) -> str:
    m = _FRAME.match(frame)
    return f"{m['fn']} ({Path(m['file']).name})" if m else frame[:80]


def report(path: Path, top: int, rate: float) -> None:
    print(f"== {path.name}")
    for owner, stacks in sorted(read(path).items(), key=lambda kv: -sum(kv[1].values())):
        total = sum(stacks.values())
        if total < rate / 10:
            continue
        leaf: collections.Counter[str] = collections.Counter()
        inclusive: collections.Counter[str] = collections.Counter()
        for frames, n in stacks.items():
            if frames:
                leaf[frames[-1]] += n
            for f in set(frames):
                inclusive[f] += n
        print(f"  {owner}: {total / rate:.2f} busy s")
        print("    innermost: " + "; ".join(f"{f} {n / total:.0%}" for f, n in leaf.most_common(top)))
        print("    on stack:  " + "; ".join(f"{f} {n / total:.0%}" for f, n in inclusive.most_common(top)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir")
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--rate", type=float, default=100.0, help="py-spy's sampling rate (throughput.py uses 100)")
    p.add_argument("--match", default="", help="only files whose name contains this")
    args = p.parse_args()
    files = sorted(f for f in Path(args.dir).glob("*.txt") if args.match in f.name)
    if not files:
        sys.exit(f"no profiles (*.txt) in {args.dir}")
    for f in files:
        report(f, args.top, args.rate)


if __name__ == "__main__":
    main()
