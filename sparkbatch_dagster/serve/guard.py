"""Who may call ``sparkbatch serve-batch`` and how much one request may send, checked before any
route runs (:class:`Guard`, an ASGI middleware around :mod:`.app`).

A browser on the box can reach a loopback server too, so loopback alone is no protection:

- **Host** must be a name the server answers to (:attr:`Access.hosts`): a web page that rebinds
  its own name to 127.0.0.1 (DNS rebinding) still sends its own name, and gets 421.
- **Origin**, when a request carries one (browsers do on every cross-site POST), must be a
  loopback origin or one allowed by ``--allow-origin``: a page's forged form or ``fetch`` gets 403
  (CSRF), whatever its content type.
- **API key**, when set (required beyond loopback): ``Authorization: Bearer KEY`` (OpenAI's
  clients) or ``x-api-key: KEY`` (Anthropic's header), else 401.
- **Body size**: counted as it arrives, whatever ``Content-Length`` says (absent, negative,
  lying): past :attr:`Access.max_body` bytes the request gets 413 and nothing more is read.

Every refusal is OpenAI's error shape, ``{"error": {"message", "type", "param", "code"}}``, except
under ``/v1/messages`` (Anthropic's Message Batches), where it is Anthropic's, ``{"type": "error",
"error": {"type", "message"}, "request_id"}`` (:func:`refusal_for`).
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import ConfigError

#: The largest request body taken (OpenAI's own limit for a batch input file is 200 MB).
MAX_BODY = 512 * 1024 * 1024
#: The names loopback is reached by; any port.
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "[::1]"})
WILDCARDS = frozenset({"0.0.0.0", "::", ""})  # noqa: S104 - names, compared with --host
#: The routes of Anthropic's Message Batches API: their errors are Anthropic's shape.
ANTHROPIC_PATHS = "/v1/messages"
#: Anthropic's error ``type`` by HTTP status (its errors page); any other 4xx is a request error.
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
                   529: "overloaded_error"}


@dataclass(frozen=True)
class Access:
    """The server's door: ``hosts`` (Host names, any port), ``origins`` (browser origins taken
    beyond loopback ones), ``api_key`` (None: no key asked) and ``max_body`` (bytes)."""

    hosts: frozenset[str]
    origins: frozenset[str]
    api_key: str | None
    max_body: int = MAX_BODY


def access(bind: str, api_key: str | None, allow_hosts: Iterable[str] = (), allow_origins: Iterable[str] = (),
           max_body: int = MAX_BODY) -> Access:
    """The door of a server bound to ``bind``: loopback names, the bound address (every address of
    this machine when it is a wildcard), ``allow_hosts`` and ``allow_origins``; bad values stop here."""
    hosts = set(LOOPBACK_HOSTS) | {_allowed_host(h) for h in allow_hosts}
    hosts |= _machine_addresses() if bind in WILDCARDS else {host_name(bind)}
    if max_body < 1:
        raise ConfigError("serve-batch --max-upload-mb must be 1 or more: the largest request body taken, in MiB")
    return Access(frozenset(hosts), frozenset(_allowed_origin(o) for o in allow_origins), api_key or None, max_body)


def host_name(value: str) -> str:
    """The name in a Host header or an address: lower case, without port or trailing dot, an IPv6
    address in brackets (``[::1]:8400`` and ``::1`` are both ``[::1]``)."""
    v = value.strip().lower()
    if v.startswith("["):
        return v[:v.find("]") + 1] if "]" in v else v
    if v.count(":") > 1:  # a bare IPv6 address: a --host, never a Host header
        return f"[{v}]"
    return v.partition(":")[0].rstrip(".")


def origin_allowed(origin: str, allowed: frozenset[str]) -> bool:
    """Whether a browser page at ``origin`` may call: a loopback page, or one of ``allowed``."""
    if origin.strip().lower().rstrip("/") in allowed:
        return True
    url = urlsplit(origin.strip())
    return url.scheme in ("http", "https") and host_name(url.netloc) in LOOPBACK_HOSTS


def _allowed_host(value: str) -> str:
    name = host_name(value)
    if not name or any(c in value for c in "/@ \t"):
        raise ConfigError(f"serve-batch --allow-host {value!r} is not a host name: give the name clients use in "
                          "their URL, e.g. --allow-host box.example.com or --allow-host 10.0.0.5")
    return name


def _allowed_origin(value: str) -> str:
    url = urlsplit(value.strip())
    if url.scheme not in ("http", "https") or not url.netloc or url.path not in ("", "/") or url.query:
        raise ConfigError(f"serve-batch --allow-origin {value!r} is not an origin: give scheme, host and port as "
                          "the browser sends them, e.g. --allow-origin https://notebook.example.com:8443")
    return value.strip().lower().rstrip("/")


def _machine_addresses() -> set[str]:
    """This machine's IP addresses, as Host names: what clients of a ``--host 0.0.0.0`` server use."""
    import psutil

    found = set()
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            try:
                ipaddress.ip_address(a.address)  # not a MAC, not a scoped (link-local %eth0) address
            except ValueError:
                continue
            found.add(host_name(a.address))
    return found


