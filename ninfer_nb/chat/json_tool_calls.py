"""Parse JSON tool calls: Hermes blocks (Qwen2.5 / Qwen3) and Llama 3.x bare JSON calls.

Hermes: `<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>`; the block framing is
`ToolCallStreamParser`'s, this module reads the inside (`parse_hermes_block`).
Llama 3.x: the assistant's output is `{"name": "f", "parameters": {...}}`, optionally after
`<|python_tag|>`, several calls separated by `;` or whitespace (`LlamaJsonStreamParser`).

A call is a JSON object with a non-empty string "name" and its arguments under "arguments" or
"parameters" (an object, or a JSON string holding one). Arguments keep the JSON types the model
wrote; no schema typing. Anything else, malformed JSON included, stays content verbatim.
Nothing here raises on model output; nothing here knows about reasoning.
"""
from __future__ import annotations

import json
import re
from typing import Any, Literal

from ninfer_nb.chat.messages import ChatDelta, ToolCall, new_tool_call_id
from ninfer_nb.chat.reasoning import partial_suffix_len

__all__ = ["PYTHON_TAG", "LlamaJsonStreamParser", "call_from_json", "parse_hermes_block"]

PYTHON_TAG = "<|python_tag|>"
_ARGUMENT_KEYS = ("arguments", "parameters")
# A bare JSON object is taken for a call only when its first key is one of these.
_CALL_FIRST_KEYS = frozenset({"name", "type", "function", *_ARGUMENT_KEYS})
_FIRST_KEY = re.compile(r'\{\s*"([^"\\]*)"')
_FIRST_KEY_PENDING = re.compile(r'\{\s*(?:"[^"\\]*)?\Z')
_CALL_SEPARATORS = " \t\r\n;"
_WHITESPACE = " \t\r\n"


def _reject_constant(name: str) -> Any:
    raise ValueError(name)  # NaN / Infinity are not JSON


def _loads(text: str) -> tuple[bool, Any]:
    try:
        return True, json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return False, None


def call_from_json(obj: Any, *, require_arguments: bool = False) -> ToolCall | None:
    """A `ToolCall` from a decoded JSON value, None when it is not a call.

    Accepts `{"name", "arguments" | "parameters"}` and the OpenAI-like
    `{"type": "function", "function": {...}}`; `require_arguments` rejects objects without an
    arguments key (a bare `{"name": "Bob"}` answer is not a call).
    """
    if not isinstance(obj, dict):
        return None
    if "name" not in obj and isinstance(obj.get("function"), dict):
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    key = next((k for k in _ARGUMENT_KEYS if k in obj), None)
    if key is None and require_arguments:
        return None
    args = obj.get(key) if key is not None else None
    if args is None:
        args = {}
    elif isinstance(args, str):  # arguments written as a JSON string
        ok, args = _loads(args) if args.strip() else (True, {})
        if not ok:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(id=new_tool_call_id(), name=name.strip(), arguments=args)


def parse_hermes_block(inner: str, tools: list[dict] | None = None) -> ToolCall | None:
    """Parse the text between `<tool_call>` and `</tool_call>` as one JSON call; None if not."""
    ok, obj = _loads(inner.strip())
    return call_from_json(obj) if ok else None


class _JsonObjectEnd:
    """Finds the end of a JSON object starting at index 0 of a growing buffer, scanning each
    character once (strings and escapes respected; brackets only counted, not matched)."""

    def __init__(self) -> None:
        self._pos = 0
        self._depth = 0
        self._in_string = False
        self._escape = False

    def find(self, text: str) -> int | None:
        """Index just past the object's closing brace, None while it is still open."""
        for i in range(self._pos, len(text)):
            c = text[i]
            if self._in_string:
                if self._escape:
                    self._escape = False
                elif c == "\\":
                    self._escape = True
                elif c == '"':
                    self._in_string = False
            elif c == '"':
                self._in_string = True
            elif c in "{[":
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self._pos = i + 1
                    return i + 1
        self._pos = len(text)
        return None


Mode = Literal["boundary", "object", "text"]


