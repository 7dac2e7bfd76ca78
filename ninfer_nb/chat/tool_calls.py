"""Parse Qwen3.5/3.6 XML tool calls out of assistant content, streaming or at once.

Format: `<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n…</function>
\\n</tool_call>`. A block runs from `<tool_call>` to the first `</tool_call>`. A block that
parses becomes a `ToolCall` and the whitespace around it is dropped from the content; a block
that does not parse, or is never closed, stays in the content verbatim. Nothing here raises
on model output.

Parameter values lose one leading and one trailing newline, then are typed by the tool's JSON
schema when known (integer/number/boolean/null/object/array parsed where valid, else kept as a
string; "string" kept verbatim); without a schema a value is JSON if it parses, else a string.
This module knows nothing about reasoning (`reasoning.py` runs first).
"""
from __future__ import annotations

import ast
import json
import re
from typing import Any, Callable

from ninfer_nb.chat.messages import ChatDelta, ToolCall, new_tool_call_id
from ninfer_nb.chat.reasoning import partial_suffix_len

__all__ = [
    "BlockParser",
    "ToolCall",
    "ToolCallStreamParser",
    "parse_tool_call_block",
    "parse_tool_calls",
]

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*)</function>\s*\Z", re.DOTALL)
_PARAM_OPEN = "<parameter="
_PARAM_CLOSE = "</parameter>"

BlockParser = Callable[[str, list[dict] | None], ToolCall | None]  # (block inside, tools)


# ---- schema lookup and value typing --------------------------------------------------------------
def _param_types(tools: list[dict] | None, name: str) -> dict[str, Any] | None:
    """{param: schema} for tool `name` (OpenAI, flat or Anthropic tool shapes), None if unknown."""
    for tool in tools or ():
        if not isinstance(tool, dict):
            continue
        function = tool.get("function")
        fn: dict = function if isinstance(function, dict) else tool
        if fn.get("name") != name:
            continue
        schema = fn.get("parameters") or fn.get("input_schema") or {}
        props = schema.get("properties") if isinstance(schema, dict) else None
        return props if isinstance(props, dict) else {}
    return None


def _schema_types(schema: Any) -> list[str]:
    if not isinstance(schema, dict):
        return []
    kind = schema.get("type")
    if isinstance(kind, str):
        return [kind]
    if isinstance(kind, list):
        return [k for k in kind if isinstance(k, str)]
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return [t for sub in schema[key] for t in _schema_types(sub)]
    return []


def _reject_constant(name: str) -> Any:
    raise ValueError(name)  # NaN / Infinity are not JSON values worth trusting


def _json(value: str) -> tuple[bool, Any]:
    try:
        return True, json.loads(value, parse_constant=_reject_constant)
    except ValueError:
        return False, None


def _as_type(value: str, kind: str) -> tuple[bool, Any]:
    text = value.strip()
    if kind == "string":
        return True, value
    if kind == "null":
        return (True, None) if text.lower() in ("null", "none") else (False, None)
    if kind == "boolean":
        low = text.lower()
        return (True, low == "true") if low in ("true", "false") else (False, None)
    if kind in ("integer", "number"):
        ok, parsed = _json(text)
        if not ok or isinstance(parsed, bool) or not isinstance(parsed, (int, float)):
            return False, None
        if kind == "integer":
            if isinstance(parsed, float):
                return (True, int(parsed)) if parsed.is_integer() else (False, None)
        return True, parsed
    if kind in ("object", "array"):
        want = dict if kind == "object" else list
        ok, parsed = _json(text)
        if not ok:
            try:
                parsed = ast.literal_eval(text)  # models sometimes write Python literals
            except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
                return False, None
        return (True, parsed) if isinstance(parsed, want) else (False, None)
    return False, None


def convert_value(value: str, schema: Any) -> Any:
    """Type one raw parameter value by its JSON schema (None → untyped)."""
    kinds = _schema_types(schema)
    if not kinds:
        ok, parsed = _json(value.strip())
        return parsed if ok else value
    # Try the strict types first; "string" (verbatim) is the fallback.
    for kind in sorted(kinds, key=lambda k: k == "string"):
        ok, parsed = _as_type(value, kind)
        if ok:
            return parsed
    return value


