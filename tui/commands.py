"""Slash commands: the table of what exists, and a parser from prompt text to a typed command.

Parsing only; applying a command is the app's job. The same table feeds /help, the help
screen and the command palette, so all three always agree.
"""
from __future__ import annotations

from dataclasses import dataclass

from .settings import SettingError


@dataclass(frozen=True, slots=True)
class CommandSpec:
    name: str
    args: str
    help: str


COMMANDS: tuple[CommandSpec, ...] = (
    CommandSpec("system", "[text]", "set the system prompt (no text: clear it)"),
    CommandSpec("temp", "<0..2>", "set the sampling temperature (0 = greedy)"),
    CommandSpec("top_p", "<0..1>", "set nucleus sampling top_p"),
    CommandSpec("max_tokens", "<n>", "set the maximum reply length in tokens"),
    CommandSpec("think", "on|off", "turn the model's reasoning on or off"),
    CommandSpec("clear", "", "start a new, empty conversation"),
    CommandSpec("save", "[path]", "save the transcript as Markdown"),
    CommandSpec("model", "", "show information about the model"),
    CommandSpec("perf", "", "show or hide the performance monitor"),
    CommandSpec("history", "", "show or hide the conversation list"),
    CommandSpec("help", "", "list commands and key bindings"),
)


@dataclass(frozen=True, slots=True)
class SetSystem:
    text: str


@dataclass(frozen=True, slots=True)
class SetTemperature:
    value: float


@dataclass(frozen=True, slots=True)
class SetTopP:
    value: float


@dataclass(frozen=True, slots=True)
class SetMaxTokens:
    value: int


@dataclass(frozen=True, slots=True)
class SetThinking:
    on: bool | None                 # None = toggle


@dataclass(frozen=True, slots=True)
class Clear:
    pass


@dataclass(frozen=True, slots=True)
class Save:
    path: str | None


@dataclass(frozen=True, slots=True)
class ShowModel:
    pass


@dataclass(frozen=True, slots=True)
class TogglePerf:
    pass


@dataclass(frozen=True, slots=True)
class ToggleHistory:
    pass


@dataclass(frozen=True, slots=True)
class ShowHelp:
    pass


Command = (
    SetSystem | SetTemperature | SetTopP | SetMaxTokens | SetThinking | Clear | Save | ShowModel
    | TogglePerf | ToggleHistory | ShowHelp
)


def is_command(text: str) -> bool:
    """A prompt is a command when it starts with '/' followed by a letter ('//' escapes)."""
    return len(text) > 1 and text[0] == "/" and text[1].isalpha()


def _number(name: str, arg: str) -> float:
    try:
        return float(arg)
    except ValueError:
        raise SettingError(f"/{name} needs a number, got {arg!r}") from None


def parse(text: str) -> Command:
    """Parse one slash command; raises SettingError with a user-facing message."""
    head, _, rest = text.strip()[1:].partition(" ")
    name, arg = head.lower(), rest.strip()
    if name == "system":
        return SetSystem(arg)
    if name in ("temp", "temperature"):
        if not arg:
            raise SettingError("usage: /temp <0..2>")
        return SetTemperature(_number("temp", arg))
    if name == "top_p":
        if not arg:
            raise SettingError("usage: /top_p <0..1>")
        return SetTopP(_number("top_p", arg))
    if name == "max_tokens":
        try:
            return SetMaxTokens(int(arg))
        except ValueError:
            raise SettingError(f"usage: /max_tokens <n> (got {arg!r})") from None
    if name == "think":
        word = arg.lower()
        if word in ("", "toggle"):
            return SetThinking(None)
        if word in ("on", "true", "1", "yes"):
            return SetThinking(True)
        if word in ("off", "false", "0", "no"):
            return SetThinking(False)
        raise SettingError(f"usage: /think on|off (got {arg!r})")
    simple: dict[str, Command] = {
        "clear": Clear(),
        "new": Clear(),
        "model": ShowModel(),
        "perf": TogglePerf(),
        "history": ToggleHistory(),
        "help": ShowHelp(),
    }
    if name in simple:
        return simple[name]
    if name == "save":
        return Save(arg or None)
    raise SettingError(f"unknown command /{name} — try /help")


def help_text() -> str:
    width = max(len(f"/{c.name} {c.args}") for c in COMMANDS)
    return "\n".join(f"/{c.name} {c.args}".ljust(width + 2) + c.help for c in COMMANDS)
