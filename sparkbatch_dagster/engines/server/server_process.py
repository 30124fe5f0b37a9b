"""``vllm serve`` as a child process: a free loopback port, a health wait with a timeout, its
log in a file, stopped on close and by the kernel when this process dies."""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import json
import os
import signal
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


def die_with_parent(death_signal: int = signal.SIGTERM) -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6")
        # An ignored signal stays ignored across exec: a parent that ignores SIGTERM (a Dagster
        # worker, a test runner) would hand that on, and the death signal would do nothing.
        libc.signal(signal.SIGTERM, 0)  # SIG_DFL
        libc.prctl(1, death_signal)  # PR_SET_PDEATHSIG


#: The one thread that forks owned children. The kernel's "parent" in PR_SET_PDEATHSIG is the
#: forking *thread*: a child forked on a short-lived thread (a run's engine starts on its own,
#: ``LazyEngine``) would get SIGTERM the moment that thread ends. This one lives as long as the process.
_SPAWNER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="sparkbatch-spawner")


def spawn_owned(cmd: list[str], death_signal: int = signal.SIGTERM, **popen: Any) -> subprocess.Popen[Any]:
    """``cmd`` in its own process group, sent ``death_signal`` by the kernel when this process
    dies (not when the calling thread ends), whichever thread asks. SIGKILL for a child that
    must not take its parent's death for a stop it cleans up after (a batch's ``run-batch``:
    its engine's watchdog then ends the rest). ``popen``: more ``subprocess.Popen`` arguments."""

    def spawn() -> subprocess.Popen[Any]:
        return subprocess.Popen(cmd, start_new_session=True,  # noqa: PLW1509
                                preexec_fn=lambda: die_with_parent(death_signal), **popen)

    return _SPAWNER.submit(spawn).result()


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


def stop_group(proc: subprocess.Popen[Any], grace_s: float = 30.0) -> None:
    """SIGTERM the process group that ``proc`` leads (``spawn_owned``), then SIGKILL what is left
    after ``grace_s``; returns once no process of the group is left (or 60 s after the SIGKILL:
    a killed engine on a loaded machine can take seconds to give its memory back), so a caller
    that exits next leaves none behind."""
    group = proc.pid  # start_new_session: the leader's pid is the group's id
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 60.0)):
        _signal_group(group, sig)
        deadline = time.monotonic() + wait_s
        while _group_alive(group) and time.monotonic() < deadline:
            proc.poll()  # reaps the leader: a zombie would keep the group alive
            time.sleep(0.1)
        if not _group_alive(group):
            break
    proc.poll()


def _signal_group(group: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, sig)


def _group_alive(group: int) -> bool:
    """Whether any process of the group is left (a dead leader not yet reaped counts, as a zombie)."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
