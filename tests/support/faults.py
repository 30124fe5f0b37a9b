"""A fault-injecting HTTP reverse proxy for the tests' S3 endpoint: 500/503 answers, slow answers
and dropped connections, set and cleared while the test runs.

It forwards every request's method, path, end-to-end headers and body unchanged, the client's
``Host`` header included (SigV4 signs it, and moto checks the signature against the Host it
receives), so a signed request through the proxy is as valid as one sent straight to moto. Only
hop-by-hop headers, none of them signed, are redone: an HTTP-chunked body goes up with a
Content-Length, and ``Expect: 100-continue`` is answered by the proxy itself.

    with FaultProxy(server.endpoint_url) as proxy:
        proxy.set(error_rate=0.5, methods={"PUT"}, seed=1)
        server.fs(endpoint_url=proxy.url).pipe_file(f"{bucket}/a", b"x")  # botocore retries
        print(proxy.counts["errors"], proxy.log)  # what was injected, request by request
"""

from __future__ import annotations

import contextlib
import http.client
import random
import socket
import threading
import time
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

#: Real S3's error codes and messages for the statuses a test injects; botocore retries both.
_S3_ERRORS = {
    500: ("InternalError", "We encountered an internal error. Please try again."),
    503: ("SlowDown", "Please reduce your request rate."),
}
#: Hop-by-hop headers: about one connection, not the request (none of them is signed by SigV4).
_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "expect",
        "proxy-connection"}
_COUNTS = ("requests", "forwarded", "errors", "drops", "drops_after_upstream", "delays", "slow", "held")


@dataclass(frozen=True)
class Faults:
    """What the proxy does to a matching request; each rate is a probability per request."""

    error_rate: float = 0.0
    codes: tuple[int, ...] = (500, 503)
    delay_rate: float = 0.0
    delay_s: float = 0.0
    drop_rate: float = 0.0
    drop_after_upstream_rate: float = 0.0
    methods: frozenset[str] | None = None
    path_contains: str | None = None
    max_faults: int | None = None
    #: A slow store: a PUT whose path holds ``slow_path`` (any PUT when None) waits ``slow_s``
    #: first, with probability ``slow_rate``, at most ``max_slow`` times (not counted as faults).
    slow_rate: float = 0.0
    slow_s: float = 0.0
    slow_path: str | None = None
    max_slow: int | None = None

    def matches(self, method: str, path: str) -> bool:
        return (self.methods is None or method in self.methods) and (
            self.path_contains is None or self.path_contains in path)


