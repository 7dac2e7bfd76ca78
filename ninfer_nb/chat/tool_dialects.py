"""Tool-call dialects: which syntax a model writes its calls in, chosen from its chat template.

- `qwen_xml` (Qwen3.5 / 3.6, Qwen3-Coder): `<tool_call><function=f><parameter=k>v</parameter>…`
- `hermes_json` (Qwen2.5, Qwen3, Hermes): `<tool_call>{"name": …, "arguments": {…}}</tool_call>`
- `llama3_json` (Llama 3.1 / 3.2 / 3.3): `{"name": …, "parameters": {…}}`, optionally after
  `<|python_tag|>`

A template is matched by the text it instructs the model with (`template_markers`); one that
matches none (or no template at all) gets `qwen_xml`, the engine's native models' dialect.
Each dialect makes a fresh streaming parser per generation (`push` content text, `flush` once);
`parse` runs one over a whole text, so streamed and whole-text results agree by construction.
This module knows nothing about reasoning or wire formats.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from ninfer_nb.chat.json_tool_calls import PYTHON_TAG, LlamaJsonStreamParser, parse_hermes_block
from ninfer_nb.chat.messages import ChatDelta, ToolCall
from ninfer_nb.chat.tool_calls import CALL_OPEN, ToolCallStreamParser

__all__ = [
    "DEFAULT_DIALECT",
    "DIALECTS",
    "HERMES_JSON",
    "LLAMA3_JSON",
    "QWEN_XML",
    "ToolCallDialect",
    "ToolCallParser",
    "detect_dialect",
    "get_dialect",
]


class ToolCallParser(Protocol):
    def push(self, text: str) -> list[ChatDelta]: ...

    def flush(self) -> list[ChatDelta]: ...


@dataclass(frozen=True)
class ToolCallDialect:
    name: str
    call_markers: tuple[str, ...]  # what opens a call in the output (for grammars, detection)
    template_markers: tuple[str, ...]  # any of these in a chat template selects the dialect
    make_parser: Callable[[list[dict] | None], ToolCallParser]

    def stream_parser(self, tools: list[dict] | None = None) -> ToolCallParser:
        return self.make_parser(tools)

    def parse(self, text: str, tools: list[dict] | None = None) -> tuple[str, list[ToolCall]]:
        """(content without the parsed calls, calls) of a complete content string."""
        parser = self.make_parser(tools)
        deltas = parser.push(text) + parser.flush()
        content = "".join(d.text for d in deltas if d.kind == "content")
        return content, [d.tool_call for d in deltas if d.tool_call is not None]

    def __repr__(self) -> str:
        return f"ToolCallDialect({self.name!r})"


def _hermes_parser(tools: list[dict] | None) -> ToolCallParser:
    return ToolCallStreamParser(tools, parse_block=parse_hermes_block, close_at_end=True)


QWEN_XML = ToolCallDialect("qwen_xml", (CALL_OPEN,), ("<function=",), ToolCallStreamParser)
HERMES_JSON = ToolCallDialect("hermes_json", (CALL_OPEN,), (CALL_OPEN,), _hermes_parser)
LLAMA3_JSON = ToolCallDialect(
    "llama3_json", (PYTHON_TAG, "{"), (PYTHON_TAG, "ipython"), LlamaJsonStreamParser
)
DEFAULT_DIALECT = QWEN_XML
# Detection order: the XML and Hermes templates both mention `<tool_call>`; only XML has
# `<function=`. A template that asks for `<tool_call>` tags wins over Llama markers.
DIALECTS: dict[str, ToolCallDialect] = {d.name: d for d in (QWEN_XML, HERMES_JSON, LLAMA3_JSON)}


def detect_dialect(chat_template: str | None) -> ToolCallDialect:
    """The dialect whose markers the template contains first in `DIALECTS` order, else XML."""
    if chat_template:
        for dialect in DIALECTS.values():
            if any(marker in chat_template for marker in dialect.template_markers):
                return dialect
    return DEFAULT_DIALECT


def get_dialect(dialect: ToolCallDialect | str | None) -> ToolCallDialect:
    """A dialect, its name, or None (the default) → the dialect; unknown names raise KeyError."""
    if dialect is None:
        return DEFAULT_DIALECT
    if isinstance(dialect, ToolCallDialect):
        return dialect
    if dialect not in DIALECTS:
        raise KeyError(f"unknown tool-call dialect {dialect!r}; known: {', '.join(DIALECTS)}")
    return DIALECTS[dialect]