class LlamaJsonStreamParser:
    """Push content text; get content and tool_call deltas (Llama 3.x JSON calls).

    A call may start only at a boundary: the start of the content, right after a call, or right
    after `<|python_tag|>`; a `{` anywhere else is text. Held back: whitespace at a boundary, a
    partial `<|python_tag|>`, and an open object until it closes or its first key shows it is
    no call. Whitespace and `;` between calls are dropped, as is whitespace before a tag or a
    call; a tag not followed by a call stays in the content.
    """

    def __init__(self, tools: list[dict] | None = None) -> None:
        self.tools = tools
        self._mode: Mode = "boundary"
        self._buf = ""  # text not yet decided (in "object" mode: the object so far)
        self._pending = ""  # "<|python_tag|>" (and whitespace before it) held at a boundary
        self._fallback = ""  # what precedes an open object in the content if it is no call
        self._end = _JsonObjectEnd()
        self._first_key_ok = False
        self._after_call = False

    def push(self, text: str) -> list[ChatDelta]:
        self._buf += text
        out: list[ChatDelta] = []
        while self._step(out):
            pass
        return out

    def flush(self) -> list[ChatDelta]:
        out: list[ChatDelta] = []
        if self._mode == "object":
            self._content(self._fallback + self._buf, out)
        elif self._mode == "boundary" and self._after_call and not self._pending:
            self._content(self._buf.lstrip(_CALL_SEPARATORS), out)
        else:
            self._content(self._pending + self._buf, out)
        self._buf = self._pending = self._fallback = ""
        self._mode = "boundary"
        return out

    def _step(self, out: list[ChatDelta]) -> bool:
        """Advance once; False when nothing more can be decided yet."""
        if self._mode == "boundary":
            return self._step_boundary(out)
        if self._mode == "object":
            return self._step_object(out)
        return self._step_text(out)

    def _step_boundary(self, out: list[ChatDelta]) -> bool:
        seps = _CALL_SEPARATORS if self._after_call and not self._pending else _WHITESPACE
        rest = self._buf.lstrip(seps)
        skipped = self._buf[: len(self._buf) - len(rest)]
        if rest.startswith("{"):
            self._fallback = self._pending + skipped
            self._pending, self._buf = "", rest
            self._mode, self._end, self._first_key_ok = "object", _JsonObjectEnd(), False
            return True
        if rest.startswith(PYTHON_TAG):
            if self._pending:  # a second tag: the first one was followed by nothing
                self._content(self._pending + skipped, out)
            self._pending, self._buf = PYTHON_TAG, rest[len(PYTHON_TAG):]
            return True
        if not rest or PYTHON_TAG.startswith(rest):
            return False
        keep_skipped = bool(self._pending) or not self._after_call
        self._content(self._pending + (skipped if keep_skipped else ""), out)
        self._pending, self._buf, self._mode = "", rest, "text"
        return True

    def _step_object(self, out: list[ChatDelta]) -> bool:
        if not self._first_key_ok:
            match = _FIRST_KEY.match(self._buf)
            if match is None and _FIRST_KEY_PENDING.match(self._buf):
                return False
            if match is None or match.group(1) not in _CALL_FIRST_KEYS:
                return self._not_a_call(0, out)  # the text mode reads on from the `{`
            self._first_key_ok = True
        end = self._end.find(self._buf)
        if end is None:
            return False
        ok, obj = _loads(self._buf[:end])
        call = call_from_json(obj, require_arguments=True) if ok else None
        if call is None:
            return self._not_a_call(end, out)
        out.append(ChatDelta("tool_call", tool_call=call))
        self._buf, self._fallback = self._buf[end:], ""
        self._mode, self._after_call = "boundary", True
        return True

    def _not_a_call(self, end: int, out: list[ChatDelta]) -> bool:
        """The object is no call: its held prefix and its first `end` characters are content."""
        self._content(self._fallback + self._buf[:end], out)
        self._buf, self._fallback, self._mode = self._buf[end:], "", "text"
        return True

    def _step_text(self, out: list[ChatDelta]) -> bool:
        tag = self._buf.find(PYTHON_TAG)
        if tag >= 0:
            body = self._buf[:tag].rstrip()
            self._content(body, out)
            self._pending = self._buf[len(body):tag] + PYTHON_TAG
            self._buf, self._mode = self._buf[tag + len(PYTHON_TAG):], "boundary"
            return True
        hold = partial_suffix_len(self._buf, PYTHON_TAG)
        ready = self._buf[: len(self._buf) - hold].rstrip()  # whitespace may precede a tag
        self._content(ready, out)
        self._buf = self._buf[len(ready):]
        return False

    def _content(self, text: str, out: list[ChatDelta]) -> None:
        if not text:
            return
        self._after_call = False
        if out and out[-1].kind == "content":
            out[-1].text += text
        else:
            out.append(ChatDelta("content", text))
