"""`HistoryList`: the sidebar of saved conversations. Enter opens one, `d`/Delete deletes it.

Shows what it is given; reading and writing the database is the app's job.
"""
from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding
from textual.message import Message
from textual.widgets import OptionList
from textual.widgets.option_list import Option, OptionDoesNotExist

from ..store import ConversationSummary


class HistoryList(OptionList):
    DEFAULT_CSS = """
    HistoryList { width: 26; height: 1fr; border-right: vkey $primary 40%; }
    """

    BINDINGS = [Binding("d,delete", "delete", "Delete chat")]

    @dataclass
    class Open(Message):
        conversation_id: int

    @dataclass
    class Delete(Message):
        conversation_id: int

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "History"

    def set_items(self, items: list[ConversationSummary], current: int | None) -> None:
        self.clear_options()
        if not items:
            self.add_option(Option("(no saved chats)", id="none", disabled=True))
            return
        self.add_options(Option(s.title, id=str(s.id)) for s in items)
        self.highlighted = 0
        if current is not None:
            try:
                self.highlighted = self.get_option_index(str(current))
            except OptionDoesNotExist:  # the current chat is not saved yet
                return

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option_id and event.option_id.isdigit():
            self.post_message(self.Open(int(event.option_id)))

    def action_delete(self) -> None:
        opt = self.highlighted_option
        if opt is not None and opt.id and opt.id.isdigit():
            self.post_message(self.Delete(int(opt.id)))