class BodyTooLarge(HTTPException):
    """A request body past the cap: 413, and the connection closed (the rest is not read)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is over {limit} bytes, the most this server takes "
                              "(serve-batch --max-upload-mb)", headers={"Connection": "close"})


def error_response(status: int, message: str, code: str | None, param: str | None = None,
                   kind: str = "invalid_request_error", headers: Mapping[str, str] | None = None) -> JSONResponse:
    """OpenAI's error body."""
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}}, status,
                        headers=headers)


class ApiError(Exception):
    """A refusal a route answers with: status, message (what is wrong and the fix), code, param;
    in the shape of the API its path belongs to (:func:`refusal_for`)."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param


def anthropic_error(status: int, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    """Anthropic's error body: ``{"type": "error", "error": {"type", "message"}, "request_id"}``."""
    kind = ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return JSONResponse({"type": "error", "error": {"type": kind, "message": message},
                         "request_id": f"req_{secrets.token_hex(12)}"}, status, headers=headers)


def is_anthropic(path: str) -> bool:
    """Whether ``path`` is one of Anthropic's Message Batches routes (or under them)."""
    return path == ANTHROPIC_PATHS or path.startswith(ANTHROPIC_PATHS + "/")


def refusal_for(path: str, status: int, message: str, code: str | None, param: str | None = None,
                kind: str = "invalid_request_error", headers: Mapping[str, str] | None = None) -> JSONResponse:
    """The error body of the API that ``path`` belongs to: Anthropic's under ``/v1/messages``, else OpenAI's."""
    if is_anthropic(path):
        return anthropic_error(status, message, headers)
    return error_response(status, message, code, param, kind, headers)


class Guard:
    """The checks of the module's docstring, in that order, around ``app``."""

    def __init__(self, app: ASGIApp, access: Access) -> None:
        self.app, self.access = app, access
        self._key = f"Bearer {access.api_key}".encode() if access.api_key else None
        self._raw_key = access.api_key.encode() if access.api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        path = scope.get("path", "")
        refusal = self.refusal(headers, path)
        declared = headers.get("content-length", "")
        if refusal is None and declared.isascii() and declared.isdigit() and int(declared) > self.access.max_body:
            refusal = self._too_large(BodyTooLarge(self.access.max_body), path)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        started = False
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.access.max_body:
                    raise BodyTooLarge(self.access.max_body)
            return message

        async def sending(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await self.app(scope, counted, sending)
        except BodyTooLarge as exc:  # raised where no route turned it into its answer
            if started:
                raise
            await self._too_large(exc, path)(scope, receive, send)

    def refusal(self, headers: Headers, path: str = "") -> Response | None:
        """The answer to a request this server does not take, or None (in the shape of ``path``'s API)."""
        host = headers.get("host", "")
        if host_name(host) not in self.access.hosts:
            return refusal_for(path, 421, f"Host {host!r} is not a name this server answers to; start it with "
                                       f"--allow-host NAME for each name clients use", "host_not_allowed")
        origin = headers.get("origin")
        if origin is not None and not origin_allowed(origin, self.access.origins):
            return refusal_for(path, 403, f"requests from web pages at Origin {origin!r} are refused; if that page "
                                       "is yours, start the server with --allow-origin ORIGIN", "origin_not_allowed")
        if self._key is not None and not self._key_sent(headers):
            return refusal_for(path, 401, "Incorrect API key provided: send the server's key (its --api-key or "
                                          "$SPARKBATCH_API_KEY) as the client's api_key", "invalid_api_key")
        return None

    def _key_sent(self, headers: Headers) -> bool:
        """Whether the request carries the key: ``Authorization: Bearer KEY`` (OpenAI's clients, and
        Anthropic's SDK given ``api_key`` here) or ``x-api-key: KEY`` (Anthropic's documented header)."""
        assert self._key is not None and self._raw_key is not None
        bearer = headers.get("authorization", "").encode("latin-1")  # the header's bytes as they came
        raw = headers.get("x-api-key", "").encode("latin-1")
        return hmac.compare_digest(bearer, self._key) | hmac.compare_digest(raw, self._raw_key)

    @staticmethod
    def _too_large(exc: BodyTooLarge, path: str) -> Response:
        return refusal_for(path, 413, str(exc.detail), "request_too_large", headers=exc.headers)
