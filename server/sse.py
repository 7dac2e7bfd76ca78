"""Server-sent events over an aiohttp StreamResponse, prepared lazily.

Headers go out with the first event or keep-alive comment, so an error found before that is
still a plain HTTP error. A client that has gone away surfaces as ConnectionResetError from the
write. Knows nothing about what the events mean.
"""
from __future__ import annotations

import json
from typing import Any

from aiohttp import web

SSE_RESPONSE = web.RequestKey("ninfer_sse_response", web.StreamResponse)  # once prepared


class SSEWriter:
    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.response: web.StreamResponse | None = None

    @property
    def prepared(self) -> bool:
        return self.response is not None

    async def _ensure(self) -> web.StreamResponse:
        if self.response is None:
            resp = web.StreamResponse(
                status=200,
                headers={
                    "Content-Type": "text/event-stream; charset=utf-8",
                    "Cache-Control": "no-cache",
                    "X-Accel-Buffering": "no",
                },
            )
            await resp.prepare(self.request)
            self.request[SSE_RESPONSE] = resp
            self.response = resp
        return self.response

    async def _write(self, text: str) -> None:
        resp = await self._ensure()
        await resp.write(text.encode("utf-8"))

    async def send(self, data: dict[str, Any], event: str | None = None) -> None:
        head = f"event: {event}\n" if event else ""
        await self._write(f"{head}data: {_json_line(data)}\n\n")

    async def comment(self, text: str = "keep-alive") -> None:
        await self._write(f": {text}\n\n")

    async def done(self) -> None:
        await self._write("data: [DONE]\n\n")

    async def close(self) -> web.StreamResponse:
        resp = await self._ensure()
        try:
            await resp.write_eof()
        except ConnectionError:
            pass  # the client left after the last event; nothing more to tell it
        return resp


def _json_line(data: dict[str, Any]) -> str:
    """`data` as one line of JSON that UTF-8 can encode (a stray surrogate becomes \\uXXXX)."""
    text = json.dumps(data, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(data)
    return text
