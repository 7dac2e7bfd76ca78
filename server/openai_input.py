"""OpenAI Chat Completions request → engine messages, tools and sampling (serving-api.md §3).

Validates every field it reads and rejects what the engine cannot do with a 400 and a clear
code. Knows nothing about responses or streaming.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ninfer_nb.engine.logprobs import MAX_TOP_LOGPROBS

from . import messages as m
from .constraints import OutputRequest, json_format, one_of, tool_grammar
from .engine import Message, Tool
from .errors import BadRequest
from .fields import MAX_SEED, Fields, as_object
from .generation import ChatJob
from .reasoning import effort_budget
from .route_fields import check_fields
from .state import ServerState

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant",
          "tool": "tool"}


MAX_N = 16                    # choices per request


@dataclass(frozen=True)
class ChatOptions:
    model: str
    stream: bool
    include_usage: bool
    n: int = 1
    logprobs: bool = False


def content_text(content: Any, where: str, *, allow_none: bool = False) -> str:
    """A message content (string or parts) as text; media and unknown parts are refused."""
    if content is None and allow_none:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where} must be a string or an array of content parts", param=where)
    texts: list[str] = []
    for i, part in enumerate(content):
        p = as_object(part, f"{where}[{i}]")
        kind = p.string("type", required=True)
        if kind in ("text", "input_text", "output_text"):
            texts.append(p.string("text", required=True) or "")
        elif kind in ("image_url", "video_url", "input_image", "image"):
            raise BadRequest("this server was started without vision; image and video inputs "
                             "are not supported", param=f"{where}[{i}]", code="vision_disabled")
        else:
            raise BadRequest(f"content part type {kind!r} is not supported",
                             param=f"{where}[{i}].type", code="modality_not_supported")
    return "\n".join(texts)


def parse_messages(raw: list[Any]) -> list[Message]:
    out: list[Message] = []
    for i, item in enumerate(raw):
        where = f"messages[{i}]"
        f = as_object(item, where)
        role = f.string("role", required=True) or ""
        if role == "function":
            raise BadRequest("the `function` role is deprecated and not supported; use tools",
                             param=f"{where}.role", code="tools_not_supported")
        if role not in _ROLES:
            raise BadRequest(f"unsupported role {role!r}", param=f"{where}.role",
                             code="unsupported_role")
        role = _ROLES[role]
        if role == "system":
            if any(msg["role"] != "system" for msg in out):
                raise BadRequest("only leading system messages are supported",
                                 param=f"{where}.role", code="unsupported_role")
            text = content_text(f.raw("content"), f"{where}.content")
            if out:
                out[0]["content"] += "\n\n" + text
            else:
                out.append(m.system(text))
        elif role == "user":
            out.append(m.user(content_text(f.raw("content"), f"{where}.content")))
        elif role == "assistant":
            out.append(_assistant(f, where))
        else:
            call_id = f.string("tool_call_id", required=True) or ""
            out.append(m.tool_result(call_id, content_text(f.raw("content"), f"{where}.content")))
    if not out:
        raise BadRequest("messages must not be empty", param="messages")
    return out


def _assistant(f: Fields, where: str) -> Message:
    content = content_text(f.raw("content"), f"{where}.content", allow_none=True)
    reasoning = f.string("reasoning_content") or f.string("reasoning")
    calls: list[dict[str, Any]] = []
    for j, raw in enumerate(f.array("tool_calls") or []):
        cw = f"{where}.tool_calls[{j}]"
        c = as_object(raw, cw)
        fn = as_object(c.raw("function"), f"{cw}.function")
        name = fn.string("name", required=True) or ""
        args = m.parse_arguments(fn.raw("arguments") or "{}", f"{cw}.function.arguments")
        calls.append(m.tool_call(c.string("id") or f"call_{j}", name, args))
    return m.assistant(content, reasoning, calls)


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
        fn = as_object(t.raw("function"), f"{where}.function")
        tools.append(m.function_tool(fn.raw("name"), fn.raw("description"),
                                     fn.raw("parameters"), where=f"{where}.function"))
    return tools


def apply_tool_choice(tools: list[Tool] | None, choice: Any) -> list[Tool] | None:
    if choice is None or tools is None or choice in ("auto", "required"):
        return tools
    if choice == "none":
        return None
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        return m.tool_named(tools, str(choice["function"].get("name")), "tool_choice")
    if isinstance(choice, dict) and isinstance(choice.get("name"), str):
        return m.tool_named(tools, choice["name"], "tool_choice")
    raise BadRequest("tool_choice must be none, auto, required or a named function",
                     param="tool_choice")


def parse_chat_request(state: ServerState, body: dict[str, Any]) -> tuple[ChatJob, ChatOptions]:
    f = Fields(body)
    check_fields("/v1/chat/completions", body)
    model = f.string("model")
    state.check_model(model)
    if f.has("functions") or f.has("function_call"):
        raise BadRequest("`functions` / `function_call` are deprecated; use tools",
                         param="functions", code="tools_not_supported")
    n = parse_n(f)
    messages = parse_messages(f.array("messages", required=True) or [])
    tools = apply_tool_choice(parse_tools(f), f.raw("tool_choice"))
    output = _output(f, tools)
    stream_opts = f.object("stream_options") or {}
    max_tokens = f.integer("max_completion_tokens", minimum=1)
    if max_tokens is None:
        max_tokens = f.integer("max_tokens", minimum=1)
    params = state.sampling(
        max_tokens,
        stop=f.stop("stop"),
        temperature=f.number("temperature", lo=0.0, hi=2.0),
        top_p=f.number("top_p", lo=0.0, hi=1.0),
        top_k=f.integer("top_k", minimum=0),
        min_p=f.number("min_p", lo=0.0, hi=1.0),
        presence_penalty=f.number("presence_penalty", lo=-2.0, hi=2.0),
        frequency_penalty=f.number("frequency_penalty", lo=-2.0, hi=2.0),
        seed=f.integer("seed", minimum=0, maximum=MAX_SEED),
        ignore_eos=f.boolean("ignore_eos"),
        logprobs=chat_logprobs(f),
        **penalty_fields(f, getattr(state.engine, "valid_vocab", None)),
    )
    effort_thinking, budget = effort_budget(f.raw("reasoning_effort"), "reasoning_effort")
    thinking = f.boolean("enable_thinking")
    if thinking is None:
        kwargs = f.object("chat_template_kwargs") or {}
        unknown = sorted(set(kwargs) - {"enable_thinking"})
        if unknown:
            raise BadRequest(f"chat_template_kwargs.{unknown[0]} is not supported (only "
                             "enable_thinking)", param=f"chat_template_kwargs.{unknown[0]}")
        value = kwargs.get("enable_thinking")
        thinking = value if isinstance(value, bool) else effort_thinking
    if thinking is None:
        thinking = state.config.enable_thinking
    options = ChatOptions(
        model=model or state.model_id,
        stream=bool(f.boolean("stream", False)),
        include_usage=bool(stream_opts.get("include_usage", False)),
        n=n,
        logprobs=params.logprobs is not None,
    )
    return ChatJob(messages, tools, params, thinking, output, n=n, thinking_budget=budget), options


def penalty_fields(f: Fields, vocab: int | None) -> dict[str, Any]:
    """`repetition_penalty` (vLLM's, (0, 2]) and `logit_bias` ({token id below `vocab`: bias
    in [-100, 100]}, OpenAI's), as SamplingParams fields (absent: the server's defaults)."""
    out: dict[str, Any] = {}
    rep = f.number("repetition_penalty", lo=0.0, hi=2.0)
    if rep is not None:
        if rep <= 0.0:
            raise BadRequest("repetition_penalty must be in (0, 2]", param="repetition_penalty")
        out["repetition_penalty"] = rep
    bias = f.object("logit_bias")
    if bias:
        pairs = []
        for key, value in bias.items():
            if not key.isdigit() or isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not -100 <= value <= 100:
                raise BadRequest("logit_bias maps token ids (strings of digits) to numbers in "
                                 f"[-100, 100]; got {key!r}: {value!r}", param="logit_bias")
            if vocab is not None and int(key) >= vocab:
                raise BadRequest(f"logit_bias: token id {key} is outside the vocabulary "
                                 f"(< {vocab})", param="logit_bias")
            pairs.append((int(key), float(value)))
        out["logit_bias"] = tuple(sorted(pairs))
    return out


def parse_n(f: Fields) -> int:
    """`n` choices (1..MAX_N); `best_of` other than 1 / n is refused."""
    n = f.integer("n", 1, minimum=1)
    assert n is not None
    if n > MAX_N:
        raise BadRequest(f"n must be <= {MAX_N}, got {n}", param="n", code="n_not_supported")
    best_of = f.integer("best_of", minimum=1)
    if best_of is not None and best_of != n and best_of != 1:
        raise BadRequest("best_of is not supported (each of the n choices is returned)",
                         param="best_of", code="best_of_not_supported")
    return n


def chat_logprobs(f: Fields) -> int | None:
    """Chat's `logprobs` (bool) + `top_logprobs` (0..20) as the engine's top-k, None when off."""
    top = f.integer("top_logprobs", minimum=0, maximum=MAX_TOP_LOGPROBS)
    if not f.boolean("logprobs", False):
        if top:
            raise BadRequest("top_logprobs needs logprobs: true", param="top_logprobs")
        return None
    return top or 0


def _output(f: Fields, tools: list[Tool] | None) -> OutputRequest | None:
    """`response_format` json_object / json_schema, or calls enforced by `tool_choice`
    required / a named function / `parallel_tool_calls: false`."""
    fmt = f.object("response_format") or {}
    spec = fmt.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    want = json_format(fmt.get("type"), schema, "response_format.json_schema.schema"
                       if fmt.get("type") == "json_schema" else "response_format")
    choice = f.raw("tool_choice")
    forced = choice not in (None, "auto", "none")  # required, or a named function
    parallel = f.boolean("parallel_tool_calls") is not False
    return one_of(want, tools, tool_grammar(tools, "required" if forced else "auto", parallel,
                                     "tool_choice" if forced else "parallel_tool_calls"))
