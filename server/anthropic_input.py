"""Anthropic Messages request → engine messages, tools and sampling (serving-api.md §5).

Shared by /v1/messages and /v1/messages/count_tokens. Knows nothing about responses.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import messages as m
from .constraints import OutputRequest, json_format, one_of, tool_grammar
from .engine import Message, Tool
from .errors import BadRequest
from .fields import Fields, as_object
from .generation import ChatJob
from .route_fields import check_fields
from .state import ServerState


@dataclass(frozen=True)
class MessagesOptions:
    model: str
    stream: bool


def _text_blocks(content: Any, where: str) -> str:
    """A string, or text blocks joined; images are refused (no vision)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where} must be a string or an array of blocks", param=where)
    out: list[str] = []
    for i, block in enumerate(content):
        b = as_object(block, f"{where}[{i}]")
        kind = b.string("type", required=True)
        if kind == "text":
            out.append(b.string("text", required=True) or "")
        elif kind in ("image", "document"):
            raise BadRequest(f"{kind} blocks are not supported: this server was started "
                             "without vision", param=f"{where}[{i}].type")
        else:
            raise BadRequest(f"block type {kind!r} is not supported here",
                             param=f"{where}[{i}].type")
    return "\n".join(out)


def _user_turns(content: Any, where: str) -> list[Message]:
    if isinstance(content, str):
        return [m.user(content)]
    if not isinstance(content, list):
        raise BadRequest(f"{where} must be a string or an array of blocks", param=where)
    out: list[Message] = []
    texts: list[Any] = []
    for i, block in enumerate(content):
        b = as_object(block, f"{where}[{i}]")
        if b.string("type", required=True) == "tool_result":
            call_id = b.string("tool_use_id", required=True) or ""
            result = b.raw("content")
            text = "" if result is None else _text_blocks(result, f"{where}[{i}].content")
            out.append(m.tool_result(call_id, text))
        else:
            texts.append(block)
    if texts:
        out.append(m.user(_text_blocks(texts, where)))
    return out


def _assistant_turn(content: Any, where: str) -> Message:
    if isinstance(content, str):
        return m.assistant(content)
    if not isinstance(content, list):
        raise BadRequest(f"{where} must be a string or an array of blocks", param=where)
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for i, block in enumerate(content):
        bw = f"{where}[{i}]"
        b = as_object(block, bw)
        kind = b.string("type", required=True)
        if kind == "text":
            texts.append(b.string("text", required=True) or "")
        elif kind == "thinking":
            reasoning.append(b.string("thinking", "") or "")
        elif kind == "redacted_thinking":
            continue
        elif kind == "tool_use":
            args = m.parse_arguments(b.raw("input") or {}, f"{bw}.input")
            calls.append(m.tool_call(b.string("id", required=True) or "",
                                     b.string("name", required=True) or "", args))
        else:
            raise BadRequest(f"assistant block type {kind!r} is not supported",
                             param=f"{bw}.type")
    return m.assistant("".join(texts), "".join(reasoning) or None, calls)


def parse_messages(f: Fields) -> list[Message]:
    out: list[Message] = []
    system = f.raw("system")
    if system is not None:
        text = _text_blocks(system, "system")
        if text:
            out.append(m.system(text))
    for i, item in enumerate(f.array("messages", required=True) or []):
        where = f"messages[{i}]"
        msg = as_object(item, where)
        role = msg.string("role", required=True)
        content = msg.raw("content")
        if content is None:
            raise BadRequest(f"{where}.content is required", param=f"{where}.content")
        if role == "user":
            out.extend(_user_turns(content, f"{where}.content"))
        elif role == "assistant":
            out.append(_assistant_turn(content, f"{where}.content"))
        elif role == "system":  # folded into the leading system turn
            text = _text_blocks(content, f"{where}.content")
            if out and out[0]["role"] == "system":
                out[0]["content"] += "\n\n" + text
            else:
                out.insert(0, m.system(text))
        else:
            raise BadRequest(f"{where}.role must be user or assistant, got {role!r}",
                             param=f"{where}.role")
    if not any(msg["role"] != "system" for msg in out):
        raise BadRequest("messages must contain at least one user message", param="messages")
    return out


