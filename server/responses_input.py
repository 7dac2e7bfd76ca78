"""OpenAI Responses request → engine messages, tools and sampling (serving-api.md §4).

Input items (messages, reasoning, function calls and their outputs) become chat turns; a
`previous_response_id` conversation is prepended by the caller. Knows nothing about output.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ninfer_nb.engine.logprobs import MAX_TOP_LOGPROBS
from ninfer_nb.params import SamplingParams

from . import messages as m
from .constraints import OutputRequest, json_format, one_of, tool_grammar
from .engine import Message, Tool
from .errors import BadRequest
from .fields import MAX_SEED, Fields, as_object
from .openai_input import content_text
from .reasoning import effort_budget
from .route_fields import check_fields
from .state import ServerState


@dataclass(frozen=True)
class ResponsesRequest:
    model: str
    input_messages: list[Message]
    input_items: list[dict[str, Any]]
    instructions: str | None
    tools: list[Tool] | None
    params: SamplingParams
    enable_thinking: bool
    stream: bool
    store: bool
    previous_response_id: str | None
    include_reasoning: bool
    echo: dict[str, Any]          # request fields repeated in the response object
    output: OutputRequest | None = None   # text.format JSON, or calls enforced by tool_choice
    thinking_budget: int | None = None    # from reasoning.effort (server/reasoning.py)


def input_items(raw: Any) -> list[dict[str, Any]]:
    if isinstance(raw, str):
        return [{"type": "message", "role": "user", "content": raw}]
    if not isinstance(raw, list):
        raise BadRequest("input must be a string or an array of items", param="input")
    for i, item in enumerate(raw):
        as_object(item, f"input[{i}]")
    return raw


def items_to_messages(items: list[dict[str, Any]]) -> list[Message]:
    out: list[Message] = []
    pending_reasoning: list[str] = []

    def open_assistant() -> Message:
        if out and out[-1]["role"] == "assistant" and not out[-1]["content"]:
            return out[-1]
        out.append(m.assistant("", "".join(pending_reasoning) or None))
        pending_reasoning.clear()
        return out[-1]

    for i, item in enumerate(items):
        where = f"input[{i}]"
        f = Fields(item, where + ".")
        kind = f.string("type", "message")
        if kind == "message":
            role = f.string("role", required=True)
            text = content_text(f.raw("content"), f"{where}.content")
            if role in ("system", "developer"):
                out.append(m.system(text))
            elif role == "user":
                out.append(m.user(text))
            elif role == "assistant":
                msg = open_assistant()
                msg["content"] += text
            else:
                raise BadRequest(f"unsupported role {role!r}", param=f"{where}.role",
                                 code="unsupported_role")
        elif kind == "reasoning":
            parts = f.array("content") or []
            pending_reasoning.extend(str(p.get("text", "")) for p in parts if isinstance(p, dict))
        elif kind == "function_call":
            msg = open_assistant()
            call = m.tool_call(f.string("call_id", required=True) or "",
                               f.string("name", required=True) or "",
                               m.parse_arguments(f.raw("arguments") or "{}",
                                                 f"{where}.arguments"))
            msg.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = f.raw("output")
            text = output if isinstance(output, str) else content_text(output, f"{where}.output")
            out.append(m.tool_result(f.string("call_id", required=True) or "", text))
        elif kind in ("input_text",):
            out.append(m.user(f.string("text", required=True) or ""))
        elif kind in ("input_image", "input_file", "input_video"):
            raise BadRequest("image, file and video inputs are not supported (no vision)",
                             param=f"{where}.type", code="vision_disabled")
        else:
            raise BadRequest(f"input item type {kind!r} is not supported", param=f"{where}.type")
    return out


def leading_system(messages: list[Message]) -> list[Message]:
    """All system turns merged into one at the front (chat templates allow only that)."""
    systems = [msg["content"] for msg in messages if msg["role"] == "system"]
    rest = [msg for msg in messages if msg["role"] != "system"]
    return ([m.system("\n\n".join(systems))] if systems else []) + rest


def parse_tools(f: Fields) -> list[Tool] | None:
    raw = f.array("tools")
    if not raw:
        return None
    tools: list[Tool] = []
    for i, item in enumerate(raw):
        where = f"tools[{i}]"
        t = as_object(item, where)
        if t.string("type", "function") != "function":
            raise BadRequest(f"only function tools are supported, got {t.raw('type')!r}",
                             param=f"{where}.type", code="tools_not_supported")
        tools.append(m.function_tool(t.raw("name"), t.raw("description"), t.raw("parameters"),
                                     where=where))
    choice = f.raw("tool_choice")
    if choice is None or choice in ("auto", "required"):
        return tools
    if choice == "none":
        return None
    if isinstance(choice, dict) and choice.get("type") == "function":
        return m.tool_named(tools, str(choice.get("name")), "tool_choice")
    raise BadRequest("tool_choice must be none, auto, required or a function",
                     param="tool_choice")


def _logprobs(f: Fields) -> int | None:
    """Output-text logprobs: `include: ["message.output_text.logprobs"]` and / or
    `top_logprobs` (0..20, the alternatives per token); None when neither asks."""
    top = f.integer("top_logprobs", minimum=0, maximum=MAX_TOP_LOGPROBS)
    if "message.output_text.logprobs" in (f.array("include") or []) or top is not None:
        return top or 0
    return None


def parse_responses_request(state: ServerState, body: dict[str, Any]) -> ResponsesRequest:
    f = Fields(body)
    check_fields("/v1/responses", body)
    model = f.string("model")
    state.check_model(model)
    text = f.object("text") or {}
    fmt = text.get("format") or {"type": "text"}
    if not isinstance(fmt, dict):
        raise BadRequest("text.format must be an object", param="text.format")
    want = json_format(fmt.get("type"), fmt.get("schema"), "text.format.schema"
                       if fmt.get("type") == "json_schema" else "text.format")
    if f.boolean("background"):
        raise BadRequest("background responses are not supported", param="background")
    items = input_items(f.raw("input") if f.has("input") else [])
    reasoning = f.object("reasoning") or {}
    effort_thinking, budget = effort_budget(reasoning.get("effort"), "reasoning.effort")
    thinking = f.boolean("enable_thinking")
    if thinking is None:
        thinking = effort_thinking if effort_thinking is not None else state.config.enable_thinking
    params = state.sampling(
        f.integer("max_output_tokens", minimum=1),
        temperature=f.number("temperature", lo=0.0, hi=2.0),
        top_p=f.number("top_p", lo=0.0, hi=1.0),
        top_k=f.integer("top_k", minimum=0),
        seed=f.integer("seed", minimum=0, maximum=MAX_SEED),
        logprobs=_logprobs(f),
    )
    include = f.array("include") or []
    instructions = f.string("instructions")
    echo = {
        "instructions": instructions,
        "max_output_tokens": f.raw("max_output_tokens"),
        "metadata": f.object("metadata") or {},
        "parallel_tool_calls": f.raw("parallel_tool_calls") is not False,
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "temperature": params.temperature,
        "text": {"format": fmt},
        "tool_choice": f.raw("tool_choice") or "auto",
        "tools": f.raw("tools") or [],
        "top_p": params.top_p,
    }
    tools = parse_tools(f)
    choice = f.raw("tool_choice")
    forced = choice not in (None, "auto", "none")  # required, or a named function
    parallel = f.raw("parallel_tool_calls") is not False
    calls = tool_grammar(tools, "required" if forced else "auto", parallel,
                         "tool_choice" if forced else "parallel_tool_calls")
    return ResponsesRequest(
        model=model or state.model_id,
        input_messages=items_to_messages(items),
        input_items=items,
        instructions=instructions,
        tools=tools,
        params=params,
        enable_thinking=thinking,
        stream=bool(f.boolean("stream", False)),
        store=f.boolean("store", True) is not False,
        previous_response_id=f.string("previous_response_id"),
        include_reasoning="reasoning.encrypted_content" in include,
        echo=echo,
        output=one_of(want, tools, calls),
        thinking_budget=budget,
    )
