"""`PromptArea`: the multi-line prompt. Enter sends, Shift+Enter or Ctrl+J inserts a newline,
and `?` on an empty prompt opens the help screen (otherwise it types a '?').

Posts `PromptArea.Submitted`; knows nothing about what happens to the text.
"""
from __future__ import annotations

from dataclasses import dataclass

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

    BINDINGS = [
        Binding("enter", "submit", "Send", priority=True),
        Binding("shift+enter,ctrl+j", "newline", "Newline", show=False, priority=True),
        Binding("question_mark", "help", "Help", show=False, priority=True),
    ]

    @dataclass
    class Submitted(Message):
        """The user pressed Enter on a non-empty prompt."""

        prompt: PromptArea
        text: str

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, soft_wrap=True, show_line_numbers=False, tab_behavior="focus")
        self.border_title = "Message  (Enter send · Shift+Enter/Ctrl+J newline · ? help)"

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # '?' is help only on an empty prompt; returning False lets the key type a '?'
        if action == "help":
            return not self.text
        return True

    async def action_help(self) -> None:
        await self.app.run_action("help")

    def action_submit(self) -> None:
        text = self.text.strip()
        if text:
            self.post_message(self.Submitted(self, text))

    def action_newline(self) -> None:
        self.insert("\n")
