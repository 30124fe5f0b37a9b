"""``sparkbatch serve-batch``: the OpenAI Files and Batches endpoints on the box, so that an
unchanged ``openai`` client runs its batch here (docs/batch-files.md)::

    sparkbatch serve-batch --root /data/batches --model /models/qwen-7b          # 127.0.0.1:8400

    client = OpenAI(base_url="http://127.0.0.1:8400/v1", api_key="unused")
    f = client.files.create(file=open("requests.jsonl", "rb"), purpose="batch")
    b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    ...  # client.batches.retrieve(b.id).status == "completed"
    client.files.content(b.output_file_id).text

Served: OpenAI's Files and Batches, Anthropic's Message Batches (``anthropic.Anthropic(base_url=
"http://127.0.0.1:8400")``) and ``GET /healthz``; the routes are listed in the OpenAPI document
``GET /openapi.json``. The routes are a FastAPI app (``serve.app``) behind a guard
(``serve.guard``: Host and Origin allow-lists, the API key, the body cap); this module takes the
arguments and runs the app with uvicorn. Bound to loopback unless ``--host`` says otherwise, and
then only with an API key (``--api-key`` or ``$SPARKBATCH_API_KEY``). Each batch is a job
(``serve.worker``).
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from ..definitions.resource import VLLMResource
from ..errors import ConfigError
from ..serve.guard import Access, access
from ..serve.store import Store
from ..serve.worker import Worker
from ..spec import SamplingSpec

#: Connections the kernel holds until the server accepts them (capped by net.core.somaxconn):
#: many clients connecting at once all get in, none reset.
BACKLOG = 2048
#: Seconds a stop waits for requests in flight (an upload) before it closes their connections.
GRACE_S = 10
#: uvicorn's warnings and errors (a malformed request, a route's crash) as this command's stderr
#: lines; no access log (a client polls every second).
LOG_CONFIG: dict[str, Any] = {
    "version": 1, "disable_existing_loggers": False,
    "formatters": {"line": {"format": "sparkbatch: serve-batch: %(message)s"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "line", "stream": "ext://sys.stderr"}},
    "loggers": {"uvicorn.error": {"handlers": ["stderr"], "level": "WARNING", "propagate": False}}}


def serve_batch(args: argparse.Namespace, resource: VLLMResource, sampling: SamplingSpec) -> dict[str, Any]:
    """``serve-batch``: serve until interrupted; each batch runs in a ``run-batch`` child with
    this command's engine and options (``sampling``: what a line that sets none gets)."""
    check_bind(args.host, args.api_key)
    if resource.model is not None:  # a model that cannot load stops here, not every batch later
        try:
            resource.model_name()
        except ConfigError as exc:
            raise ConfigError(f"serve-batch {'--model' if args.model else '--engine-file'}: {exc}") from None
    door = access(args.host, args.api_key, args.allow_host, args.allow_origin, args.max_upload_mb * 1024 * 1024)
    root = Path(args.root).resolve()
    child = ["--engine-file", str(Path(args.engine_file).resolve())] if args.engine_file else \
        (["--model", args.model] if args.model else [])
    store = Store(root)
    worker = Worker(store, child, resource, sampling, args.shard_size, args.hourly_rate)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: open batches resume at the next start
        serve(root, args.host, args.port, door, worker, store)
    return {"stopped": True, "root": str(root), "open": [b.id for b in store.all_batches() if b.is_open]}


def check_bind(host: str, api_key: str | None) -> None:
    """Refuse a server other machines can reach without a key."""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback and not api_key:
        raise ConfigError(f"serve-batch --host {host} can be reached from other machines: set --api-key (or "
                          "SPARKBATCH_API_KEY) so that only your clients can run batches, or bind --host 127.0.0.1")


def listen(host: str, port: int) -> socket.socket:
    """The server's listening socket on ``host:port`` (port 0: a free one), not inherited by the
    batches' children."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=BACKLOG)
    except OSError as exc:
        raise ConfigError(f"serve-batch cannot listen on {host}:{port} ({exc.strerror or exc}): choose another "
                          "--port, or a --host of this machine") from exc


def serve(root: Path, host: str, port: int, access: Access, worker: Worker, store: Store) -> None:
    """Serve until interrupted (KeyboardInterrupt on SIGINT or SIGTERM, once the requests in
    flight are answered), taking up the batches a previous server left open; the bind was
    checked by :func:`serve_batch` (:func:`check_bind`)."""
    import uvicorn

    from ..serve.app import make_app

    sock = listen(host, port)
    config = uvicorn.Config(make_app(store, worker, access), lifespan="off", backlog=BACKLOG, access_log=False,
                            log_config=LOG_CONFIG, timeout_graceful_shutdown=GRACE_S, server_header=False)
    worker.start()
    bound = f"[{host}]" if ":" in host else host
    print(f"sparkbatch: serving the Batch API at http://{bound}:{sock.getsockname()[1]}/v1 (batches in {root}, pid "
          f"{os.getpid()})", file=sys.stderr, flush=True)
    # Stop on SIGTERM (systemd, docker stop) and on SIGINT even where it was inherited ignored (a
    # server started in the background of a script): the batches' children go with this process.
    # uvicorn takes both while it serves, shuts down gracefully, then raises the signal again here.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _interrupt)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)