def s3_error(status: int, resource: str) -> bytes:
    """The XML body S3 sends with ``status`` (InternalError, SlowDown; others named after it)."""
    code, message = _S3_ERRORS.get(status, (http.client.responses.get(status, "Error").replace(" ", ""),
                                            "Injected fault."))
    rid = uuid.uuid4().hex[:16].upper()
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
            f"<Resource>{resource}</Resource><RequestId>{rid}</RequestId><HostId>{rid}</HostId></Error>").encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as botocore's connection pool expects
    server: _Server
    timeout = 120  # an idle keep-alive connection ends its thread eventually

    def log_message(self, format: str, *args: object) -> None:
        pass  # one line a request would drown the test output

    def _body(self) -> bytes | None:
        """The request's body; None when the client went away before sending all of it (a real
        store refuses such a request: forwarding it would store a torn object, which moto keeps)."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks: list[bytes] = []
            while True:
                line = self.rfile.readline()
                if not line.strip():
                    return None
                size = int(line.split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers: none that S3 needs at the HTTP layer
                    return b"".join(chunks)
                chunk = self.rfile.read(size)
                if len(chunk) < size:
                    return None
                chunks.append(chunk)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        return body if len(body) == length else None

    def _proxy(self) -> None:
        proxy = self.server.proxy
        body = self._body()  # read first: the connection stays in step whatever we answer
        if body is None:  # the client gave up mid-body: nothing reaches the store, the connection ends
            self.close_connection = True
            return
        proxy._wait_if_held(self.command, self.path)
        plan = proxy._decide(self.command, self.path)
        if "delay" in plan:
            time.sleep(plan["delay"])
        if "drop" in plan:
            return self._drop(b"")
        if "error" in plan:
            return self._error(int(plan["error"]))
        status, headers, data = proxy._forward(self.command, self.path, self.headers.items(), body)
        head = self._head(status, headers, data)
        if "drop_after_upstream" in plan:
            return self._drop(head[: len(head) // 2])
        self.wfile.write(head + data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = do_OPTIONS = _proxy

    def _head(self, status: int, headers: list[tuple[str, str]], data: bytes) -> bytes:
        lines = [f"HTTP/1.1 {status} {http.client.responses.get(status, '')}"]
        for name, value in headers:
            # HEAD keeps upstream's Content-Length (the object's size); a body is sent whole.
            if name.lower() not in _HOP and (self.command == "HEAD" or name.lower() != "content-length"):
                lines.append(f"{name}: {value}")
        if self.command != "HEAD":
            lines.append(f"Content-Length: {len(data)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def _error(self, status: int) -> None:
        data = s3_error(status, self.path.split("?")[0])
        self.send_response_only(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _drop(self, partial: bytes) -> None:
        """Send ``partial`` (maybe nothing), then close: the client gets no usable answer."""
        self.close_connection = True
        try:
            self.wfile.write(partial)
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    proxy: FaultProxy

    # A connection is tracked from its accept (in the serving thread) to the end of its handler
    # thread, so once serving stops, wait_closed() knows of every request still to end.
    def process_request(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        self.proxy._track(request, add=True)
        super().process_request(request, client_address)

    def shutdown_request(self, request: socket.socket) -> None:  # type: ignore[override]
        self.proxy._track(request, add=False)
        super().shutdown_request(request)


class FaultProxy:
    """A reverse proxy on a free 127.0.0.1 port in front of ``upstream_url``, faults set by ``set``.

    ``counts``: requests seen, forwarded upstream, and each kind of fault injected. Faults are
    decided per request (thread-safe, reproducible with ``seed`` for one client thread).
    """

    def __init__(self, upstream_url: str) -> None:
        parts = urlsplit(upstream_url)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self._lock = threading.Lock()
        self._faults = Faults()
        self._rng = random.Random()
        self._counts = dict.fromkeys(_COUNTS, 0)
        self._faulted = 0  # faulty requests since the last set()
        self._slowed = 0  # slow PUTs since the last set()
        self._hold: Faults | None = None  # the requests held until release()
        self._released = threading.Event()
        self._log: list[tuple[str, str, str]] = []
        self._conns: set[socket.socket] = set()
        self._closed = threading.Condition(self._lock)  # notified as each connection ends
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.proxy = self
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True,
                                        name="fault-proxy")
        self._thread.start()

    def set(self, error_rate: float = 0.0, codes: Collection[int] = (500, 503), delay_rate: float = 0.0,
            delay_s: float = 0.0, drop_rate: float = 0.0, drop_after_upstream_rate: float = 0.0,
            methods: Collection[str] | None = None, path_contains: str | None = None,
            max_faults: int | None = None, seed: int | None = None, slow_rate: float = 0.0, slow_s: float = 0.0,
            slow_path: str | None = None, max_slow: int | None = None) -> None:
        """Replace the faults: each matching request is dropped before forwarding (``drop_rate``),
        answered with an S3 error from ``codes`` (``error_rate``), delayed by ``delay_s`` first
        (``delay_rate``), or forwarded and then dropped before its answer (``drop_after_upstream_rate``).

        ``methods`` (e.g. ``{"PUT"}``) and ``path_contains`` restrict faults to matching requests;
        after ``max_faults`` faulty requests (delays not counted) every request goes through, which
        makes "exactly the first PUT fails" a test can state. ``slow_*``: a slow store (:class:`Faults`).
        """
        faults = Faults(error_rate, tuple(codes), delay_rate, delay_s, drop_rate, drop_after_upstream_rate,
                        frozenset(m.upper() for m in methods) if methods is not None else None, path_contains,
                        max_faults, slow_rate, slow_s, slow_path, max_slow)
        with self._lock:
            self._faults = faults
            self._faulted = self._slowed = 0
            if seed is not None:
                self._rng.seed(seed)

    def clear(self) -> None:
        """No more faults: every request is forwarded and answered."""
        self.set()

    def hold(self, methods: Collection[str] = ("PUT",), path_contains: str | None = None) -> None:
        """Hold every matching request (its body read, nothing forwarded) until :meth:`release`: a
        store as slow as a test needs it to be, with no clock in the test. ``counts["held"]``
        says how many were held."""
        with self._lock:
            self._hold = Faults(methods=frozenset(m.upper() for m in methods), path_contains=path_contains)
            self._released.clear()

    def release(self) -> None:
        """Let the held requests through (forwarded now, in any order), and hold no more."""
        with self._lock:
            self._hold = None
            self._released.set()

    def _wait_if_held(self, method: str, path: str) -> None:
        with self._lock:
            held = self._hold is not None and self._hold.matches(method, path)
            self._counts["held"] += held
        if held:
            self._released.wait()

    @property
    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    @property
    def log(self) -> list[tuple[str, str, str]]:
        """(method, path, fate) of every request so far; fate: forward, error, drop or drop_after_upstream."""
        with self._lock:
            return list(self._log)

    def _decide(self, method: str, path: str) -> dict[str, float]:
        """The faults for one request (drawn under the lock, so a seed gives one sequence)."""
        with self._lock:
            self._counts["requests"] += 1
            plan = self._draw(method, path)
            fate = next((k for k in ("drop", "error", "drop_after_upstream") if k in plan), "forward")
            self._log.append((method, path, fate))
            return plan

    def _draw(self, method: str, path: str) -> dict[str, float]:
        """The faults for one request; called under the lock."""
        f, rng = self._faults, self._rng
        plan: dict[str, float] = {}
        if not f.matches(method, path) or (f.max_faults is not None and self._faulted >= f.max_faults):
            return plan
        if f.delay_rate and rng.random() < f.delay_rate:
            plan["delay"] = f.delay_s
            self._counts["delays"] += 1
        if f.drop_rate and rng.random() < f.drop_rate:
            plan["drop"] = 1.0
            self._counts["drops"] += 1
        elif f.error_rate and rng.random() < f.error_rate:
            plan["error"] = float(rng.choice(f.codes))
            self._counts["errors"] += 1
        elif f.drop_after_upstream_rate and rng.random() < f.drop_after_upstream_rate:
            plan["drop_after_upstream"] = 1.0
            self._counts["drops_after_upstream"] += 1
        self._faulted += bool(plan.keys() - {"delay"})
        if (f.slow_rate and method == "PUT" and (f.slow_path is None or f.slow_path in path)
                and (f.max_slow is None or self._slowed < f.max_slow) and rng.random() < f.slow_rate):
            plan["delay"] = max(plan.get("delay", 0.0), f.slow_s)
            self._slowed += 1
            self._counts["slow"] += 1
        return plan

    def _forward(self, method: str, path: str, headers: list[tuple[str, str]],
                 body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        # One upstream connection a request: simple, and the upstream's keep-alive is no concern.
        conn = http.client.HTTPConnection(*self.upstream, timeout=120)
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for name, value in headers:  # Host included, unchanged
                if name.lower() not in _HOP and name.lower() != "content-length":
                    conn.putheader(name, value)
            if body or method in ("PUT", "POST"):
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body or None)
            resp = conn.getresponse()
            data = resp.read()
            with self._lock:
                self._counts["forwarded"] += 1
            return resp.status, resp.getheaders(), data
        finally:
            conn.close()

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            (self._conns.add if add else self._conns.discard)(conn)
            self._closed.notify_all()

    def wait_closed(self, timeout: float = 180.0) -> None:
        """After :meth:`stop`: return once every connection's handler has ended, so a request the
        proxy held (``delay_s``) has been forwarded or dropped by then, never later. A barrier
        for a test that must look at the store only after it; ``timeout`` only bounds a hang."""
        deadline = time.monotonic() + timeout
        with self._closed:
            while self._conns:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"fault proxy: {len(self._conns)} connections still open after {timeout:.0f} s")
                self._closed.wait(left)

    def stop(self) -> None:
        """Stop serving and close every client connection still open (held requests go through first)."""
        self.release()
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            with contextlib.suppress(OSError):  # the client closed it already
                c.shutdown(socket.SHUT_RDWR)
        self._thread.join(5)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
