"""engines/server/prompt_groups.py: rows that start together go as one completions request, and each
row still gets its own answer, its own error, and its own token counts."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from sparkbatch_dagster.engines.server.prompt_groups import PromptGroups

TOO_LONG = 99  # a prompt holding this token id is "too long" for the server below


class Server:
    """An OpenAI-style completions endpoint on loopback that answers prompt lists as vLLM does."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.status: int | None = None  # answer every request with this status instead
        self.token_ids = True  # whether choices carry token_ids (vLLM's return_token_ids)
        self.hold: asyncio.Event | None = None  # requests wait for it
        self.cancelled = asyncio.Event()  # a held request's client went away
        self.arrived = asyncio.Event()  # a request came in
        self.suffix = ""  # added to every answer's text
        self.page: str | None = None  # answer every request 200 with this text (not JSON) instead

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        self.arrived.set()
        if self.hold is not None:
            try:
                await self.hold.wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        if self.page is not None:
            return web.Response(status=200, text=self.page, content_type="text/html")
        if self.status is not None:
            return web.Response(status=self.status, text='{"error": {"message": "busy"}}')
        prompts = body["prompt"] if isinstance(body["prompt"][0], list) else [body["prompt"]]
        if any(TOO_LONG in p for p in prompts):
            return web.Response(status=400, text='{"error": {"message": "prompt is too long"}}')
        choices = [{"index": i, "text": f"answer to {p[0]}{self.suffix}", "finish_reason": "stop",
                    **({"token_ids": list(range(p[0] % 5 + 1))} if self.token_ids else {})}
                   for i, p in enumerate(prompts)]
        usage = {"prompt_tokens": sum(map(len, prompts)), "completion_tokens": 0,
                 "prompt_tokens_details": {"cached_tokens": 7}}
        return web.json_response({"model": "m", "choices": choices, "usage": usage})


def run(test: Callable[[PromptGroups, Server, str], Awaitable[None]], size: int = 16) -> Server:
    """``test(groups, server, url)`` against a fresh server, in an event loop of its own."""
    server = Server()

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", server.handle)
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            async with aiohttp.ClientSession() as session:
                await test(PromptGroups(session, size), server, f"http://127.0.0.1:{port}/v1/completions")
        finally:
            await runner.cleanup()

    asyncio.run(main())
    return server


def body(first: int, n: int = 3, **settings: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 8, **settings, "prompt": [first] + [1] * (n - 1)}


def test_rows_that_start_together_go_as_one_request_and_each_gets_its_own_answer():
    async def test(groups: PromptGroups, server: Server, url: str) -> None:
        answers = await asyncio.gather(*(groups.post(url, body(10 + i, n=2 + i)) for i in range(5)))
        assert len(server.bodies) == 1 and server.bodies[0]["return_token_ids"] is True
        assert server.bodies[0]["prompt"] == [body(10 + i, n=2 + i)["prompt"] for i in range(5)]
        for i, (status, data) in enumerate(answers):
            [choice] = data["choices"]
            assert status == 200 and choice["text"] == f"answer to {10 + i}" and choice["index"] == 0
            assert data["usage"]["prompt_tokens"] == 2 + i  # its own prompt, not the group's
            assert data["usage"]["completion_tokens"] == (10 + i) % 5 + 1
        # vLLM gives only the group's cached tokens: shared out, they add up to what it said
        assert sum(d["usage"]["prompt_tokens_details"]["cached_tokens"] for _, d in answers) == 7
        assert (groups.requests, groups.rows) == (1, 5)

    run(test)


def test_any_text_crosses_the_wire_both_ways_and_settings_group_whatever_their_order():
    stop = ["\u2013 fin", "\u7d42", "\"quoted\"\n"]  # non-ASCII, quotes, a newline: JSON's escapes both ways

    async def test(groups: PromptGroups, server: Server, url: str) -> None:
        server.suffix = " caf\u00e9 \u2713"
        answers = await asyncio.gather(groups.post(url, body(1, temperature=0.7, stop=stop)),
                                       groups.post(url, {"stop": stop, **body(2, temperature=0.7)}))
        assert len(server.bodies) == 1  # the same settings, in another key order: one group
        assert server.bodies[0]["stop"] == stop and server.bodies[0]["temperature"] == 0.7
        assert [d["choices"][0]["text"] for _, d in answers] == [f"answer to {i} caf\u00e9 \u2713" for i in (1, 2)]

    run(test)


@pytest.mark.parametrize("size", [16, 1])
def test_a_200_whose_body_is_not_json_is_a_server_fault_each_row_retries_naming_what_came(size: int):
    async def test(groups: PromptGroups, server: Server, url: str) -> None:
        server.page = "<html>upstream gateway</html>"
        answers = await asyncio.gather(*(groups.post(url, body(i)) for i in range(2)))
        for status, text in answers:
            assert status == 502 and "not JSON" in text and "<html>upstream gateway" in text

    run(test, size=size)


