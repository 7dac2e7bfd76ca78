"""Assistant output → reasoning, content and tool calls, streaming or at once.

The reasoning split runs first; tool calls are parsed on the content channel only, in the
given tool-call dialect (`tool_dialects.py`; default: Qwen XML). The streaming parser's deltas,
concatenated per kind, equal `parse_chat_output` of the whole text.
This module knows nothing about tokens; feed it text from `IncrementalDetokenizer`.
"""
from __future__ import annotations

from ninfer_nb.chat.messages import ChatDelta, ChatMessageOut
from ninfer_nb.chat.reasoning import THINK_OPEN, Piece, ReasoningSplitter, split_reasoning
from ninfer_nb.chat.tool_dialects import ToolCallDialect, get_dialect

__all__ = [
    "ChatDelta",
    "ChatMessageOut",
    "ChatStreamParser",
    "parse_chat_output",
    "prompt_opens_reasoning",
]


def prompt_opens_reasoning(prompt_text: str) -> bool:
    """True when the rendered prompt ends inside an open `<think>` (thinking generation prompt)."""
    tail = prompt_text.rstrip()
    return tail.endswith(THINK_OPEN)


def parse_chat_output(
    text: str,
    *,
    starts_in_reasoning: bool,
    tools: list[dict] | None = None,
    dialect: ToolCallDialect | str | None = None,
) -> ChatMessageOut:
    reasoning, content = split_reasoning(text, starts_in_reasoning)
    content, calls = get_dialect(dialect).parse(content, tools)
    return ChatMessageOut(reasoning=reasoning, content=content, tool_calls=calls)


class ChatStreamParser:
    """Push detokenized text; get reasoning / content / tool_call deltas. Call `finish` once."""

    def __init__(
        self,
        *,
        starts_in_reasoning: bool,
        tools: list[dict] | None = None,
        dialect: ToolCallDialect | str | None = None,
    ) -> None:
        self._reasoning = ReasoningSplitter(starts_in_reasoning)
        self._tools = get_dialect(dialect).stream_parser(tools)
        self._finished = False

    def push(self, text: str) -> list[ChatDelta]:
        if self._finished:
            raise RuntimeError("ChatStreamParser.push after finish")
        return self._route(self._reasoning.push(text), final=False)

    def finish(self) -> list[ChatDelta]:
        if self._finished:
            return []
        self._finished = True
        return self._route(self._reasoning.flush(), final=True)

    def _route(self, pieces: list[Piece], *, final: bool) -> list[ChatDelta]:
        out: list[ChatDelta] = []
        for kind, text in pieces:
            if kind == "reasoning":
                _append(out, ChatDelta("reasoning", text))
            else:
                for delta in self._tools.push(text):
                    _append(out, delta)
        if final:
            for delta in self._tools.flush():
                _append(out, delta)
        return out


def _append(out: list[ChatDelta], delta: ChatDelta) -> None:
    """Merge adjacent text deltas of one kind; tool calls always stand alone."""
    if out and delta.kind != "tool_call" and out[-1].kind == delta.kind:
        out[-1].text += delta.text
    else:
        out.append(delta)

