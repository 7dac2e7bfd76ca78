"""`StatusLine`: one line under the prompt with the model, the chat settings and the state."""
from __future__ import annotations

from textual.widgets import Static


class StatusLine(Static):
    DEFAULT_CSS = """
    StatusLine { height: 1; padding: 0 1; background: $panel; color: $text-muted; }
    StatusLine.error { color: $error; }
    StatusLine.busy { color: $warning; }
    """

    def set_status(self, model: str, settings: str, state: str) -> None:
        self.update(f"{model} │ {settings} │ {state}")
        self.set_class(state.startswith("error") or state.startswith("offline"), "error")
        self.set_class(state.startswith("generating") or state.startswith("loading"), "busy")
