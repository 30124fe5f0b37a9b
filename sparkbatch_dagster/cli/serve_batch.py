"""``sparkbatch serve-batch``: the OpenAI Files and Batches endpoints on the box, so that an
unchanged ``openai`` client runs its batch here (docs/batch-files.md)::

    sparkbatch serve-batch --root /data/batches --model /models/qwen-7b          # 127.0.0.1:8400

    client = OpenAI(base_url="http://127.0.0.1:8400/v1", api_key="unused")
    f = client.files.create(file=open("requests.jsonl", "rb"), purpose="batch")
    b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    ...  # client.batches.retrieve(b.id).status == "completed"
    client.files.content(b.output_file_id).text

Served: ``POST /v1/files``, ``GET /v1/files/{id}``, ``GET /v1/files/{id}/content``,
``POST /v1/batches``, ``GET /v1/batches``, ``GET /v1/batches/{id}``,
``POST /v1/batches/{id}/cancel``. Bound to loopback unless ``--host`` says otherwise, and then
only with an API key (``--api-key`` or ``$SPARKBATCH_API_KEY``), checked on every request.
Each batch is a job (:mod:`.batch_service`).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
import re
import signal
import sys
from email.parser import BytesParser
from email.policy import default as email_policy
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ..errors import ConfigError
from .batch_service import OPEN, Store, Worker, new_batch

#: The largest upload taken (OpenAI's own limit for a batch input file is 200 MB).
MAX_UPLOAD = 512 * 1024 * 1024


def check_bind(host: str, api_key: str | None) -> None:
    """Refuse a server other machines can reach without a key."""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback and not api_key:
        raise ConfigError(f"serve-batch --host {host} can be reached from other machines: set --api-key (or "
                          "SPARKBATCH_API_KEY) so that only your clients can run batches, or bind --host 127.0.0.1")


class Api:
    """The routes, on a :class:`Store` and its :class:`Worker`; ``api_key`` None: no check."""

    def __init__(self, store: Store, worker: Worker, api_key: str | None) -> None:
        self.store, self.worker, self.api_key = store, worker, api_key

    def handle(self, method: str, path: str, headers: Any, body: bytes) -> tuple[int, Any]:
        """(status, JSON object or raw bytes) for one request."""
        if self.api_key and not hmac.compare_digest(headers.get("Authorization", ""), f"Bearer {self.api_key}"):
            return _error(401, "invalid_api_key", "Incorrect API key provided", "invalid_request_error")
        url = urlsplit(path)
        route = url.path.rstrip("/")
        if method == "POST" and route == "/v1/files":
            return self.upload(headers.get("Content-Type", ""), body)
        if method == "GET" and (m := re.fullmatch(r"/v1/files/([^/]+)(/content)?", route)):
            meta = self.store.file(m.group(1))
            if meta is None:
                return _error(404, "not_found", f"No such File object: {m.group(1)}")
            return (200, self.store.file_path(meta["id"]).read_bytes()) if m.group(2) else (200, meta)
        if method == "POST" and route == "/v1/batches":
            try:
                batch = new_batch(self.store, json.loads(body or b"{}"))
            except (ConfigError, ValueError) as exc:
                return _error(400, "invalid_request", str(exc))
            self.worker.submit(batch)
            return 200, batch
        if method == "GET" and route == "/v1/batches":
            return 200, self.listing(parse_qs(url.query))
        if m := re.fullmatch(r"/v1/batches/([^/]+)(/cancel)?", route):
            if self.store.batch(m.group(1)) is None:
                return _error(404, "not_found", f"No such Batch object: {m.group(1)}")
            if method == "POST" and m.group(2):
                return 200, self.worker.cancel(m.group(1))
            if method == "GET" and not m.group(2):
                return 200, self.worker.progress(m.group(1))
        return _error(404, "not_found", f"{method} {url.path} is not served here (the Files and Batches endpoints are)")

    def upload(self, content_type: str, body: bytes) -> tuple[int, Any]:
        """``files.create``: a multipart form with ``purpose`` and ``file``."""
        if not content_type.startswith("multipart/form-data"):
            return _error(400, "invalid_request", "files.create sends multipart/form-data with 'file' and 'purpose'")
        form = BytesParser(policy=email_policy).parsebytes(
            b"Content-Type: " + content_type.encode() + b"\r\nMIME-Version: 1.0\r\n\r\n" + body)
        fields: dict[str, Any] = {}
        for part in form.iter_parts():
            name = part.get_param("name", header="content-disposition")
            fields[str(name)] = (part.get_filename(), part.get_payload(decode=True) or b"")
        if "file" not in fields:
            return _error(400, "invalid_request", "files.create needs a 'file' part")
        purpose = fields.get("purpose", (None, b"batch"))[1].decode()
        if purpose != "batch":
            return _error(400, "invalid_request", f"purpose {purpose!r} is not served here: use 'batch'")
        filename, data = fields["file"]
        return 200, self.store.add_file(data, filename or "upload.jsonl", purpose)

    def listing(self, query: dict[str, list[str]]) -> dict[str, Any]:
        """``batches.list``: newest first, ``limit`` (1 to 100, default 20) after the id ``after``."""
        batches = self.store.all_batches()
        after = query.get("after", [None])[0]
        if after is not None:
            ids = [b["id"] for b in batches]
            batches = batches[ids.index(after) + 1:] if after in ids else []
        limit = max(1, min(100, int(query.get("limit", ["20"])[0] or 20)))
        page = [self.worker.progress(b["id"]) if b["status"] in OPEN else b for b in batches[:limit]]
        return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None, "has_more": len(batches) > limit}


def _error(status: int, code: str, message: str, kind: str = "invalid_request_error") -> tuple[int, Any]:
    return status, {"error": {"message": message, "type": kind, "param": None, "code": code}}


def make_server(api: Api, host: str, port: int) -> ThreadingHTTPServer:
    """An HTTP server of ``api`` on ``host:port`` (port 0: a free one; ``server_address`` says which)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            size = int(self.headers.get("Content-Length") or 0)
            if size > MAX_UPLOAD:
                status, payload = _error(413, "file_too_large", f"{size} bytes; the most is {MAX_UPLOAD}")
                self.close_connection = True
            else:
                status, payload = api.handle(self.command, self.path, self.headers, self.rfile.read(size))
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/octet-stream" if isinstance(payload, bytes)
                             else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _serve

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            pass  # the client sees every answer; a poll loop would flood the terminal

    return ThreadingHTTPServer((host, port), Handler)


def serve(root: Path, host: str, port: int, api_key: str | None, worker: Worker, store: Store) -> None:
    """Serve until interrupted, taking up the batches a previous server left open."""
    check_bind(host, api_key)
    server = make_server(Api(store, worker, api_key), host, port)
    worker.start()
    bound = f"{host}:{server.server_address[1]}"
    print(f"sparkbatch: serving the Batch API at http://{bound}/v1 (batches in {root}, pid "
          f"{os.getpid()})", file=sys.stderr, flush=True)
    # Stop on SIGTERM (systemd, docker stop) and on SIGINT even where it was inherited ignored (a
    # server started in the background of a script): the batches' children go with this process.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _interrupt)
    try:
        server.serve_forever()
    finally:
        server.server_close()


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)
