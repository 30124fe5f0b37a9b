"""``sparkbatch serve-batch``: the OpenAI Files and Batches endpoints on the box, so that an
unchanged ``openai`` client runs its batch here (docs/batch-files.md)::

    sparkbatch serve-batch --root /data/batches --model /models/qwen-7b          # 127.0.0.1:8400

    client = OpenAI(base_url="http://127.0.0.1:8400/v1", api_key="unused")
    f = client.files.create(file=open("requests.jsonl", "rb"), purpose="batch")
    b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    ...  # client.batches.retrieve(b.id).status == "completed"
    client.files.content(b.output_file_id).text

Served: ``POST /v1/files``, ``GET /v1/files``, ``GET /v1/files/{id}``, ``DELETE /v1/files/{id}``,
``GET /v1/files/{id}/content``, ``POST /v1/batches``, ``GET /v1/batches``, ``GET /v1/batches/{id}``,
``POST /v1/batches/{id}/cancel``; Anthropic's Message Batches (:mod:`.anthropic_batches`: ``POST`` and
``GET /v1/messages/batches``, ``GET`` and ``DELETE /v1/messages/batches/{id}``, ``POST .../{id}/cancel``,
``GET .../{id}/results``, for ``anthropic.Anthropic(base_url="http://127.0.0.1:8400")``); and the OpenAPI
document ``GET /openapi.json``. The routes are a
FastAPI app (:mod:`.app`) behind a guard (:mod:`.guard`: Host and Origin
allow-lists, the API key, the body cap), run by uvicorn. Bound to loopback unless ``--host`` says
otherwise, and then only with an API key (``--api-key`` or ``$SPARKBATCH_API_KEY``). Each batch is
a job (:mod:`.worker`).
"""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..serve.guard import Access
from ..serve.worker import Store, Worker

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
    flight are answered), taking up the batches a previous server left open."""
    import uvicorn

    from ..serve.app import make_app

    check_bind(host, access.api_key)
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
