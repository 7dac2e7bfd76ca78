"""Chat templates: render a message list to prompt text with Hugging Face semantics.

Templates run in a sandboxed jinja2 environment configured like transformers'
`apply_chat_template` (trim_blocks, lstrip_blocks, loopcontrols, `raise_exception`,
`strftime_now`, a `tojson` filter that does not HTML-escape). Rendering errors and
`raise_exception(...)` calls become `InvalidRequestError` carrying the template's message.

This module produces text only; it knows nothing about token ids (see `tokenizer.py`).
"""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any, NoReturn

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ninfer_nb.errors import InvalidRequestError

if TYPE_CHECKING:
    from ninfer_nb.chat.tokenizer import Tokenizer

# Plain ChatML, used when a tokenizer ships no template of its own.
DEFAULT_CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- elif message['content'] is iterable %}"
    "{%- for part in message['content'] %}{%- if part['text'] is defined %}{{- part['text'] }}"
    "{%- endif %}{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)


class TemplateError(Exception):
    """Raised by `raise_exception(...)` inside a template."""


def _raise_exception(message: str) -> NoReturn:
    raise TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=32)
def compile_template(template: str) -> jinja2.Template:
    """Compile once per template text (pure function, so caching is safe)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as exc:
        raise InvalidRequestError(f"chat template syntax error: {exc.message} (line {exc.lineno})")


def render_chat(
    template: str,
    messages: list[dict],
    *,
    tools: list[dict] | None = None,
    add_generation_prompt: bool = True,
    enable_thinking: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    **extra: Any,
) -> str:
    """Render `messages` (and `tools`) with `template`; extra keywords reach the template."""
    validate_messages(messages)
    compiled = compile_template(template)
    try:
        return compiled.render(
            messages=messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            enable_thinking=enable_thinking,
            bos_token=bos_token,
            eos_token=eos_token,
            **extra,
        )
    except TemplateError as exc:
        raise InvalidRequestError(str(exc)) from None
    except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError) as exc:
        raise InvalidRequestError(f"chat template failed to render: {exc}") from None


def validate_messages(messages: object) -> None:
    """Minimal shape check: a non-empty list of dicts, each with a string role."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("messages must be a non-empty list")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequestError(f"messages[{i}] must be an object")
        if not isinstance(message.get("role"), str):
            raise InvalidRequestError(f"messages[{i}].role must be a string")


_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


def prepare_messages(messages: list[dict]) -> list[dict]:
    """Adapt client-shaped messages to what chat templates read (copies; input untouched).

    - tool-call `arguments` sent as a JSON string (OpenAI) become a mapping;
    - reasoning sent as `reasoning` or `thinking` is also offered as `reasoning_content`.
    """
    out: list[dict] = []
    for i, message in enumerate(messages):
        reasoning = next((message[k] for k in _REASONING_KEYS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            message = {**message, "tool_calls": [_mapping_arguments(c, i) for c in calls]}
        out.append(message)
    return out


def _mapping_arguments(call: Any, index: int) -> Any:
    fn = call.get("function") if isinstance(call, dict) else None
    if not (isinstance(fn, dict) and isinstance(fn.get("arguments"), str)):
        return call
    text = fn["arguments"]
    try:
        args = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        raise InvalidRequestError(
            f"messages[{index}].tool_calls: function.arguments is not valid JSON"
        ) from None
    if not isinstance(args, dict):
        raise InvalidRequestError(
            f"messages[{index}].tool_calls: function.arguments must be a JSON object"
        )
    return {**call, "function": {**fn, "arguments": args}}


def format_chat(
    tokenizer: Tokenizer,
    messages: list[dict],
    tools: list[dict] | None = None,
    enable_thinking: bool = True,
    add_generation_prompt: bool = True,
    **extra: Any,
) -> str:
    """Render with the tokenizer's own template (ChatML when it has none)."""
    validate_messages(messages)
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
    ):
        raise InvalidRequestError("tools must be a list of objects")
    return render_chat(
        tokenizer.chat_template or DEFAULT_CHATML_TEMPLATE,
        prepare_messages(messages),
        tools=tools or None,
        add_generation_prompt=add_generation_prompt,
        enable_thinking=enable_thinking,
        bos_token=tokenizer.bos_token,
        eos_token=tokenizer.eos_token,
        **extra,
    )


class ChatFormatter:
    """`format_chat` bound to one tokenizer, for callers that prefer an object."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def __call__(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        enable_thinking: bool = True,
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> str:
        return format_chat(
            self.tokenizer, messages, tools, enable_thinking, add_generation_prompt, **extra
        )

    def encode(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        enable_thinking: bool = True,
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> list[int]:
        """Rendered prompt as token ids (the template writes BOS itself where it wants one)."""
        text = self(messages, tools, enable_thinking, add_generation_prompt, **extra)
        return self.tokenizer.encode(text)