# ---- one block ---------------------------------------------------------------------------------------
def _strip_one_newline(value: str) -> str:
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def parse_tool_call_block(inner: str, tools: list[dict] | None = None) -> ToolCall | None:
    """Parse the text between `<tool_call>` and `</tool_call>`; None when malformed."""
    match = _FUNCTION.match(inner)
    if match is None:
        return None
    name = match.group(1).strip()
    body = match.group(2)
    if not name or _PARAM_OPEN in name:
        return None
    raw: dict[str, str] = {}
    pos = 0
    while True:
        start = body.find(_PARAM_OPEN, pos)
        if start < 0:
            if body[pos:].strip():
                return None  # stray text between parameters
            break
        if body[pos:start].strip():
            return None
        name_end = body.find(">", start)
        if name_end < 0:
            return None
        key = body[start + len(_PARAM_OPEN):name_end].strip()
        if not key or "\n" in key:
            return None
        close = body.find(_PARAM_CLOSE, name_end)
        if close < 0:  # the last parameter may lack its closing tag
            raw[key] = _strip_one_newline(body[name_end + 1:])
            break
        raw[key] = _strip_one_newline(body[name_end + 1:close])
        pos = close + len(_PARAM_CLOSE)
    props = _param_types(tools, name)
    args = {k: convert_value(v, props.get(k) if props else None) for k, v in raw.items()}
    return ToolCall(id=new_tool_call_id(), name=name, arguments=args)


# ---- whole text -----------------------------------------------------------------------------------
def parse_tool_calls(text: str, tools: list[dict] | None = None) -> tuple[str, list[ToolCall]]:
    """(content without the parsed calls, calls) of a complete assistant content string."""
    content: list[str] = []
    calls: list[ToolCall] = []
    after_call = False
    pos = 0
    while True:
        start = text.find(CALL_OPEN, pos)
        if start < 0:
            break
        before = text[pos:start]
        if after_call:
            before = before.lstrip()
        end = text.find(CALL_CLOSE, start + len(CALL_OPEN))
        if end < 0:
            content.append(before)
            pos = start
            after_call = False
            break
        call = parse_tool_call_block(text[start + len(CALL_OPEN):end], tools)
        stop = end + len(CALL_CLOSE)
        if call is None:
            content.append(before + text[start:stop])
            after_call = False
        else:
            content.append(before.rstrip())
            calls.append(call)
            after_call = True
        pos = stop
    tail = text[pos:]
    content.append(tail.lstrip() if after_call else tail)
    return "".join(content), calls


# ---- streaming ----------------------------------------------------------------------------------
class ToolCallStreamParser:
    """Streaming `parse_tool_calls`: content streams at once, each finished call is one delta.

    Held back: a possible partial `<tool_call>` and the whitespace before it (dropped if a call
    follows), and the text of an open block until its `</tool_call>` arrives. `parse_block`
    reads a block's inside (default: the XML one above; the Hermes JSON dialect passes its own);
    `close_at_end` lets `flush` accept a final block whose `</tool_call>` never came.
    """

    def __init__(
        self,
        tools: list[dict] | None = None,
        *,
        parse_block: BlockParser | None = None,
        close_at_end: bool = False,
    ) -> None:
        self.tools = tools
        self._parse_block = parse_block or parse_tool_call_block
        self._close_at_end = close_at_end  # flush may parse a block never closed
        self._buf = ""  # outside a block: undecided tail; inside: the block's text so far
        self._inside = False
        self._ws = ""  # whitespace held before an open block
        self._after_call = False

    def push(self, text: str) -> list[ChatDelta]:
        self._buf += text
        out: list[ChatDelta] = []
        while self._step(out):
            pass
        return out

    def flush(self) -> list[ChatDelta]:
        out: list[ChatDelta] = []
        unclosed = self._inside and self._close_at_end
        call = self._parse_block(self._buf, self.tools) if unclosed else None
        if call is not None:
            out.append(ChatDelta("tool_call", tool_call=call))
            self._after_call = True
        elif self._inside:
            self._content(self._ws + CALL_OPEN + self._buf, out)
        else:
            self._content(self._buf, out)
        self._buf, self._ws, self._inside = "", "", False
        return out

    def _step(self, out: list[ChatDelta]) -> bool:
        """Advance once; False when nothing more can be decided yet."""
        if self._inside:
            end = self._buf.find(CALL_CLOSE)
            if end < 0:
                return False
            call = self._parse_block(self._buf[:end], self.tools)
            if call is None:
                self._content(self._ws + CALL_OPEN + self._buf[: end + len(CALL_CLOSE)], out)
            else:
                out.append(ChatDelta("tool_call", tool_call=call))
                self._after_call = True
            self._buf = self._buf[end + len(CALL_CLOSE):]
            self._ws, self._inside = "", False
            return True
        start = self._buf.find(CALL_OPEN)
        if start >= 0:
            before = self._buf[:start]
            body = before.rstrip()
            self._content(body, out)
            self._ws = before[len(body):] if not (self._after_call and not body) else ""
            self._buf = self._buf[start + len(CALL_OPEN):]
            self._inside = True
            return True
        hold = partial_suffix_len(self._buf, CALL_OPEN)
        ready = self._buf[: len(self._buf) - hold].rstrip()
        self._content(ready, out)
        self._buf = self._buf[len(ready):]
        return False

    def _content(self, text: str, out: list[ChatDelta]) -> None:
        if self._after_call:
            text = text.lstrip()
        if text:
            self._after_call = False
            if out and out[-1].kind == "content":
                out[-1].text += text
            else:
                out.append(ChatDelta("content", text))
