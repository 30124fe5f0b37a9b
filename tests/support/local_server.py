"""An aiohttp app on a free loopback port, served from a thread of its own: the base of the
tests' OpenAI-compatible stub servers (routes and behaviour are the subclass's)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from aiohttp import web


class LocalServer:
    def __init__(self, routes: list[web.RouteDef]) -> None:
        self.loop = asyncio.new_event_loop()
        app = web.Application()
        app.add_routes(routes)
        self.runner = web.AppRunner(app, shutdown_timeout=0.1)
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._call(self._start())}"

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(120)  # only bounds a hang

    async def _start(self) -> int:
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        return self.runner.addresses[0][1]

    def stop(self) -> None:
        self._call(self.runner.cleanup())
