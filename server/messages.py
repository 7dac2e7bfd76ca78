"""Builders for the engine's chat messages and tools (Hugging Face chat-template shape).

Every protocol translates into these: {"role", "content", "reasoning_content"?, "tool_calls"?},
tool results as {"role": "tool", "tool_call_id", "content"}, and tools as
{"type": "function", "function": {name, description, parameters}}. Knows no protocol.
"""
from __future__ import annotations

import json
import re
from typing import Any

from .engine import Message, Tool
from .errors import BadRequest

TOOL_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


def system(text: str) -> Message:
    return {"role": "system", "content": text}


def user(text: str) -> Message:
    return {"role": "user", "content": text}


def tool_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def assistant(
    content: str, reasoning: str | None = None, tool_calls: list[dict[str, Any]] | None = None
) -> Message:
    msg: Message = {"role": "assistant", "content": content}
    if reasoning:
        msg["reasoning_content"] = reasoning
    if tool_calls:
        msg["tool_calls"] = tool_calls
    return msg


def tool_result(call_id: str, content: str, name: str | None = None) -> Message:
    msg: Message = {"role": "tool", "tool_call_id": call_id, "content": content}
    if name:
        msg["name"] = name
    return msg


def function_tool(
    name: Any, description: Any, parameters: Any, *, where: str, max_name: int = 64
) -> Tool:
    if not isinstance(name, str) or len(name) > max_name or not TOOL_NAME.match(name):
        raise BadRequest(
            f"{where}.name must match [A-Za-z0-9_-] and be 1..{max_name} characters, got {name!r}",
            param=f"{where}.name",
        )
    if description is not None and not isinstance(description, str):
        raise BadRequest(f"{where}.description must be a string", param=f"{where}.description")
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    if not isinstance(parameters, dict):
        raise BadRequest(f"{where}.parameters must be a JSON schema object",
                         param=f"{where}.parameters")
    fn: dict[str, Any] = {"name": name}
    if description:
        fn["description"] = description
    fn["parameters"] = parameters
    return {"type": "function", "function": fn}


def tool_named(tools: list[Tool], name: str, where: str) -> list[Tool]:
    chosen = [t for t in tools if t["function"]["name"] == name]
    if not chosen:
        raise BadRequest(f"{where} names the tool {name!r}, which is not in tools", param=where)
    return chosen


def parse_arguments(raw: Any, where: str) -> dict[str, Any]:
    """Tool-call arguments given as a JSON-object string (OpenAI) or an object (Anthropic)."""
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            value = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError:
            value = None
        if isinstance(value, dict):
            return value
    raise BadRequest(f"{where} must be a JSON object (or a string holding one)", param=where)


def dump_arguments(arguments: dict[str, Any]) -> str:
    return json.dumps(arguments, ensure_ascii=False)


def has_tool_history(messages: list[Message]) -> bool:
    return any(m["role"] == "tool" or m.get("tool_calls") for m in messages)
