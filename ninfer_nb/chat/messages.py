"""Value types shared by the output parsers: a parsed tool call and one streamed delta.

Plain dataclasses with no behaviour beyond small conveniences; they know nothing about any
wire format (OpenAI / Anthropic shapes are built by the server from these).
"""
from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any, Literal

DeltaKind = Literal["reasoning", "content", "tool_call"]


def new_tool_call_id() -> str:
    """`call_` followed by 16 random hex digits."""
    return "call_" + secrets.token_hex(8)


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    @property
    def arguments_json(self) -> str:
        """The arguments as a JSON object string (OpenAI's `function.arguments`)."""
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass
class ChatDelta:
    kind: DeltaKind
    text: str = ""
    tool_call: ToolCall | None = None


@dataclass
class ChatMessageOut:
    reasoning: str
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
