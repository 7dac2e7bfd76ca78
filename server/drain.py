"""Graceful drain on SIGINT / SIGTERM: refuse new work, end queued work, let running work finish.

`drain(app, timeout_s)` runs while the listener is still open, so a new request gets a 503 with
`Retry-After` (the middleware checks `ServerState.draining`) instead of a refused connection.
Queued generations end at once with that 503 (an error event if their stream has begun with
keep-alives); running ones get `timeout_s` to finish, then end with their protocol's error event.
Idempotent: the app's shutdown calls it too. Knows no protocol shapes.
"""
from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from .errors import HttpError
from .generation import Generation
from .state import STATE

log = logging.getLogger("ninfer.server")
POLL_S = 0.05
HANDLER_GRACE_S = 2.0   # for aborted handlers to write their error event and close


async def drain(app: web.Application, timeout_s: float) -> None:
    state = app[STATE]
    if state.draining:
        return
    state.draining = True
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    queued = [gen for gen in state.generations if not gen.started]
    for gen in queued:
        gen.abort(state.shutting_down())
    running = len(state.generations) - len(queued)
    log.info("draining: %d running, %d queued refused; waiting up to %.0f s",
             running, len(queued), timeout_s)
    while _unfinished(state.generations) and loop.time() < deadline:
        await asyncio.sleep(POLL_S)
    cut = _unfinished(state.generations)
    for gen in cut:
        gen.abort(HttpError(503, f"the server shut down before this request finished "
                                 f"(--shutdown-timeout {timeout_s:g} s)",
                            code="server_shutdown", retry_after_s=1))
    grace_end = loop.time() + HANDLER_GRACE_S
    while state.generations and loop.time() < grace_end:
        await asyncio.sleep(POLL_S)
    if cut:
        log.warning("drain: %d generation(s) cut at the deadline", len(cut))


def _unfinished(generations: set[Generation]) -> list[Generation]:
    return [gen for gen in generations if gen.finished is None and gen.abort_error is None]
