"""Turn an OpenAI-compatible chat-completions stream's JSON chunks into `tui.events`.

`ChunkReader` maps each chunk (an SSE event's data, split from the byte stream by httpx-sse in
the HTTP client) to events and remembers usage/timings so the final `Done` can carry them.
Lenient by design: unknown fields are ignored, timings may arrive in `usage`, `timings` or
neither. Knows nothing about sockets or SSE framing.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .events import (
    ChatEvent,
    ContentDelta,
    Done,
    Failed,
    ReasoningDelta,
    ToolCall,
    ToolCallDelta,
    TurnTimings,
)


def _num(d: dict[str, Any], *keys: str) -> float | None:
    for k in keys:
        v = d.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None


def _int(v: float | None) -> int | None:
    return None if v is None else int(v)


def timings_from(usage: dict[str, Any], timings: dict[str, Any]) -> TurnTimings:
    """Merge OpenAI `usage` and llama.cpp-style `timings` (either may be empty)."""
    details = usage.get("prompt_tokens_details")
    cached = _num(details, "cached_tokens") if isinstance(details, dict) else None
    ttft = _num(timings, "ttft_s")
    if ttft is None:
        ms = _num(timings, "ttft_ms", "prompt_ms")
        ttft = ms / 1000 if ms is not None else None
    return TurnTimings(
        prompt_tokens=_int(
            _num(usage, "prompt_tokens") or _num(timings, "prompt_n", "prompt_tokens")
        ),
        cached_tokens=_int(
            cached if cached is not None else _num(timings, "cache_n", "cached_tokens")
        ),
        completion_tokens=_int(
            _num(usage, "completion_tokens") or _num(timings, "predicted_n", "completion_tokens")
        ),
        ttft_s=ttft,
        prefill_tok_s=_num(timings, "prompt_per_second", "prefill_tok_s"),
        decode_tok_s=_num(timings, "predicted_per_second", "decode_tok_s"),
        draft_tokens=_int(_num(timings, "draft_n")),
        draft_accepted=_int(_num(timings, "draft_n_accepted")),
    )


@dataclass
class _PendingCall:
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass
class ChunkReader:
    """Stateful: feed payloads in order with `feed`, then call `finish` once."""

    finish_reason: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, Any] = field(default_factory=dict)
    chunks: int = 0
    _calls: dict[int, _PendingCall] = field(default_factory=dict)

    def feed(self, payload: str) -> list[ChatEvent]:
        if payload == "[DONE]":
            return []
        try:
            chunk = json.loads(payload)
        except json.JSONDecodeError:
            return []
        if not isinstance(chunk, dict):
            return []
        if isinstance(chunk.get("error"), (dict, str)):
            err = chunk["error"]
            msg = err.get("message", str(err)) if isinstance(err, dict) else err
            return [Failed(f"server error: {msg}")]
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
            if isinstance(chunk["usage"].get("timings"), dict):
                self.timings = chunk["usage"]["timings"]
        if isinstance(chunk.get("timings"), dict):
            self.timings = chunk["timings"]
        events: list[ChatEvent] = []
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                continue
            self.chunks += 1
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                events.append(ReasoningDelta(reasoning))
            content = delta.get("content")
            if isinstance(content, str) and content:
                events.append(ContentDelta(content))
            for tc in delta.get("tool_calls") or []:
                if isinstance(tc, dict):
                    self._merge_call(tc)
        return events

    def _merge_call(self, tc: dict[str, Any]) -> None:
        index = tc.get("index", len(self._calls))
        call = self._calls.setdefault(int(index) if isinstance(index, int) else 0, _PendingCall())
        call.id = str(tc.get("id") or call.id)
        fn = tc.get("function") or {}
        if isinstance(fn, dict):
            call.name += str(fn.get("name") or "")
            call.arguments += str(fn.get("arguments") or "")

    def finish(self) -> list[ChatEvent]:
        """Tool calls (assembled from their fragments) and the terminal Done."""
        events: list[ChatEvent] = [
            ToolCallDelta(ToolCall(c.id or f"call_{i}", c.name, c.arguments))
            for i, c in sorted(self._calls.items())
        ]
        events.append(Done(self.finish_reason or "stop", timings_from(self.usage, self.timings)))
        return events
