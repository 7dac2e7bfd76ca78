"""LiveServer: the real aiohttp app on a free loopback port, in a background thread.

Tests drive it with the official SDKs (synchronous clients) or raw httpx. The site is a real
TCP listener with handler cancellation on, exactly as `ninfer-serve` runs it.
"""
from __future__ import annotations

import asyncio
import threading
from types import TracebackType
from typing import Any

from aiohttp import web

from ninfer_nb.server import ServerConfig, create_app


class LiveServer:
    def __init__(self, engine: Any, config: ServerConfig) -> None:
        self.engine = engine
        self.config = config
        self.app: web.Application | None = None
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self, coro: Any, timeout: float = 60.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _start(self) -> None:
        self.app = create_app(self.engine, self.config)
        self._runner = web.AppRunner(self.app, handler_cancellation=True,
                                     shutdown_timeout=self.config.shutdown_timeout_s)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    def start(self) -> LiveServer:
        self._thread.start()
        self._run(self._start())
        return self

    def stop(self) -> None:
        if self._runner is not None:
            self._run(self._runner.cleanup(), timeout=120.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> LiveServer:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
