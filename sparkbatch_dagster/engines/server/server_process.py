"""``vllm serve`` as a child process: a free loopback port, a health wait with a timeout, its
log in a file, stopped on close and by the kernel when this process dies."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...errors import EngineError
from .. import settings
from ..config import EngineSettings
from ..platform import vllm_cli
from ..platform.processes import spawn_owned, stop_group

#: ``vllm serve`` switches that have no ``--no-`` form (argparse ``store_true``, off unless given):
#: False is their default, so it is left out rather than sent as a flag vLLM refuses.
SWITCHES = frozenset({"disable_log_stats", "aggregate_engine_logging", "headless", "grpc",
                      "data_parallel_multi_port_external_lb"})


def serve_args(kwargs: Mapping[str, Any]) -> list[str]:
    """``vllm serve`` flags for the same settings ``vllm.LLM`` gets in offline mode.

    >>> serve_args({"enable_prefix_caching": False, "disable_log_stats": False, "max_num_seqs": 8})
    ['--no-enable-prefix-caching', '--max-num-seqs', '8']
    """
    args: list[str] = []
    for key, value in kwargs.items():
        if value is None or (value is False and key in SWITCHES):
            continue  # vLLM's own default
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is False:
            args.append("--no-" + flag[2:])
        elif isinstance(value, dict | list):
            args += [flag, json.dumps(value)]
        else:
            args += [flag, str(value)]
    return args


#: The most HTTP frontends (``--api-server-count``) a server started here gets by default.
MAX_FRONTENDS = 4


def batch_server_defaults(kwargs: Mapping[str, Any], *, cpu: bool, cores: int, engines: int = 1,
                          nodes: int = 1) -> dict[str, Any]:
    """``kwargs`` with what a ``vllm serve`` started for a batch job needs and they leave unset.

    - No access log: uvicorn's line per request is 40,000 lines for a 40,000-row job, written by
      the frontend's one event loop while it should be taking in requests.
    - No stats, as offline ``vllm.LLM`` runs (its default; ``vllm serve``'s is on): with them each
      frontend times every token of every request for ``/metrics`` and its log. A real frontend
      on the 2-core CPU spent 0.65 ms a row without them against 0.88 with, at 32 output tokens
      (``benchmarks/server/server_stats.py``).
    - On a GPU, one HTTP frontend per 4 of the machine's cores, up to :data:`MAX_FRONTENDS` (and
      at least one per engine, vLLM's own default with data parallel). The client opens
      thousands of requests at once; one frontend parses, validates and forwards them in turn,
      and the batch fills only when it is through (``docs/server-mode.md``). On the CPU the
      cores run the model, so one frontend; an engine over several nodes keeps vLLM's own
      default (several frontends before it were not tried).

    >>> batch_server_defaults({}, cpu=False, cores=16)
    {'disable_uvicorn_access_log': True, 'disable_log_stats': True, 'api_server_count': 4}
    """
    out = {"disable_uvicorn_access_log": True, "disable_log_stats": True, **kwargs}
    if not cpu and nodes == 1 and "api_server_count" not in out:
        out["api_server_count"] = max(engines, min(MAX_FRONTENDS, cores // 4))
    return out


def started_args(cfg: EngineSettings, engines: int = 1) -> list[str]:
    """The flags of the `vllm serve` started for ``cfg``: its ``llm_kwargs``, ``engines`` as its
    --data-parallel-size, and :func:`batch_server_defaults` for this machine."""
    kwargs = {**cfg.llm_kwargs, "data_parallel_size": engines} if engines > 1 else cfg.llm_kwargs
    return serve_args(batch_server_defaults(kwargs, cpu=settings.on_cpu(), cores=settings.usable_cores(),
                                            engines=engines, nodes=settings.nodes(kwargs)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: Seconds an idle HTTP connection stays open on a server started here (vLLM's default: 5). The
#: client keeps its connections between runs of this process (``KEEP_ALIVE_S`` less a margin, so
#: it is the client that closes them): with 5 s, each run after a pause of more than 5 s opens
#: every connection again, all at once.
KEEP_ALIVE_S = 900


class ServerProcess:
    """``vllm serve`` of ``cfg`` (its model resolved, its ``llm_kwargs`` as flags, with
    :func:`batch_server_defaults`) on 127.0.0.1 as ``served_name``, owned by this process and never
    left running; ``engines``: its data-parallel engines. The frontend listens with room for every
    connection the client opens at once (``cfg.in_flight``)."""

    def __init__(self, cfg: EngineSettings, served_name: str, engines: int = 1) -> None:
        args, connections = started_args(cfg, engines), cfg.in_flight(engines)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(tempfile.gettempdir()) / f"sparkbatch-vllm-serve-{self.port}.log"
        # vLLM's `vllm serve` through vllm_cli (which runs it on CPU installs too), not the
        # deprecated api_server module: that one starts a single frontend whatever
        # --api-server-count says.
        # A batch job's server: vLLM's offline batch defaults, not its interactive ones (vllm_cli).
        cmd = vllm_cli.command("serve", cfg.model_name(), "--host", "127.0.0.1", "--port", str(self.port),
                               "--served-model-name", served_name, "--enable-prompt-tokens-details", *args,
                               offline_batch_defaults=True, listen_backlog=max(connections, 2048))
        env = {"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": str(KEEP_ALIVE_S), **os.environ}  # a value set here wins
        started = time.perf_counter()
        with open(self.log_path, "ab") as log:
            self.proc = spawn_owned(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            self._wait_healthy(cfg.server_start_timeout_s)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.perf_counter() - started

    def _wait_healthy(self, timeout_s: float) -> None:
        import urllib.request

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EngineError(f"vllm serve exited with code {self.proc.returncode} while starting: "
                                  f"{self.log_tail()} (full log: {self.log_path})")
            with contextlib.suppress(OSError), urllib.request.urlopen(self.url + "/health", timeout=2) as r:  # noqa: S310
                if r.status == 200:
                    return
            time.sleep(0.5)
        raise EngineError(f"vllm serve was not healthy after {timeout_s:.0f}s (server_start_timeout_s); "
                          f"log: {self.log_path}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 5) -> str:
        try:
            return " | ".join(self.log_path.read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, grace_s: float = 30.0) -> None:
        """Stop the whole process group: the leader and every child it started (engine cores,
        API servers), also when the leader already exited alone (OOM-killed) and left them
        holding the GPU's memory."""
        stop_group(self.proc, grace_s)