def parse_tools(f: Fields) -> list[Tool] | None:
    raw = f.array("tools")
    if not raw:
        return None
    tools: list[Tool] = []
    for i, item in enumerate(raw):
        where = f"tools[{i}]"
        t = as_object(item, where)
        kind = t.string("type", "custom")
        if kind != "custom":
            raise BadRequest(f"tool type {kind!r} is not supported (only custom tools)",
                             param=f"{where}.type")
        if not t.has("input_schema"):
            raise BadRequest(f"{where}.input_schema is required", param=f"{where}.input_schema")
        tools.append(m.function_tool(t.raw("name"), t.raw("description"), t.raw("input_schema"),
                                     where=where, max_name=128))
    choice = f.object("tool_choice")
    if choice is None or choice.get("type") in ("auto", "any"):
        return tools
    if choice.get("type") == "none":
        return None
    if choice.get("type") == "tool":
        return m.tool_named(tools, str(choice.get("name")), "tool_choice.name")
    raise BadRequest("tool_choice.type must be auto, any, none or tool", param="tool_choice")


def thinking_enabled(state: ServerState, f: Fields) -> bool:
    thinking = f.object("thinking")
    if thinking is None:
        return state.config.enable_thinking
    return thinking.get("type") != "disabled"


def thinking_budget(f: Fields) -> int | None:
    """`thinking.budget_tokens` (type enabled): thinking tokens before `</think>` is forced."""
    thinking = f.object("thinking")
    if thinking is None or thinking.get("type") == "disabled":
        return None
    return as_object(thinking, "thinking").integer("budget_tokens", minimum=1)


def parse_messages_request(
    state: ServerState, body: dict[str, Any]
) -> tuple[ChatJob, MessagesOptions]:
    f = Fields(body)
    check_fields("/v1/messages", body)
    model = f.string("model", required=True) or ""
    max_tokens = f.integer("max_tokens", minimum=1)
    if max_tokens is None:
        raise BadRequest("max_tokens is required", param="max_tokens")
    stop = f.array("stop_sequences") or []
    if not all(isinstance(s, str) for s in stop):
        raise BadRequest("stop_sequences must be an array of strings", param="stop_sequences")
    params = state.sampling(
        max_tokens,
        stop=tuple(s for s in stop if s),
        temperature=f.number("temperature", lo=0.0, hi=1.0),
        top_p=f.number("top_p", lo=0.0, hi=1.0),
        top_k=f.integer("top_k", minimum=0),
    )
    tools = parse_tools(f)
    job = ChatJob(parse_messages(f), tools, params, thinking_enabled(state, f), _output(f, tools),
                  thinking_budget=thinking_budget(f))
    return job, MessagesOptions(model=model, stream=bool(f.boolean("stream", False)))


def _output(f: Fields, tools: list[Tool] | None) -> OutputRequest | None:
    """`output_config.format` json_schema, or calls enforced by `tool_choice` any / tool /
    `disable_parallel_tool_use`."""
    config = f.object("output_config") or {}
    fmt = config.get("format") or {}
    if not isinstance(fmt, dict):
        raise BadRequest("output_config.format must be an object", param="output_config.format")
    if fmt and fmt.get("type") != "json_schema":
        raise BadRequest("output_config.format.type must be json_schema",
                         param="output_config.format.type")
    want = json_format(fmt.get("type"), fmt.get("schema"), "output_config.format.schema")
    choice = f.object("tool_choice") or {}
    forced = choice.get("type") in ("any", "tool")
    parallel = choice.get("disable_parallel_tool_use") is not True
    return one_of(want, tools, tool_grammar(tools, "required" if forced else "auto", parallel,
                                            "tool_choice"))
