"""`PromptArea`: the multi-line prompt. Enter sends, Shift+Enter or Ctrl+J inserts a newline,
and `?` on an empty prompt opens the help screen (otherwise it types a '?').

Posts `PromptArea.Submitted`; knows nothing about what happens to the text.
"""
from __future__ import annotations

from dataclasses import dataclass

from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.widgets import TextArea


class PromptArea(TextArea):
    DEFAULT_CSS = """
    PromptArea {
        height: auto;
        min-height: 3;
        max-height: 8;
        border: round $primary 50%;
        padding: 0 1;
    }
    PromptArea:focus { border: round $primary; }
    """

    # Display only: the keys are handled in `on_key`, in order with the typed text, because
    # bindings run when the key reaches the app, before earlier keys have reached the widget.
    BINDINGS = [
        Binding("enter", "submit", "Send"),
        Binding("shift+enter,ctrl+j", "newline", "Newline", show=False),
    ]

    @dataclass
    class Submitted(Message):
        """The user pressed Enter on a non-empty prompt."""

        prompt: PromptArea
        text: str

    def __init__(self, *, id: str | None = None, cursor_blink: bool = True) -> None:
        super().__init__(id=id, soft_wrap=True, show_line_numbers=False, tab_behavior="focus")
        self.cursor_blink = cursor_blink
        self.border_title = "Enter send · Shift+Enter newline · ? help"

    async def on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            self.action_submit()
        elif event.key in ("shift+enter", "ctrl+j"):
            self.action_newline()
        elif event.key == "question_mark" and not self.text:
            await self.app.run_action("help")
        else:
            return
        event.stop()
        event.prevent_default()

    def action_submit(self) -> None:
        text = self.text.strip()
        if text:
            self.post_message(self.Submitted(self, text))

    def action_newline(self) -> None:
        self.insert("\n")
