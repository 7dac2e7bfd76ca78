"""`ChatCommands`: a command-palette Provider offering the slash commands.

Commands without arguments run at once; those that need one put the command into the
prompt for the user to finish. The provider only calls the two methods of `SlashHost`.
"""
from __future__ import annotations

from functools import partial
from typing import Protocol, cast

from textual.command import DiscoveryHit, Hit, Hits, Provider

from .commands import COMMANDS


class SlashHost(Protocol):
    def run_slash(self, text: str) -> None: ...

    def prefill_prompt(self, text: str) -> None: ...


def palette_entries() -> list[tuple[str, str, str, bool]]:
    """(title, help, text, runs_now) for every palette entry."""
    out: list[tuple[str, str, str, bool]] = []
    for c in COMMANDS:
        if c.name == "think":
            out.append(("/think on", "let the model reason before answering", "/think on", True))
            out.append(("/think off", "answer without reasoning", "/think off", True))
        elif c.args.startswith("<"):
            out.append((f"/{c.name} {c.args}", c.help, f"/{c.name} ", False))
        elif c.name in ("system", "save"):
            out.append((f"/{c.name} {c.args}", c.help, f"/{c.name} ", False))
            if c.name == "save":
                out.append(("/save", "save the transcript to the data folder", "/save", True))
        else:
            out.append((f"/{c.name}", c.help, f"/{c.name}", True))
    return out


class ChatCommands(Provider):
    def _run(self, text: str, now: bool) -> None:
        host = cast(SlashHost, self.app)
        if now:
            host.run_slash(text)
        else:
            host.prefill_prompt(text)

    async def discover(self) -> Hits:
        for title, help_text, text, now in palette_entries():
            yield DiscoveryHit(title, partial(self._run, text, now), help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, help_text, text, now in palette_entries():
            score = matcher.match(title + " " + help_text)
            if score > 0:
                run = partial(self._run, text, now)
                yield Hit(score, matcher.highlight(title), run, help=help_text)
