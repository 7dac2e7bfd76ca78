"""Chat message widgets: the user's prompt, the assistant's streamed answer (collapsible
reasoning, Markdown content, tool calls, a timings footer) and info/error notes.

Deltas are buffered and flushed on a short timer (`FLUSH_S`) into Textual's `MarkdownStream`,
which coalesces further when the widget falls behind, so a fast engine never makes the UI
re-parse per token; `finish()` replaces the streamed document with one full render so the
final Markdown is exactly what a full parse gives. Knows nothing about engines or storage.
"""
from __future__ import annotations

import asyncio
import json

from textual.containers import Vertical
from textual.widgets import Collapsible, Markdown, Static
from textual.widgets.markdown import MarkdownStream

from ..events import ToolCall


class UserMessage(Static):
    DEFAULT_CSS = """
    UserMessage {
        margin: 1 0 0 4;
        padding: 0 1;
        background: $primary 15%;
        border-left: thick $primary;
    }
    UserMessage.not-sent { border-left: thick $error; color: $text-muted; }
    """

    def __init__(self, text: str) -> None:
        super().__init__(text, markup=False)
        self.text = text


class NoteMessage(Static):
    """Something the app says (model info, errors, help): not part of the conversation."""

    DEFAULT_CSS = """
    NoteMessage { margin: 1 0 0 0; padding: 0 1; color: $text-muted; border-left: thick $accent; }
    NoteMessage.error { color: $error; border-left: thick $error; }
    """

    def __init__(self, text: str, *, error: bool = False) -> None:
        super().__init__(text, markup=False, classes="error" if error else "")
        self.text = text


def tool_call_text(call: ToolCall) -> str:
    try:
        args = json.dumps(json.loads(call.arguments), ensure_ascii=False)
    except (json.JSONDecodeError, TypeError):
        args = call.arguments
    return f"⚙ tool call  {call.name}({args})"


FLUSH_S = 1 / 30


class AssistantMessage(Vertical):
    DEFAULT_CSS = """
    AssistantMessage { height: auto; margin: 1 0 0 0; }
    AssistantMessage Collapsible { padding: 0; margin: 0; border: none; background: transparent; }
    AssistantMessage Collapsible Contents { padding: 0 0 0 2; }
    AssistantMessage .reasoning { color: $text-muted; margin: 0; }
    AssistantMessage .content { margin: 0; padding: 0 1 0 1; }
    AssistantMessage .tool-call { color: $warning; padding: 0 1; }
    AssistantMessage .footer { color: $text-muted; padding: 0 1; text-style: italic; }
    AssistantMessage .footer.error { color: $error; text-style: bold; }
    """

    def __init__(
        self,
        *,
        content: str = "",
        reasoning: str = "",
        tool_calls: tuple[ToolCall, ...] = (),
        footer: str = "",
    ) -> None:
        super().__init__()
        self.content = content
        self.reasoning = reasoning
        self.tool_calls: list[ToolCall] = list(tool_calls)
        self.footer_text = footer
        self._reasoning_box = Collapsible(
            title="Reasoning", collapsed=bool(content), classes="reasoning-box"
        )
        self._reasoning_md = Markdown(reasoning, classes="reasoning")
        self._content_md = Markdown(content, classes="content")
        self._footer = Static(footer, markup=False, classes="footer")
        self._reasoning_stream: MarkdownStream | None = None
        self._content_stream: MarkdownStream | None = None
        self._pending_reasoning = ""
        self._pending_content = ""
        self._flush_scheduled = False

    def compose(self):  # type: ignore[no-untyped-def]
        with self._reasoning_box:
            yield self._reasoning_md
        yield self._content_md
        for call in self.tool_calls:
            yield Static(tool_call_text(call), markup=False, classes="tool-call")
        yield self._footer

    def on_mount(self) -> None:
        self._reasoning_box.display = bool(self.reasoning)
        self._footer.display = bool(self.footer_text)

    def append_reasoning(self, text: str) -> None:
        if not self.reasoning:
            self._reasoning_box.display = True
            self._reasoning_box.title = "Reasoning…"
        self.reasoning += text
        self._pending_reasoning += text
        self._schedule_flush()

    def append_content(self, text: str) -> None:
        if not self.content and self.reasoning:
            self._reasoning_box.collapsed = True   # thinking is over: fold it away
            self._reasoning_box.title = "Reasoning"
        self.content += text
        self._pending_content += text
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.set_timer(FLUSH_S, self._flush)

    async def _flush(self) -> None:
        self._flush_scheduled = False
        reasoning, content = self._pending_reasoning, self._pending_content
        self._pending_reasoning = self._pending_content = ""
        if reasoning:
            if self._reasoning_stream is None:
                self._reasoning_stream = Markdown.get_stream(self._reasoning_md)
            await self._reasoning_stream.write(reasoning)
        if content:
            if self._content_stream is None:
                self._content_stream = Markdown.get_stream(self._content_md)
            await self._content_stream.write(content)

    async def add_tool_call(self, call: ToolCall) -> None:
        self.tool_calls.append(call)
        await self.mount(Static(tool_call_text(call), markup=False, classes="tool-call"),
                         before=self._footer)

    async def finish(self, footer: str, *, error: bool = False) -> None:
        """End streaming: one full render of both documents, then show the footer."""
        self._pending_reasoning = self._pending_content = ""
        for stream in (self._reasoning_stream, self._content_stream):
            if stream is not None:
                await _stop_stream(stream)
        self._reasoning_stream = self._content_stream = None
        if self.reasoning:
            self._reasoning_box.title = "Reasoning"
            await self._reasoning_md.update(self.reasoning)
        await self._content_md.update(self.content)
        self.footer_text = footer
        self._footer.update(footer)
        self._footer.set_class(error, "error")
        self._footer.display = bool(footer)


async def _stop_stream(stream: MarkdownStream) -> None:
    """`MarkdownStream.stop()` cancels its task and awaits it; when a flush created the stream
    just before the answer ended, that task is cancelled before it first ran and the await
    raises CancelledError here although nobody cancelled us (seen as a turn that never ended).
    That one is swallowed (the full text is rendered right after); our own cancellation is not."""
    try:
        await stream.stop()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and getattr(task, "cancelling", lambda: 0)():   # 3.11+
            raise
