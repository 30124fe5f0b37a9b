"""One engine over several machines, on vLLM's own multi-node mode (no scheduler of ours).

The first node runs the Dagster run as usual, its resource naming the other nodes' count and its
own address::

    VLLMResource(model="/models/llama-70b", tensor_parallel_size=2,
                 engine_kwargs={"nnodes": 2, "master_addr": "10.0.0.1"})

and every other node runs ``sparkbatch worker-node --node-rank K`` (K = 1 .. nnodes-1) with the
same definitions file: a headless vLLM (``vllm serve ... --node-rank K --headless``) whose
workers join the first node's engine when it starts. A headless vLLM serves one engine: when the
first node's engine stops (its run ended), this node's workers would wait forever, so
``worker-node`` starts a fresh one for the next run. The recipe: ``docs/multi-node.md``.
"""

from __future__ import annotations

import contextlib
import shlex
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ...errors import ConfigError
from ..config import EngineSettings
from ..settings import nodes

#: vLLM's default port for the first node's torch.distributed store (``master_port``).
DEFAULT_MASTER_PORT = 29501


def check(kwargs: Mapping[str, Any], tensor_parallel_size: int, data_parallel_size: int | None = None) -> None:
    """Stop before any model loads when a multi-node setting cannot work, naming the fix."""
    n = nodes(kwargs)
    if n == 1:
        return
    if not kwargs.get("master_addr"):
        raise ConfigError(f"engine_kwargs has nnodes={n} but no master_addr: set engine_kwargs['master_addr'] to "
                          "the first node's address (the one that runs the Dagster run), reachable from the others")
    gpus = tensor_parallel_size * int(kwargs.get("pipeline_parallel_size") or 1)
    if gpus % n:
        raise ConfigError(f"engine_kwargs has nnodes={n}, but tensor_parallel_size x pipeline_parallel_size = {gpus} "
                          f"does not split evenly over {n} nodes: vLLM needs the same number of GPUs on each; "
                          f"set tensor_parallel_size to a multiple of {n}")
    if (data_parallel_size or 1) > 1:
        raise ConfigError(f"data_parallel_size={data_parallel_size} with nnodes={n}: an engine over several machines "
                          "runs alone (each worker node serves one engine); leave data_parallel_size unset, or run one "
                          "engine per machine without nnodes")
    if int(kwargs.get("node_rank") or 0) != 0:
        raise ConfigError("engine_kwargs sets node_rank: the resource runs on the first node (rank 0); the other "
                          "nodes run `sparkbatch worker-node --node-rank K` instead")


def worker_node(cfg: EngineSettings, node_rank: int, *, once: bool = False, print_only: bool = False,
                log: Callable[[str], None] = print) -> dict[str, Any]:
    """``sparkbatch worker-node``: serve this machine's share of the multi-node engine of ``cfg``
    (``VLLMResource.engine_settings()``), engine after engine; ``print_only`` only returns the command."""
    kwargs = cfg.llm_kwargs
    check(kwargs, cfg.tensor_parallel_size, cfg.data_parallel_size)
    cmd = worker_command(cfg.model_name(), kwargs, node_rank)
    log(shlex.join(cmd))
    if print_only:
        return {"command": cmd}
    master = (str(kwargs["master_addr"]), int(kwargs.get("master_port") or DEFAULT_MASTER_PORT))
    exit_on_signals()
    return {"command": cmd, "returncode": serve_worker(cmd, master, once=once, log=log)}


def worker_command(model: str, kwargs: Mapping[str, Any], node_rank: int) -> list[str]:
    """The headless ``vllm serve`` that joins node ``node_rank`` to the first node's engine,
    with the same model and engine arguments."""
    from ..platform import vllm_cli
    from .server_process import serve_args

    n = nodes(kwargs)
    if n == 1:
        raise ConfigError("this job's resource runs on one machine (no nnodes in engine_kwargs): no worker node is "
                          "needed; for one engine over N machines set engine_kwargs={'nnodes': N, "
                          "'master_addr': '<first node>'} (docs/multi-node.md)")
    if not 1 <= node_rank < n:
        raise ConfigError(f"--node-rank {node_rank} is not a worker of nnodes={n}: use 1 to {n - 1} "
                          "(rank 0 is the node that runs the Dagster run)")
    rest = {k: v for k, v in kwargs.items() if k not in ("node_rank", "headless")}
    # vLLM's own CLI entry point, on GPU and CPU installs alike (engines/platform/vllm_cli.py says why).
    return vllm_cli.command("serve", model, *serve_args(rest), "--node-rank", str(node_rank), "--headless")


def _listening(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1.0):
        return True
    return False


def serve_worker(cmd: list[str], master: tuple[str, int], once: bool = False,
                 log: Callable[[str], None] = print, poll_s: float = 1.0) -> int:
    """Run the headless worker ``cmd`` for one engine of the first node after another: each is
    stopped (with its worker processes) once the first node's store at ``master`` has been up
    and is gone again, and a fresh one started. Returns when ``cmd`` ends by itself before any
    engine came up (a bad setting, a missing vLLM: its exit code), or after one engine (``once``)."""
    from ..platform.processes import spawn_owned, stop_group

    while True:
        log(f"worker node: joins the engine at {master[0]}:{master[1]} when it starts")
        child = None
        seen = ended = False
        try:
            # Its own process group, stopped with its workers; and stopped by the kernel if we die.
            with _STOP.held():
                child = spawn_owned(cmd)
            while child.poll() is None:
                up = _listening(*master)
                if up and not seen:
                    log("worker node: the first node's engine is up")
                seen = seen or up
                if seen and not up:
                    log("worker node: the first node's engine stopped")
                    ended = True
                    break
                time.sleep(poll_s)
        finally:
            # Its worker processes may outlive it (they wait on a first node that is gone): the
            # whole group goes, and is gone before the next engine starts or this process exits.
            # A SIGTERM in the middle of the stop waits for its end: the kernel stops only the
            # group's leader when this process dies, not the workers it started.
            if child is not None:
                with _STOP.held():
                    stop_group(child, grace_s=10.0)
        if once or not seen:
            return 0 if ended else int(child.returncode or 0)


class _Stop:
    """SIGTERM and SIGINT end ``worker-node`` through its cleanup (``sys.exit``), but not in the
    middle of starting or stopping a vLLM: there the exit waits for the block's end. (Blocking
    the signals would not do: Python runs handlers in the main thread whichever thread takes
    the signal, and the spawner thread does not block them.)"""

    def __init__(self) -> None:
        self.depth = 0
        self.pending = False

    def request(self, *_: object) -> None:
        if self.depth:
            self.pending = True
        else:
            sys.exit(0)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if not self.depth and self.pending:
                sys.exit(0)


_STOP = _Stop()


def exit_on_signals() -> None:
    """A plain SIGTERM (systemd, Kubernetes, kill) or Ctrl-C ends :func:`serve_worker` through
    its cleanup, vLLM's workers included (main thread only, as for any signal handler)."""
    signal.signal(signal.SIGTERM, _STOP.request)
    signal.signal(signal.SIGINT, _STOP.request)
