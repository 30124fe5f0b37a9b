"""Server mode: the same interface over an OpenAI-compatible endpoint.

Either the plugin starts ``vllm serve`` itself (:class:`~.server_process.ServerProcess`) or it
talks to a server that is already running. :class:`VLLMServerEngine` keeps the server full:
many requests in flight (well above ``max_num_seqs``, so continuous batching always has work),
retries with backoff on 429/5xx/connection resets, and structured outputs through the
request's ``structured_outputs`` field.

With several endpoints (``server_urls``) requests are balanced by in-flight count, each
replica with its own ``max_in_flight``; a replica that dies mid-run (connection errors or 5xx
through every retry) has its rows re-sent to the live ones (``replicas.py``), and only when
every replica is dead do rows stay pending.

Failures are sorted three ways: a row's own (its prompt is too long, a sporadic 400) is an error
row; a setting's (wrong key, model, no chat template, 400 on every request) is a ConfigError
before any row of it is written; a transient one (5xx, read timeouts after every retry) is a
``retryable`` result that the runner leaves pending for the next run.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from ...errors import ConfigError, EngineError
from ...spec import OutputSpec, SamplingSpec
from ...spec.batch_tools import Tools
from .. import settings
from ..answers.encode_ahead import Prepared
from ..answers.plan import AnswerPlan, plan
from ..answers.tools import body_fields as tool_fields
from ..base import Engine, EngineRequest, EngineResult
from ..config import EngineSettings
from . import prompt_groups
from .endpoints import check_endpoints, message, unknown_model
from .handoff import Handoff
from .prompt_groups import PromptGroups
from .replicas import Pool, Replica
from .server_bodies import HOLD, Sent, answer_result, classify, grammar_body, labeled, undecided
from .server_process import KEEP_ALIVE_S, ServerProcess
from .token_prompts import load_tokenizer, token_bodies

__all__ = ["VLLMServerEngine"]

class VLLMServerEngine(Engine):
    """Client of one or several OpenAI-compatible servers serving the same model, with the
    settings of ``cfg``. ``server``: the process we own, if any (``vllm serve`` started here, with
    ``engines`` data-parallel engines); ``model_name``: what requests ask for."""

    #: Seconds before the first retry of a request (doubling, with jitter, after each).
    backoff_s = 0.5
    #: Requests per chunk of bodies built (and tokenized) in one call.
    chunk = 256

    def __init__(self, cfg: EngineSettings, base_url: str | Sequence[str], model_name: str,
                 server: ServerProcess | None = None, engines: int = 1) -> None:
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        self.settings = cfg
        # What requests ask for; ``model_id`` (what rows record) may be renamed to an identity.
        self.served_name = self.model_id = model_name
        started_here = server is not None
        # A server someone else runs is taken to be on a GPU; one started here is on this machine's platform.
        self._cpu = started_here and settings.on_cpu()
        self._plan: AnswerPlan | None = None  # this generate's (answers/plan.py)
        self._tools: dict[str, Tools] = {}  # row id: the tools its request was sent with
        self.max_in_flight = cfg.in_flight(engines)
        self.timeout_s, self.max_retries = cfg.request_timeout_s, cfg.max_retries
        self.server = server
        self.start_seconds = server.start_seconds if server else 0.0
        self._api_key = api_key = cfg.checked_api_key()
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        token_ids = prompt_groups.token_ids(cfg, started_here)
        try:  # preflight: a wrong key or model stops the run here, before any row is sent
            # A server someone else runs applies its own generation config; one started here gets ours.
            self.sampling_defaults = cfg.sampling_defaults() if started_here else {}
            self.served, self._names, live = check_endpoints(urls, model_name, api_key)
            # server_token_ids: the chat template and tokenizer applied here, ids to /v1/completions.
            self._tokenizer = load_tokenizer(self.served.get("root") or model_name) if token_ids else None
        except BaseException:
            if server:
                server.stop()  # ours, started for this engine: never left running
            raise
        self.base_url = live[0]
        self.pool = Pool(live, self.max_in_flight)
        self._path = "/v1/completions" if token_ids else "/v1/chat/completions"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sparkbatch-client", daemon=True)
        self._thread.start()
        self._session: Any = asyncio.run_coroutine_threadsafe(self._open(), self._loop).result()
        # Several prompts per request only where a request takes several: completions, token ids.
        self.groups = PromptGroups(self._session, prompt_groups.prompts_per_request(cfg, started_here))

    async def _open(self) -> Any:
        import aiohttp

        # Connections are kept between runs (a warm engine's next run reuses them) until a server
        # started here would close them (server_process.KEEP_ALIVE_S); aiohttp's default is 15 s.
        connector = aiohttp.TCPConnector(limit=self.max_in_flight * len(self.pool), keepalive_timeout=KEEP_ALIVE_S - 60)
        # The timeout runs from when a request is sent (sock_read: no answer for timeout_s), not
        # from when it was queued for a pooled connection: with ``total``, requests that waited
        # behind a full pool timed out without ever reaching the server.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=self.timeout_s)
        return aiohttp.ClientSession(connector=connector, headers=self._headers, timeout=timeout)

    def generate(
        self, requests: Iterable[EngineRequest], sampling: SamplingSpec, output: OutputSpec
    ) -> Iterator[EngineResult]:
        pool = self.pool
        pool.reset()  # a replica dead in an earlier run gets another chance
        # One step per label needs the token ids, so the tokenizer here (server_token_ids).
        self._plan = answers = plan(self._tokenizer, sampling, output, self.settings, defaults=self.sampling_defaults,
                                    cpu=self._cpu, server=True)
        again: set[str] = set()  # rows whose one step began several labels: asked again with the grammar
        stepping = 0  # one-step bodies in flight
        handoff = Handoff(self._loop)
        pending: dict[int, tuple[Sent, Replica]] = {}  # by Handoff token
        resend: deque[Sent] = deque()  # a dead replica's rows, and rows another replica may answer
        # Bodies are built (and tokenized, server_token_ids) a chunk at a time on a thread of
        # their own: this thread sends them and handles every answer (encode_ahead.py).
        source = Prepared(requests, self._bodies(answers), self.chunk)
        exhausted = succeeded = transient = False
        # Until one request succeeds, a 400 may be the request's fault (model, sampling, output
        # settings) rather than the row's: such results are held back, not yielded as error rows.
        held: list[EngineResult] = []
        try:
            while True:
                if not pool.live():  # every replica is dead: nothing can be sent, the rows left stay pending
                    transient, why = True, f"server_error: {pool.all_dead_reason()}"
                    rows = [sent[0] for sent in resend]
                    resend.clear()
                    yield from (EngineResult(row_id, None, error=why, retryable=True) for row_id in rows)
                    if not exhausted:
                        exhausted = True
                        yield from (EngineResult(req.id, None, error=why, retryable=True) for req in source.rest())
                # Requests are pulled here, in the caller's thread: the async thread only does I/O.
                # HOLD held failures stop new sends: those in flight decide (one success releases).
                while succeeded or len(held) < HOLD:
                    if resend:
                        row_id, body, tried, last = resend[0]
                        replica = pool.pick(exclude=tried)
                        if replica is None and last is not None and all(rep in tried for rep in pool.live()):
                            resend.popleft()  # transient failures from every live replica: pending
                            transient = True
                            yield last
                            continue
                        if replica is None:
                            break  # the replicas it may go to are full: wait for an answer
                        resend.popleft()
                    else:
                        route = answers.tally.route(stepping) if answers.tally is not None else None
                        replica = None if exhausted or (answers.tally is not None and route is None) else pool.pick()
                        if replica is None:
                            break  # every replica is full, nothing is left, or the probe's answers decide
                        if not source.ready():
                            handoff.flush()  # those go now, not once the next chunk is built
                        item = source.next()
                        if item is None:
                            exhausted = True
                            break
                        row_id, body, tried, last = item[0].id, item[1], frozenset(), None
                        if route == "grammar" and "allowed_token_ids" in body:  # the step does not pay here
                            body = grammar_body(body, sampling, output)
                    stepping += "allowed_token_ids" in body
                    token = handoff.add(self._one(replica, row_id, body))
                    replica.in_flight += 1
                    replica.sent += 1
                    pending[token] = ((row_id, body, tried, last), replica)
                handoff.flush()
                if not pending:  # nothing more can be sent (held 400s, or nothing left): decide and end
                    answers.report()
                    transient = transient or bool(resend)
                    yield from (last or EngineResult(row_id, None, error="server_error: not sent", retryable=True)
                                for row_id, _, _, last in resend)
                    yield from undecided(held, transient, exhausted)
                    return
                token, task = self._next_done(handoff)
                (row_id, body, tried, last), replica = pending.pop(token)
                replica.in_flight -= 1
                res = task.result()
                stepping -= "allowed_token_ids" in body
                res, asked = labeled(answers, row_id, body, res, again)
                if asked is not None:  # its token begins several labels: the grammar decides
                    resend.append(asked)
                    continue
                if res is None:  # its replica died before answering: the row goes to a live one
                    pool.report(replica)
                    replica.moved += bool(pool.live())
                    resend.append((row_id, body, tried, last))
                    continue
                if res.retryable and len(pool) > 1:  # failed here alone: another replica may answer it
                    resend.append((row_id, body, tried | {replica}, res))
                    continue
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
            source.close()
            if pending:
                handoff.cancel()
            pool.summary()

    def _bodies(self, answers: AnswerPlan) -> Callable[[list[EngineRequest]], list[dict]]:
        """What makes a chunk of requests' bodies (chat bodies, then token ids with ``server_token_ids``)."""
        completions = self._tokenizer is not None

        def bodies(batch: list[EngineRequest]) -> list[dict[str, Any]]:
            out = [{"model": self.served_name, "messages": req.messages,
                    **answers.fields(req, answers.planned(req), completions)} for req in batch]
            for req, body in zip(batch, out, strict=True):
                if req.tools is not None:  # a batch line's: its answer is read as tool calls (``_result``)
                    self._tools[req.id] = req.tools
                    body.update(tool_fields(req.tools, completions))
                    if not completions:  # the server forces the call itself, under its own schema
                        body.pop("structured_outputs", None)
            return out if self._tokenizer is None else token_bodies(self._tokenizer, out)

        return bodies

    def _next_done(self, handoff: Handoff) -> tuple[int, Any]:
        while (finished := handoff.next_done(timeout=1.0)) is None:
            self._check_server()
        return finished

    async def _one(self, rep: Replica, row_id: str, body: dict[str, Any]) -> EngineResult | None:
        """The row's result from ``rep``; None when ``rep`` is dead (the row goes elsewhere)."""
        import aiohttp

        last, unreachable, failing_since = "", False, 0.0
        for attempt in range(self.max_retries + 1):
            if attempt:
                await rep.pause(self.backoff_s * 2 ** (attempt - 1) * (1 + random.random()))
            if rep.dead:
                return None
            self._check_server()
            try:
                status, answer = await self.groups.post(rep.url + self._path, body)
                if status == 200:
                    res = self._result(rep.url, row_id, answer)
                    rep.answered()
                    return res
                text = message(answer)
                if status == 404:
                    raise await asyncio.to_thread(unknown_model, rep.url, self.served_name, self._api_key, text)
                kind = classify(status, text, rep.url)
                if kind != "retry":
                    rep.answered()
                    return EngineResult(row_id, None, error=f"{kind}: HTTP {status}: {text}")
                last, unreachable = f"HTTP {status}: {text}", False
            except aiohttp.SocketTimeoutError:  # sent, but no answer: the server is slow, not gone
                last, unreachable = f"no answer in {self.timeout_s:g}s (request_timeout_s)", False
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as exc:
                last, unreachable = f"connection: {exc!r}", True
            failing_since = failing_since or time.monotonic()
        failure = f"{last} after {self.max_retries} retries"
        if not last.startswith("no answer") and self.pool.declare_dead(rep, failure, failing_since):
            return None
        if unreachable and len(self.pool) == 1:
            raise EngineError(f"server at {rep.url} unreachable after {self.max_retries} retries: {last}")
        # Not the row's fault: nothing is written for it, and the next run retries it.
        return EngineResult(row_id, None, error=f"server_error: {failure}", retryable=True)

    def _result(self, url: str, row_id: str, data: dict[str, Any]) -> EngineResult:
        answered = data.get("model")
        if answered is not None and answered not in self._names:
            # Another model answered (the URL points elsewhere): rows must never mix models.
            raise ConfigError(f"server at {url} answered as model {answered!r}, not {self.served_name!r}: "
                              "set VLLMResource.server_url and model to one server and the model it serves")
        answers = self._plan
        assert answers is not None  # answers come only inside generate
        return answer_result(row_id, data, answers.scorer, answers.thinking, self._tokenizer,
                             answers.asked_more(row_id), self._tools.pop(row_id, None))

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

