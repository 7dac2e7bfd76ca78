"""`HelpScreen`: key bindings and slash commands in one modal, closed by Esc, q or ?.

Shows the rows it is given, so it cannot drift from the app's real bindings.
"""
from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from ..commands import COMMANDS


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 76; max-width: 100%; height: auto; max-height: 100%;
        border: round $accent; background: $surface; padding: 0 1;
    }
    """

    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close")]

    def __init__(self, keys: list[tuple[str, str]]) -> None:
        super().__init__()
        self.keys = keys

    def compose(self) -> ComposeResult:
        keys = Table.grid(padding=(0, 2))
        keys.add_column(style="bold cyan", no_wrap=True)
        keys.add_column()
        for key, what in self.keys:
            keys.add_row(key, what)
        cmds = Table.grid(padding=(0, 2))
        cmds.add_column(style="bold green", no_wrap=True)
        cmds.add_column()
        for c in COMMANDS:
            cmds.add_row(f"/{c.name} {c.args}".rstrip(), c.help)
        with VerticalScroll() as box:
            box.border_title = "Help  (Esc to close)"
            yield Static("[b]Keys[/b]")
            yield Static(keys)
            yield Static("\n[b]Slash commands[/b]  (type in the prompt, or use Ctrl+P)")
            yield Static(cmds)

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)