def test_groups_hold_at_most_size_prompts_and_never_mix_settings():
    async def test(groups: PromptGroups, server: Server, url: str) -> None:
        rows = [body(i) for i in range(7)] + [body(50 + i, temperature=0.5) for i in range(2)]
        answers = await asyncio.gather(*(groups.post(url, b) for b in rows))
        assert all(status == 200 for status, _ in answers)
        per_request = sorted(len(b["prompt"]) if isinstance(b["prompt"][0], list) else 1 for b in server.bodies)
        assert per_request == [1, 2, 3, 3]  # 3 + 3 + 1 alike, 2 others
        assert [a["choices"][0]["text"] for _, a in answers] == [f"answer to {b['prompt'][0]}" for b in rows]

    run(test, size=3)


def test_a_group_answered_400_is_sent_again_row_by_row_so_only_the_bad_row_fails():
    async def test(groups: PromptGroups, server: Server, url: str) -> None:
        answers = await asyncio.gather(*(groups.post(url, body(TOO_LONG if i == 2 else i)) for i in range(4)))
        assert [status for status, _ in answers] == [200, 200, 400, 200]
        assert "too long" in answers[2][1]
        assert len(server.bodies) == 5  # the group, then each row alone

    run(test)


def test_a_busy_server_answers_every_row_of_the_group_with_its_status_for_each_to_retry():
    async def test(groups: PromptGroups, server: Server, url: str) -> None:
        server.status = 503
        answers = await asyncio.gather(*(groups.post(url, body(i)) for i in range(4)))
        assert [status for status, _ in answers] == [503] * 4 and len(server.bodies) == 1

    run(test)


def test_a_server_without_token_ids_per_choice_gets_one_prompt_per_request():
    async def test(groups: PromptGroups, server: Server, url: str) -> None:
        server.token_ids = False
        first = await asyncio.gather(*(groups.post(url, body(i)) for i in range(3)))
        assert [s for s, _ in first] == [200] * 3 and len(server.bodies) == 4  # the group, then one by one
        await asyncio.gather(*(groups.post(url, body(i)) for i in range(3)))
        assert len(server.bodies) == 7 and groups.size == 1

    run(test)


def test_a_dropped_connection_reaches_every_row_of_the_group():
    async def test(groups: PromptGroups, server: Server, url: str) -> None:
        dead = "http://127.0.0.1:1/v1/completions"  # nothing listens there
        answers = await asyncio.gather(*(groups.post(dead, body(i)) for i in range(3)), return_exceptions=True)
        assert all(isinstance(a, aiohttp.ClientConnectionError) for a in answers)

    run(test)


def test_rows_that_stop_waiting_stop_their_request_at_the_server():
    async def test(groups: PromptGroups, server: Server, url: str) -> None:
        server.hold = asyncio.Event()
        rows = [asyncio.ensure_future(groups.post(url, body(i))) for i in range(3)]
        await server.arrived.wait()
        for row in rows:
            row.cancel()
        await asyncio.wait_for(server.cancelled.wait(), 60)  # a bound for a hang, not a timing

    server = run(test)
    assert server.cancelled.is_set()


@pytest.mark.parametrize("size", [1, 0])
def test_size_one_sends_every_row_alone(size: int):
    async def test(groups: PromptGroups, server: Server, url: str) -> None:
        answers = await asyncio.gather(*(groups.post(url, body(i)) for i in range(3)))
        assert [s for s, _ in answers] == [200] * 3
        assert [b["prompt"] for b in server.bodies] == [body(i)["prompt"] for i in range(3)]
        assert "return_token_ids" not in server.bodies[0]

    run(test, size=size)


def test_prompts_per_request_defaults_to_16_for_a_started_server_and_a_wrong_setting_stops_before_any_process(
        monkeypatch):
    from sparkbatch_dagster.definitions.resource import VLLMResource
    from sparkbatch_dagster.engines.server import server_process
    from sparkbatch_dagster.engines.server.prompt_groups import prompts_per_request
    from sparkbatch_dagster.engines.start import start
    from sparkbatch_dagster.errors import ConfigError

    started = VLLMResource(engine="server").engine_settings()
    elsewhere = VLLMResource(engine="server", server_url="http://127.0.0.1:1", model="m").engine_settings()
    assert prompts_per_request(started, started_here=True) == 16
    assert prompts_per_request(elsewhere, started_here=False) == 1
    mine = VLLMResource(engine="server", server_url="http://127.0.0.1:1", model="m", server_token_ids=True,
                        server_prompts_per_request=8).engine_settings()
    assert prompts_per_request(mine, started_here=False) == 8

    def no_server(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a server was started for a setting that cannot work")

    monkeypatch.setattr(server_process, "ServerProcess", no_server)
    chat = VLLMResource(engine="server", server_token_ids=False, server_prompts_per_request=4).engine_settings()
    with pytest.raises(ConfigError, match=r"prompts_per_request=4 needs server_token_ids.*server_token_ids=True"):
        start(chat)
