"""Small waiting helpers for Pilot tests: poll a condition while the app keeps running."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from textual.pilot import Pilot


async def wait_for(pilot: Pilot[None], cond: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s; {_describe(pilot)}")
        await pilot.pause(0.02)
        await asyncio.sleep(0)


def _describe(pilot: Pilot[None]) -> str:
    """What the app looked like when a wait timed out (state line, focus, notes)."""
    app = pilot.app
    notes = [getattr(w, "text", "") for w in app.query("NoteMessage")]
    conv = getattr(app, "conversation", None)
    roles = [m.role for m in conv.messages] if conv is not None else None
    return (f"state={getattr(app, 'state', '?')!r} focused={app.focused!r} "
            f"workers={[(w.name, str(w.state)) for w in app.workers]} messages={roles} "
            f"app_exception={getattr(app, '_exception', None)!r} notes={notes}")


async def type_text(pilot: Pilot[None], text: str) -> None:
    """Type `text` into the focused widget, key by key (spaces included)."""
    keys = ["space" if ch == " " else ch for ch in text]
    await pilot.press(*keys)
