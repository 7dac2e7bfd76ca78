"""`HttpClient`: talks to a running ninfer-serve (or any OpenAI-compatible server) with
httpx: streams /v1/chat/completions (stream=true; events split by httpx-sse), reads /v1/models
and /metrics.

Transport failures become one-line messages ("cannot reach ..."); nothing here raises into
the UI except `ClientError` from `start()`. Knows nothing about Textual.
"""
from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from httpx_sse import aconnect_sse

from .client import ClientError
from .events import (
    ChatEvent,
    ContentDelta,
    Done,
    EngineStats,
    Failed,
    ModelInfo,
    ReasoningDelta,
    TurnTimings,
)
from .prom import parse_metrics, stats_from_metrics
from .rate import RateMeter
from .settings import ChatSettings
from .sse import ChunkReader
from .sysmon import RemoteProbe, SystemProbe
from .turn import Turn


def describe_error(exc: BaseException, url: str = "") -> str | None:
    where = f" at {url}" if url else ""
    if isinstance(exc, ClientError):
        return exc.message
    if isinstance(exc, httpx.ConnectError):
        return f"cannot reach the server{where}: is ninfer-serve running?"
    if isinstance(exc, httpx.TimeoutException):
        return f"the server{where} timed out"
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError)):
        return f"lost the connection to the server{where}"
    if isinstance(exc, httpx.HTTPError):
        return f"HTTP error talking to the server{where}: {exc}"
    return None


def _error_body(status: int, body: bytes) -> str:
    text = body.decode("utf-8", "replace").strip()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = None
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict) and err.get("message"):
            text = str(err["message"])
        elif isinstance(err, str):
            text = err
    return f"server returned HTTP {status}: {text[:200] or 'no details'}"


class _Clock:
    """Client-side timings for servers that report none: TTFT to the first text delta,
    decode rate over the span of text deltas (network jitter included)."""

    def __init__(self, start: float) -> None:
        self.start = start
        self.first: float | None = None
        self.last: float | None = None

    def delta(self, now: float) -> None:
        if self.first is None:
            self.first = now
        self.last = now

    def fill(self, done: Done) -> Done:
        t = done.timings
        if self.first is None or self.last is None:
            return done
        ttft = t.ttft_s if t.ttft_s is not None else self.first - self.start
        decode = t.decode_tok_s
        span = self.last - self.first
        if decode is None and t.completion_tokens and t.completion_tokens > 1 and span > 0:
            decode = (t.completion_tokens - 1) / span
        prefill = t.prefill_tok_s
        if prefill is None and t.prompt_tokens and ttft > 0:
            prefill = (t.prompt_tokens - (t.cached_tokens or 0)) / ttft
        timings = TurnTimings(
            t.prompt_tokens, t.cached_tokens, t.completion_tokens, ttft, prefill, decode,
            t.draft_tokens, t.draft_accepted,
        )
        return Done(done.finish_reason, timings)


class HttpClient:
    remote = True

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        model: str | None = None,
        connect_timeout_s: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """`transport` replaces the network (tests: httpx.MockTransport)."""
        self.url = url.rstrip("/")
        self.model = model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # reads may stall for a long prefill; only connecting is bounded tightly
        timeout = httpx.Timeout(connect=connect_timeout_s, read=None, write=30.0, pool=30.0)
        self._http = httpx.AsyncClient(base_url=self.url, headers=headers, timeout=timeout, transport=transport)
        self.info: ModelInfo | None = None

    @property
    def description(self) -> str:
        return self.url

    async def start(self) -> ModelInfo:
        try:
            resp = await self._http.get("/v1/models")
        except httpx.HTTPError as exc:
            raise ClientError(describe_error(exc, self.url) or str(exc)) from exc
        if resp.status_code != 200:
            raise ClientError(_error_body(resp.status_code, resp.content))
        try:
            data = resp.json().get("data") or []
        except (json.JSONDecodeError, AttributeError):
            data = []
        first = data[0] if data and isinstance(data[0], dict) else {}
        model_id = self.model or str(first.get("id") or "unknown")
        meta = first.get("meta")
        flat = {**first, **(meta if isinstance(meta, dict) else {})}
        details = tuple(
            (str(k), str(v))
            for k, v in flat.items()
            if k not in ("id", "object", "created") and isinstance(v, (str, int, float))
        )
        max_ctx = first.get("max_model_len") or first.get("max_context")
        self.info = ModelInfo(
            model_id=model_id,
            backend=self.url,
            device=str(first.get("device", "")),
            max_context=int(max_ctx) if isinstance(max_ctx, int) else None,
            details=details,
        )
        return self.info

    def chat(self, messages: list[dict[str, Any]], settings: ChatSettings) -> Turn:
        return Turn(self._events(messages, settings), lambda e: describe_error(e, self.url))

    def _body(self, messages: list[dict[str, Any]], settings: ChatSettings) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model or (self.info.model_id if self.info else "default"),
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": settings.max_tokens,
            "temperature": settings.temperature,
            "top_p": settings.top_p,
            "chat_template_kwargs": {"enable_thinking": settings.thinking},
        }
        if settings.seed is not None:
            body["seed"] = settings.seed
        return body

    async def _events(
        self, messages: list[dict[str, Any]], settings: ChatSettings
    ) -> AsyncIterator[ChatEvent]:
        if self.info is None:
            await self.start()  # raises ClientError -> Failed, with the reason
        reader = ChunkReader()
        meter = RateMeter()
        clock = _Clock(time.monotonic())
        async with aconnect_sse(
            self._http, "POST", "/v1/chat/completions", json=self._body(messages, settings)
        ) as source:
            if source.response.status_code != 200:
                yield Failed(_error_body(source.response.status_code, await source.response.aread()))
                return
            async for sse in source.aiter_sse():
                payload = sse.data.strip()
                if not payload:
                    continue
                before = reader.chunks
                for ev in reader.feed(payload):
                    if isinstance(ev, (ContentDelta, ReasoningDelta)):
                        clock.delta(time.monotonic())
                    yield ev
                    if isinstance(ev, Failed):
                        return
                # one chunk per decode round: the best token clock the protocol gives
                if reader.chunks > before:
                    tick = meter.add(reader.chunks - before, time.monotonic())
                    if tick is not None:
                        yield tick
                if payload == "[DONE]":
                    break
        if reader.finish_reason is None and not reader.usage:
            yield Failed(f"lost the connection to the server at {self.url}")
            return
        for ev in reader.finish():
            yield clock.fill(ev) if isinstance(ev, Done) else ev

    async def stats(self) -> EngineStats:
        try:
            resp = await self._http.get("/metrics")
        except httpx.HTTPError:
            return EngineStats()
        if resp.status_code != 200:
            return EngineStats()
        return stats_from_metrics(parse_metrics(resp.text))

    def system_probe(self) -> SystemProbe:
        return RemoteProbe()

    async def close(self) -> None:
        await self._http.aclose()
