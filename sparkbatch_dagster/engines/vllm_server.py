"""Server mode: the same interface over an OpenAI-compatible endpoint.

Either the plugin starts ``vllm serve`` itself (:class:`~.server_process.ServerProcess`) or it
talks to a server that is already running. :class:`VLLMServerEngine` keeps the server full:
many requests in flight (well above ``max_num_seqs``, so continuous batching always has work),
retries with backoff on 429/5xx/connection resets, and structured outputs through the
request's ``structured_outputs`` field.

Failures are sorted three ways: a row's own (its prompt is too long, a sporadic 400) is an error
row; a setting's (wrong key, model, no chat template, 400 on every request) is a ConfigError
before any row of it is written; a transient one (5xx, read timeouts after every retry) is a
``retryable`` result that the runner leaves pending for the next run.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import json
import queue
import random
import re
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from ..errors import ConfigError, EngineError
from ..spec import OutputSpec, SamplingSpec
from .base import Engine, EngineRequest, EngineResult, structured_outputs
from .server_process import ServerProcess, free_port

__all__ = ["ServerProcess", "VLLMServerEngine", "check_served", "free_port", "request_body", "served_models"]

_RETRY_STATUS = {408, 429, 500, 502, 503, 504}
#: 400s held back while nothing has succeeded; this many (and none of those in flight succeeding)
#: mean the request itself is wrong, not the rows.
_HOLD = 8


def request_body(model: str, messages: list[dict[str, str]], sampling: SamplingSpec, output: OutputSpec) -> dict:
    """The chat-completions payload, structured outputs included."""
    body: dict[str, Any] = {
        "model": model, "messages": messages, "max_tokens": sampling.max_tokens,
        "temperature": sampling.temperature, "top_p": sampling.top_p, "seed": sampling.seed,
        "ignore_eos": sampling.ignore_eos,
    }
    fields = structured_outputs(output)
    if fields:
        body["structured_outputs"] = fields
    return body


def _root(url: str) -> str:
    return url.rstrip("/").removesuffix("/v1")  # ".../v1" is a common way to write the same server


def _message(text: str) -> str:
    """The error message of an OpenAI-style error body, else the body itself (shortened)."""
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        data = json.loads(text)
        err = data.get("error")
        text = str((err.get("message") if isinstance(err, dict) else err) or data.get("message") or text)
    return text[:300]


def _key_error(url: str, status: int) -> ConfigError:
    return ConfigError(f"server at {url} refused the request (HTTP {status}): the API key is missing or wrong: "
                       "set VLLMResource.api_key to the server's key, read from the environment: "
                       'api_key=EnvVar("MY_KEY") (Python) or {{ env.MY_KEY }} (YAML)')


def served_models(base_url: str, api_key: str | None, timeout_s: float = 10.0) -> list[dict]:
    """``/v1/models``' entries (``id``; from vLLM also ``root``, ``max_model_len``). Blocking: a preflight."""
    import urllib.error
    import urllib.request

    url = _root(base_url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    req = urllib.request.Request(url + "/v1/models", headers=headers)  # noqa: S310 - the configured server
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:  # noqa: S310
            body = r.read()
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise _key_error(url, exc.code) from None
        if exc.code == 404:
            raise ConfigError(f"server at {url} has no /v1/models (HTTP 404): set VLLMResource.server_url to "
                              "the root URL of an OpenAI-compatible server (vllm serve)") from None
        raise EngineError(f"server at {url} answered HTTP {exc.code} to /v1/models: "
                          f"{_message(exc.read().decode(errors='replace'))}") from None
    except OSError as exc:  # refused, reset, DNS, timeout
        raise EngineError(f"server at {url} unreachable: {exc}: check VLLMResource.server_url") from None
    try:
        return list(json.loads(body)["data"])
    except (ValueError, KeyError, TypeError):
        raise EngineError(f"server at {url} answered /v1/models with no model list: {body[:200]!r}") from None


def _entry(models: list[dict], url: str, model: str) -> dict:
    for entry in models:
        if entry.get("id") == model:
            return entry
    raise ConfigError(f"server at {_root(url)} serves {[m.get('id') for m in models]}, not model={model!r}: "
                      "set VLLMResource.model to one of them")


def check_served(base_url: str, model: str, api_key: str | None) -> dict:
    """The ``/v1/models`` entry of ``model``, or a ConfigError listing what the server serves."""
    return _entry(served_models(base_url, api_key), base_url, model)


def _classify(status: int, text: str, url: str) -> str:
    """``retry``, or the reason of a row's own failure; a ConfigError for a setting that fails every row."""
    if status in _RETRY_STATUS:
        return "retry"
    if status in (401, 403):
        raise _key_error(url, status)
    low = text.lower()
    if "chat template" in low or "chat_template" in low:
        raise ConfigError(f"server at {url} cannot render chat messages (HTTP {status}: {text}): the model has no "
                          "chat template: use a chat (instruct) model, or start the server with --chat-template")
    if re.search(r"context length|maximum[^.]*tokens|reduce the length", low):
        return "prompt_too_long"
    return "bad_request"


class VLLMServerEngine(Engine):
    """Client of an OpenAI-compatible server. ``server`` is the process we own, if any."""

    def __init__(self, base_url: str, model_name: str, api_key: str | None = None, max_in_flight: int = 1024,
                 timeout_s: float = 600.0, max_retries: int = 5, backoff_s: float = 0.5,
                 server: ServerProcess | None = None) -> None:
        self.base_url = _root(base_url)
        # What requests ask for; ``model_id`` (what rows record) may be renamed to an identity.
        self.served_name = self.model_id = model_name
        self.max_in_flight = max_in_flight
        self.timeout_s, self.max_retries, self.backoff_s = timeout_s, max_retries, backoff_s
        self.server = server
        self.start_seconds = server.start_seconds if server else 0.0
        self._api_key = api_key
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        try:  # preflight: a wrong key or model stops the run here, before any row is sent
            models = served_models(self.base_url, api_key)
            self.served = _entry(models, self.base_url, model_name)
        except BaseException:
            if server:
                server.stop()  # ours, started for this engine: never left running
            raise
        # vLLM answers with the first of a model's served names, whichever one was asked for.
        root = self.served.get("root")
        self._names = {model_name} | {m.get("id") for m in models if root and m.get("root") == root}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sparkbatch-client", daemon=True)
        self._thread.start()
        self._session: Any = asyncio.run_coroutine_threadsafe(self._open(), self._loop).result()

    async def _open(self) -> Any:
        import aiohttp

        connector = aiohttp.TCPConnector(limit=self.max_in_flight)
        # The timeout runs from when a request is sent (sock_read: no answer for timeout_s), not
        # from when it was queued for a pooled connection: with ``total``, requests that waited
        # behind a full pool timed out without ever reaching the server.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=self.timeout_s)
        return aiohttp.ClientSession(connector=connector, headers=self._headers, timeout=timeout)

    def generate(
        self, requests: Iterable[EngineRequest], sampling: SamplingSpec, output: OutputSpec
    ) -> Iterator[EngineResult]:
        done: queue.Queue[cf.Future] = queue.Queue()
        pending: set[cf.Future] = set()
        source = iter(requests)
        exhausted = succeeded = transient = False
        # Until one request succeeds, a 400 may be the request's fault (model, sampling, output
        # settings) rather than the row's: such results are held back, not yielded as error rows.
        held: list[EngineResult] = []
        try:
            while True:
                # Requests are pulled here, in the caller's thread: the async thread only does I/O.
                # _HOLD held failures stop new sends: those in flight decide (one success releases).
                while not exhausted and len(pending) < self.max_in_flight and (succeeded or len(held) < _HOLD):
                    req = next(source, None)
                    if req is None:
                        exhausted = True
                        break
                    body = request_body(self.served_name, req.messages, sampling, output)
                    fut = asyncio.run_coroutine_threadsafe(self._one(req.id, body), self._loop)
                    fut.add_done_callback(done.put)
                    pending.add(fut)
                if not pending:
                    yield from _undecided(held, transient, exhausted)
                    return
                fut = self._next_done(done)
                pending.discard(fut)
                res = fut.result()
                transient = transient or res.retryable
                if res.error is None and not succeeded:
                    succeeded = True  # the request works: the held 400s were the rows' own
                    yield from held
                    held.clear()
                if res.error is None or succeeded or res.retryable:
                    yield res
                else:
                    held.append(res)
        finally:
            for fut in pending:
                fut.cancel()

    def _next_done(self, done: queue.Queue[cf.Future]) -> cf.Future:
        while True:
            try:
                return done.get(timeout=1.0)
            except queue.Empty:
                self._check_server()

    async def _one(self, row_id: str, body: dict[str, Any]) -> EngineResult:
        import aiohttp

        last, unreachable = "", False
        for attempt in range(self.max_retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1) * (1 + random.random()))
            self._check_server()
            try:
                async with self._session.post(self.base_url + "/v1/chat/completions", json=body) as r:
                    if r.status == 200:
                        return self._result(row_id, await r.json(content_type=None))
                    text = _message(await r.text())
                    if r.status == 404:
                        raise await asyncio.to_thread(self._unknown_model, text)
                    kind = _classify(r.status, text, self.base_url)
                    if kind != "retry":
                        return EngineResult(row_id, None, error=f"{kind}: HTTP {r.status}: {text}")
                    last, unreachable = f"HTTP {r.status}: {text}", False
            except aiohttp.SocketTimeoutError:  # sent, but no answer: the server is slow, not gone
                last, unreachable = f"no answer in {self.timeout_s:g}s (request_timeout_s)", False
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as exc:
                last, unreachable = f"connection: {exc!r}", True
        if unreachable:
            raise EngineError(f"server at {self.base_url} unreachable after {self.max_retries} retries: {last}")
        # Not the row's fault: nothing is written for it, and the next run retries it.
        return EngineResult(row_id, None, error=f"server_error: {last} after {self.max_retries} retries",
                            retryable=True)

    def _unknown_model(self, text: str) -> ConfigError:
        with contextlib.suppress(EngineError):  # /v1/models does not answer: say what we know
            check_served(self.base_url, self.served_name, self._api_key)  # raises, listing what it serves
        return ConfigError(f"server at {self.base_url} answered HTTP 404 for model={self.served_name!r} ({text}): "
                           "set VLLMResource.model to a model it serves")

    def _result(self, row_id: str, data: dict[str, Any]) -> EngineResult:
        answered = data.get("model")
        if answered is not None and answered not in self._names:
            # Another model answered (the URL points elsewhere): rows must never mix models.
            raise ConfigError(f"server at {self.base_url} answered as model {answered!r}, not {self.served_name!r}: "
                              "set VLLMResource.server_url and model to one server and the model it serves")
        usage = data.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        return EngineResult(
            row_id, data["choices"][0]["message"].get("content") or "",
            prompt_tokens=int(usage.get("prompt_tokens", 0)), output_tokens=int(usage.get("completion_tokens", 0)),
            cached_tokens=int(details.get("cached_tokens") or 0),
        )

    def _check_server(self) -> None:
        """A server we own that has exited fails the run now, not after every retry."""
        if self.server and not self.server.alive():
            raise EngineError(f"vllm serve died (exit code {self.server.proc.returncode}): {self.server.log_tail()}")

    def close(self) -> None:
        if self._loop.is_running():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._session.close(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        if self.server:
            self.server.stop()


def _undecided(held: list[EngineResult], transient: bool, exhausted: bool) -> list[EngineResult]:
    """Held 400s when nothing is left in flight and nothing has succeeded: decide what they are."""
    if not held:
        return []
    if transient:  # the server also failed transiently: no evidence either way, so retry them later
        return [EngineResult(r.id, None, error=r.error, retryable=True) for r in held]
    reasons = {(r.error or "").split(":", 1)[0] for r in held}
    if exhausted and len(held) < _HOLD and reasons == {"prompt_too_long"}:
        return held  # the server said why, row by row: a few over-long prompts are those rows' own
    raise ConfigError(f"every request fails with {(held[0].error or '').partition(': ')[2]}: "
                      "check VLLMResource.model and the job's output/sampling settings")
