"""`ChatLog`: the scrolling column of messages. Stays pinned to the bottom while an answer
streams, unless the user scrolls up (Textual's anchor).

Mounts and clears widgets only; it does not own the conversation data.
"""
from __future__ import annotations

from textual.containers import VerticalScroll

from ..conversation import Conversation
from .messages import AssistantMessage, NoteMessage, UserMessage


class ChatLog(VerticalScroll):
    DEFAULT_CSS = """
    ChatLog { height: 1fr; padding: 0 1 1 1; }
    """

    async def add_user(self, text: str) -> UserMessage:
        w = UserMessage(text)
        await self.mount(w)
        self.anchor()
        return w

    async def add_assistant(self) -> AssistantMessage:
        w = AssistantMessage()
        await self.mount(w)
        self.anchor()
        return w

    async def add_note(self, text: str, *, error: bool = False) -> NoteMessage:
        w = NoteMessage(text, error=error)
        await self.mount(w)
        self.anchor()
        return w

    async def show(self, conv: Conversation) -> None:
        """Replace everything with `conv`'s messages."""
        await self.remove_children()
        widgets = [
            UserMessage(m.content)
            if m.role == "user"
            else AssistantMessage(
                content=m.content, reasoning=m.reasoning, tool_calls=m.tool_calls, footer=m.footer
            )
            for m in conv.messages
        ]
        if widgets:
            await self.mount_all(widgets)
        self.anchor()
