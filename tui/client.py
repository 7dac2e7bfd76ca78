"""The `EngineClient` protocol the app talks to, and the error every client raises.

Two implementations: `tui.inprocess.InProcessClient` (owns an LLM on one engine thread)
and `tui.http_client.HttpClient` (a running ninfer-serve). The app sees only `ModelInfo`,
`EngineStats` and a `Turn` of typed events; it never touches an LLM or a socket.
"""
from __future__ import annotations

from typing import Any, Protocol

from .events import EngineStats, ModelInfo
from .settings import ChatSettings
from .sysmon import SystemProbe
from .turn import Turn


class ClientError(Exception):
    """A backend problem the user can act on (load failure, server down). One line."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class EngineClient(Protocol):
    remote: bool
    """True when the engine runs elsewhere (a server), so local probes don't describe it."""

    @property
    def description(self) -> str:
        """Where the engine is: 'in-process: MODEL' or the server URL. Known before start."""
        ...

    async def start(self) -> ModelInfo:
        """Load the model / reach the server. Raises ClientError; may be retried."""
        ...

    def chat(self, messages: list[dict[str, Any]], settings: ChatSettings) -> Turn:
        """Start one generation. Must be called from the event loop."""
        ...

    async def stats(self) -> EngineStats:
        """Engine-side numbers now; fields the backend can't tell stay None. Never raises."""
        ...

    def system_probe(self) -> SystemProbe:
        """The probe matching where the engine runs (local NVML/psutil, or nothing)."""
        ...

    async def close(self) -> None: ...
