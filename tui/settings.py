"""Immutable settings: how the app was started (`TuiConfig`) and how the chat samples
(`ChatSettings`, replaced wholesale when a slash command changes it).

Knows nothing about Textual, the engine or HTTP. Validation of ranges lives here so slash
commands, the palette and the command line all report the same message.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path


class SettingError(ValueError):
    """A user-supplied setting is out of range; the message is shown as is."""


@dataclass(frozen=True, slots=True)
class ChatSettings:
    system: str = ""
    temperature: float = 0.7
    top_p: float = 1.0
    max_tokens: int = 1024
    thinking: bool = True
    seed: int | None = None

    def with_temperature(self, value: float) -> ChatSettings:
        if not 0.0 <= value <= 2.0:
            raise SettingError(f"temperature must be in [0, 2], got {value}")
        return replace(self, temperature=value)

    def with_top_p(self, value: float) -> ChatSettings:
        if not 0.0 < value <= 1.0:
            raise SettingError(f"top_p must be in (0, 1], got {value}")
        return replace(self, top_p=value)

    def with_max_tokens(self, value: int) -> ChatSettings:
        if value < 1:
            raise SettingError(f"max_tokens must be >= 1, got {value}")
        return replace(self, max_tokens=value)

    def with_thinking(self, on: bool) -> ChatSettings:
        return replace(self, thinking=on)

    def with_system(self, text: str) -> ChatSettings:
        return replace(self, system=text)

    def status(self) -> str:
        """The compact one-line form used by the status bar."""
        think = "on" if self.thinking else "off"
        sys = " · system ✓" if self.system else ""
        return (
            f"temp {self.temperature:g} · top_p {self.top_p:g} · "
            f"max {self.max_tokens} · think {think}{sys}"
        )


@dataclass(frozen=True, slots=True)
class TuiConfig:
    """How ninfer-tui was started. Exactly one of in-process (`model`) or `url` mode."""

    data_dir: Path
    model: str | None = None                # None + url None = the engine's default model
    url: str | None = None
    api_key: str | None = None
    device: str = "auto"
    max_context: int = 4096
    prefill_chunk: int = 1024
    chat: ChatSettings = ChatSettings()
    perf_interval_s: float = 1.0            # 0 disables periodic stats polling (tests)
    show_perf: bool = True
    show_history: bool = False
    cursor_blink: bool = True

    @property
    def remote(self) -> bool:
        return self.url is not None
