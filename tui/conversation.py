"""One conversation as plain data, and its conversion to OpenAI-style chat messages.

Knows nothing about storage or display. Reasoning is kept for display and export but is
not sent back to the model (the chat template drops earlier turns' thinking anyway).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from .events import ToolCall

Role = Literal["user", "assistant"]


@dataclass(frozen=True, slots=True)
class Message:
    role: Role
    content: str
    reasoning: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    footer: str = ""                        # timings summary / finish note, display only


@dataclass(slots=True)
class Conversation:
    """Mutable state of the chat on screen: `id` is None until first saved."""

    id: int | None = None
    title: str = "New chat"
    messages: list[Message] = field(default_factory=list)

    def api_messages(self, system: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if system:
            out.append({"role": "system", "content": system})
        for m in self.messages:
            item: dict[str, Any] = {"role": m.role, "content": m.content}
            if m.tool_calls:
                item["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments},
                    }
                    for c in m.tool_calls
                ]
            out.append(item)
        return out


def title_from(prompt: str, limit: int = 40) -> str:
    line = " ".join(prompt.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def tool_calls_to_json(calls: tuple[ToolCall, ...]) -> str:
    return json.dumps([{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls])


def tool_calls_from_json(text: str | None) -> tuple[ToolCall, ...]:
    if not text:
        return ()
    raw = json.loads(text)
    return tuple(ToolCall(str(c["id"]), str(c["name"]), str(c["arguments"])) for c in raw)
