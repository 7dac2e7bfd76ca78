"""Snapshot tests of the main screens at 80×24 (pytest-textual-snapshot).

Deterministic by construction: the scripted client supplies fixed events, timings, engine
stats and host numbers; the real-engine screen is taken before any generation, with the
monitor (live CPU/RAM numbers) hidden and the model behind a fixed name.
Update with `pytest tests/tui/test_snapshots.py --snapshot-update` after checking the SVGs.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from textual.pilot import Pilot

from ninfer_nb.tui.conversation import Conversation, Message
from ninfer_nb.tui.store import HistoryStore
from ninfer_nb.tui.widgets.prompt import PromptArea

from .conftest import MakeApp
from .helpers import wait_for
from .scripted import ScriptedClient
from .test_app_scripted import THINK_AND_CALL


async def _settle(pilot: Pilot[None]) -> None:
    """Let every worker finish (make_app already turned the cursor blink off)."""
    await pilot.app.workers.wait_for_complete()
    await pilot.pause(0.1)


def test_chat_with_reasoning_tool_call_and_monitor(snap_compare: Any, make_app: MakeApp) -> None:
    app = make_app(ScriptedClient([THINK_AND_CALL]))

    async def run_before(pilot: Pilot[None]) -> None:
        await wait_for(pilot, lambda: app.info is not None)
        app.query_one(PromptArea).insert("What's the weather in Paris?")
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.conversation.messages) == 2)
        await _settle(pilot)

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


def test_help_screen(snap_compare: Any, make_app: MakeApp) -> None:
    app = make_app(ScriptedClient([THINK_AND_CALL]))

    async def run_before(pilot: Pilot[None]) -> None:
        await _settle(pilot)
        await pilot.press("f1")
        await pilot.pause(0.1)

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


def test_history_sidebar(snap_compare: Any, make_app: MakeApp, data_dir: Path) -> None:
    store = HistoryStore(data_dir)
    for title in ("Rust lifetimes", "Paris weather", "Sourdough starter"):
        store.save(Conversation(title=title, messages=[Message("user", title)]))
    store.close()
    app = make_app(ScriptedClient([THINK_AND_CALL]), show_perf=False)

    async def run_before(pilot: Pilot[None]) -> None:
        await wait_for(pilot, lambda: app.info is not None)
        await pilot.press("ctrl+b", "down", "enter")
        await wait_for(pilot, lambda: app.conversation.title == "Paris weather")
        await pilot.press("ctrl+b", "ctrl+b")
        await _settle(pilot)

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


def test_in_process_engine_ready(
    snap_compare: Any, make_app: MakeApp, tiny_model_dir: Path, tmp_path: Path
) -> None:
    fixed = tmp_path / "tiny-model"
    fixed.symlink_to(tiny_model_dir, target_is_directory=True)
    app = make_app(model=fixed, show_perf=False)

    async def run_before(pilot: Pilot[None]) -> None:
        await wait_for(pilot, lambda: app.info is not None, timeout=60)
        await _settle(pilot)

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)
