"""`Turn`: one running generation as an async iterator of `ChatEvent`s that can be
cancelled at once.

A pump task copies events from a backend source into a queue; `cancel()` stops the pump
(so the backend sees the cancellation at its next await) and queues a terminal
`Done("cancelled")` immediately, so the UI never waits for the engine to notice. Exactly one
terminal event (`Done` or `Failed`) is ever delivered. Knows nothing about Textual or HTTP.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from .events import ChatEvent, Done, Failed, TokenTick, TurnTimings

ErrorText = Callable[[BaseException], str | None]


class Turn:
    def __init__(self, source: AsyncIterator[ChatEvent], describe_error: ErrorText) -> None:
        """`describe_error` maps an exception to a user-facing line (None = re-raise it)."""
        self._queue: asyncio.Queue[ChatEvent] = asyncio.Queue()
        self._ended = False        # a terminal event has been queued
        self._delivered = False    # ... and handed to the reader
        self._tokens = 0
        self._describe = describe_error
        self._task = asyncio.create_task(self._pump(source))

    @property
    def active(self) -> bool:
        return not self._ended

    def _put(self, ev: ChatEvent) -> None:
        if self._ended:
            return
        if isinstance(ev, TokenTick):
            self._tokens = ev.tokens
        if isinstance(ev, (Done, Failed)):
            self._ended = True
        self._queue.put_nowait(ev)

    async def _pump(self, source: AsyncIterator[ChatEvent]) -> None:
        try:
            async for ev in source:
                self._put(ev)
                if self._ended:
                    break
        except asyncio.CancelledError:
            return
        except Exception as exc:
            text = self._describe(exc)
            if text is None:
                self._put(Failed(f"internal error: {type(exc).__name__}: {exc}"))
                raise
            self._put(Failed(text))
        else:
            self._put(Failed("the stream ended without a final event"))
        finally:
            closer = getattr(source, "aclose", None)
            if closer is not None:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await closer()

    def cancel(self) -> None:
        """End the turn now; the backend stops at its next step."""
        if self._ended:
            return
        self._put(Done("cancelled", TurnTimings(completion_tokens=self._tokens or None)))
        self._task.cancel()

    async def wait_closed(self) -> None:
        """Wait until the backend has let go (the pump finished)."""
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    def __aiter__(self) -> Turn:
        return self

    async def __anext__(self) -> ChatEvent:
        if self._delivered:
            raise StopAsyncIteration
        ev = await self._queue.get()
        if isinstance(ev, (Done, Failed)):
            self._delivered = True
        return ev
