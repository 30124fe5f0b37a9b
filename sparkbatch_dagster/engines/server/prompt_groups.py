"""Several rows' prompts in one ``/v1/completions`` request, each row answered as if sent alone.

Every HTTP request costs a `vllm serve` frontend its parsing, routing and validation, and the
client its aiohttp round trip; in the first burst of a run (thousands of requests at once) that
per-request cost is what keeps the server's batch from filling. The completions API takes a list
of prompts (token ids here) and answers one choice per prompt, so requests that start together
with the same settings go as one, up to ``size`` prompts. A real `vllm serve` frontend on the
2-core CPU spent 0.52 ms of CPU a row with 16 prompts per request against 1.16 with one
(``benchmarks/server/frontend_cpu.py``).

The caller still sends row by row (``await groups.post(url, body)``) and gets the row's own
status and answer, shaped as a one-prompt answer: its choice, its ``usage`` (prompt tokens from
its ids, output tokens from the choice's ``token_ids``, which ``return_token_ids`` asks vLLM
for, and which also sends each prompt's ids back; the group's cached tokens shared out by
prompt length, as vLLM reports only their sum).
What a group cannot say row by row it does not decide: a group answered with a 4xx is sent again
one row per request, so a too-long prompt is that row's error and no other's; a 429 or 5xx (or
a 200 whose body is not JSON, taken as a 502), a timeout or a dropped connection reaches every
row of the group as if it were its own, and each retries alone. A server whose answer lacks a
choice's ``token_ids`` (not vLLM) gets one prompt per request from then on.

    groups = PromptGroups(session, size=16)
    status, answer = await groups.post(url + "/v1/completions", body)   # body["prompt"]: token ids
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from ...errors import ConfigError
from ..config import EngineSettings

__all__ = ["PROMPTS_PER_REQUEST", "PromptGroups", "prompts_per_request", "token_ids"]

#: Prompts per request to a `vllm serve` started for the job (server_token_ids).
PROMPTS_PER_REQUEST = 16



def token_ids(cfg: EngineSettings, started_here: bool) -> bool:
    """Whether the client sends token ids (``server_token_ids``); ``None`` means on for a server
    started here, off for others.

    A server started here has its tokenizer folder on this machine and renders with the model's
    own template (unless ``engine_kwargs`` gives it another), so the ids are the ones it would
    make, and its one HTTP frontend process then neither renders nor tokenizes (on an H200, 1B
    shape: 0.99 of the offline pipeline with ids, 0.70 with chat bodies, same run). Someone
    else's server may not have its tokenizer here.
    """
    if cfg.server_token_ids is not None:
        return cfg.server_token_ids
    return started_here and "chat_template" not in cfg.engine_kwargs


def prompts_per_request(cfg: EngineSettings, started_here: bool) -> int:
    """What ``server_prompts_per_request=None`` means: :data:`PROMPTS_PER_REQUEST` for a `vllm
    serve` started here that gets token ids (vLLM answers a list of prompts choice by choice, with
    each choice's token ids), one for servers someone else runs, which may not. One without token
    ids (chat bodies take one conversation a request)."""
    ids = token_ids(cfg, started_here)
    size = cfg.server_prompts_per_request
    if size is None:
        return PROMPTS_PER_REQUEST if started_here and ids else 1
    if size > 1 and not ids:
        raise ConfigError(f"server_prompts_per_request={size} needs server_token_ids (several prompts go to "
                          "/v1/completions as token ids): set server_token_ids=True, or server_prompts_per_request=1")
    return size


_Waiting = tuple[dict[str, Any], "asyncio.Future[tuple[int, Any]]"]


class PromptGroups:
    """Rows posted in the same turn of the event loop, with the same settings, sent as one request."""

    def __init__(self, session: Any, size: int = PROMPTS_PER_REQUEST) -> None:
        self.session, self.size = session, size
        self.requests = self.rows = 0  # HTTP requests sent, rows answered through them
        self._waiting: dict[tuple[str, bytes], list[_Waiting]] = {}

    async def post(self, url: str, body: dict[str, Any]) -> tuple[int, Any]:
        """``(status, answer)`` for this row: the parsed JSON for a 200, the body's text otherwise."""
        if self.size <= 1:
            return await self._alone(url, body)
        key = (url, _key({k: v for k, v in body.items() if k != "prompt"}))
        fut: asyncio.Future[tuple[int, Any]] = asyncio.get_running_loop().create_future()
        waiting = self._waiting.setdefault(key, [])
        waiting.append((body, fut))
        if len(waiting) >= self.size:
            self._send(key)
        elif len(waiting) == 1:  # the others that start in this turn of the loop join it
            asyncio.get_running_loop().call_soon(self._send, key)
        return await fut

    def _send(self, key: tuple[str, bytes]) -> None:
        rows = self._waiting.pop(key, [])
        if not rows:
            return
        task = asyncio.ensure_future(self._answer(key[0], rows))

        def abandoned(_: Any) -> None:  # every row stopped waiting (a cancelled run): stop the request
            if all(fut.cancelled() for _, fut in rows):
                task.cancel()

        for _, fut in rows:
            fut.add_done_callback(abandoned)

    async def _answer(self, url: str, rows: list[_Waiting]) -> None:
        try:
            answers = await self._group(url, [body for body, _ in rows]) if len(rows) > 1 else \
                [await self._alone(url, rows[0][0])]
        except Exception as exc:  # the same connection failure for every row: each retries alone
            for _, fut in rows:
                if not fut.done():
                    fut.set_exception(exc)
            return
        for (_, fut), answer in zip(rows, answers, strict=True):
            if not fut.done():
                fut.set_result(answer)

    async def _group(self, url: str, bodies: list[dict[str, Any]]) -> list[tuple[int, Any]]:
        prompts = [body["prompt"] for body in bodies]
        status, data = await self._request(url, {**bodies[0], "prompt": prompts, "return_token_ids": True})
        if status == 200:
            split = _split(data, prompts)
            if split is not None:
                self.rows += len(bodies)
                return split
            self.size = 1  # no token ids per choice: output tokens cannot be told row by row
        elif status == 429 or status >= 500:
            return [(status, data)] * len(bodies)
        return list(await asyncio.gather(*(self._alone(url, body) for body in bodies)))

    async def _alone(self, url: str, body: dict[str, Any]) -> tuple[int, Any]:
        status, data = await self._request(url, body)
        self.rows += status == 200
        return status, data

    async def _request(self, url: str, body: dict[str, Any]) -> tuple[int, Any]:
        self.requests += 1
        async with self.session.post(url, data=_dumps(body), headers=_JSON) as r:
            if r.status != 200:
                return r.status, await r.text()
            raw = await r.read()
        try:
            return 200, _loads(raw)
        except msgspec.DecodeError as exc:  # a gateway's page, a cut body: a server fault, retried as one
            return 502, f"answered 200 with a body that is not JSON ({exc}): {raw[:200].decode(errors='replace')!r}"


#: The wire's JSON. A group's body carries every prompt's token ids, and vLLM's answer sends them
#: back (``return_token_ids``), so both ways are tens of kilobytes of integers a request, coded
#: in the client's event-loop thread. With msgspec (a vLLM dependency) instead of the standard
#: library the client spent 0.93 of the CPU a row (``benchmarks/server/server_client.py``, arm
#: ``stdlib_json``; ``cpu-server-client-msgspec.json``).
_dumps = msgspec.json.Encoder().encode
_loads = msgspec.json.Decoder().decode
_key = msgspec.json.Encoder(order="sorted").encode  # a row's settings, the same bytes for the same settings
_JSON = {"Content-Type": "application/json"}


def _split(data: dict[str, Any], prompts: list[list[int]]) -> list[tuple[int, Any]] | None:
    """A group's answer as one answer per prompt; None if its choices cannot say which is whose."""
    choices = {choice.get("index"): choice for choice in data.get("choices") or []}
    if set(choices) != set(range(len(prompts))) or any("token_ids" not in c for c in choices.values()):
        return None
    usage = data.get("usage") or {}
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    total = sum(len(p) for p in prompts) or 1
    shares = [cached * len(p) // total for p in prompts]
    shares[-1] += cached - sum(shares)  # the rounding's remainder: the shares add up to what vLLM said
    out = []
    for i, prompt in enumerate(prompts):
        choice = {**choices[i], "index": 0}
        row_usage = {"prompt_tokens": len(prompt), "completion_tokens": len(choice["token_ids"] or []),
                     "prompt_tokens_details": {"cached_tokens": shares[i]}}
        out.append((200, {"model": data.get("model"), "choices": [choice], "usage": row_usage}))
    return out
