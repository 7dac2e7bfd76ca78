"""Split model output into reasoning (`<think>…</think>`) and content, streaming or at once.

Rules (the Qwen3.5/3.6 parsers' behaviour):
- `starts_in_reasoning=True` (the prompt ended inside an open `<think>`): output is reasoning
  until `</think>`. Otherwise a `<think>` at the very start of the output (after whitespace)
  opens reasoning; anywhere else tags are plain text, and without it everything is content.
- Newlines right after `<think>` and right before `</think>` are dropped; leading whitespace of
  the content (the "\n\n" after `</think>`) is dropped. Only the first `</think>` switches.
- Output that never closes its reasoning is all reasoning (e.g. cut off by max_tokens).

The streaming splitter holds back only what is undecidable (a partial tag, trailing newlines
that may precede `</think>`), so concatenating its pieces equals `split_reasoning`. It knows
nothing about tool calls.
"""
from __future__ import annotations

from typing import Literal

Channel = Literal["reasoning", "content"]
Piece = tuple[Channel, str]

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


def partial_suffix_len(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def split_reasoning(text: str, starts_in_reasoning: bool) -> tuple[str, str]:
    """(reasoning, content) of a complete output."""
    if starts_in_reasoning:
        body = text
    else:
        stripped = text.lstrip()
        if not stripped.startswith(THINK_OPEN):
            return "", stripped
        body = stripped[len(THINK_OPEN):]
    end = body.find(THINK_CLOSE)
    if end < 0:
        return body.strip("\n"), ""
    return body[:end].strip("\n"), body[end + len(THINK_CLOSE):].lstrip()


class ReasoningSplitter:
    """Streaming `split_reasoning`: `push` text chunks, then `flush` once at the end."""

    def __init__(self, starts_in_reasoning: bool) -> None:
        self._state: Literal["start", "reasoning", "content"] = (
            "reasoning" if starts_in_reasoning else "start"
        )
        self._buf = ""
        self._at_start = True  # nothing emitted yet on the current channel

    def push(self, text: str) -> list[Piece]:
        self._buf += text
        out: list[Piece] = []
        while True:
            before = (self._state, len(self._buf))
            if self._state == "start":
                self._step_start()
            elif self._state == "reasoning":
                self._step_reasoning(out)
            else:
                self._emit_content(self._buf, out)
                self._buf = ""
            if (self._state, len(self._buf)) == before:
                return _merge(out)

    def flush(self) -> list[Piece]:
        out: list[Piece] = []
        if self._state == "reasoning":
            self._emit_reasoning(self._buf.rstrip("\n"), out)
        else:
            self._emit_content(self._buf, out)
        self._buf = ""
        return out

    # ---- states ------------------------------------------------------------------------------
    def _step_start(self) -> None:
        stripped = self._buf.lstrip()
        if not stripped or (len(stripped) < len(THINK_OPEN) and THINK_OPEN.startswith(stripped)):
            return  # undecided: whitespace or a partial "<think>"
        if stripped.startswith(THINK_OPEN):
            self._buf = stripped[len(THINK_OPEN):]
            self._state = "reasoning"
        else:
            self._state = "content"
        self._at_start = True

    def _step_reasoning(self, out: list[Piece]) -> None:
        end = self._buf.find(THINK_CLOSE)
        if end >= 0:
            self._emit_reasoning(self._buf[:end].rstrip("\n"), out)
            self._buf = self._buf[end + len(THINK_CLOSE):]
            self._state = "content"
            self._at_start = True
            return
        hold = partial_suffix_len(self._buf, THINK_CLOSE)
        ready = self._buf[: len(self._buf) - hold]
        ready_trimmed = ready.rstrip("\n")  # newlines may turn out to precede </think>
        self._emit_reasoning(ready_trimmed, out)
        self._buf = self._buf[len(ready_trimmed):]

    def _emit_reasoning(self, text: str, out: list[Piece]) -> None:
        if self._at_start:
            text = text.lstrip("\n")
        if text:
            out.append(("reasoning", text))
            self._at_start = False

    def _emit_content(self, text: str, out: list[Piece]) -> None:
        if self._at_start:
            text = text.lstrip()
        if text:
            out.append(("content", text))
            self._at_start = False


def _merge(pieces: list[Piece]) -> list[Piece]:
    merged: list[Piece] = []
    for kind, text in pieces:
        if merged and merged[-1][0] == kind:
            merged[-1] = (kind, merged[-1][1] + text)
        else:
            merged.append((kind, text))
    return merged
