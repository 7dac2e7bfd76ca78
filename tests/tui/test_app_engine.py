"""Pilot tests on the real in-process engine (tiny random Qwen3.5 checkpoint, CPU backend).

Random weights produce gibberish, so these assert streaming, cancellation, panels, commands
and history behaviour, never the text itself.
"""
from __future__ import annotations

import re
from pathlib import Path

from ninfer_nb.tui.settings import ChatSettings
from ninfer_nb.tui.widgets.chat_log import ChatLog
from ninfer_nb.tui.widgets.messages import AssistantMessage, NoteMessage, UserMessage
from ninfer_nb.tui.widgets.perf import PerfPanel
from ninfer_nb.tui.widgets.prompt import PromptArea

from .conftest import GREEDY, MakeApp
from .helpers import type_text, wait_for

SIZE = (80, 24)


async def test_send_streams_answer_and_continues_conversation(
    make_app: MakeApp, tiny_model_dir: Path
) -> None:
    app = make_app(model=tiny_model_dir)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.info is not None)
        assert app.info is not None and app.info.device == "cpu"
        prompt = app.query_one(PromptArea)
        await type_text(pilot, "hi there")
        await pilot.press("shift+enter")
        await type_text(pilot, "second line")
        assert prompt.text == "hi there\nsecond line"
        await pilot.press("enter")
        assert prompt.text == ""
        await wait_for(pilot, lambda: len(app.conversation.messages) == 2)
        user, answer = app.conversation.messages
        assert user.content == "hi there\nsecond line"
        widget = app.query_one(AssistantMessage)
        # the tiny model thinks first; whatever it streamed is on screen and in the record
        assert (answer.reasoning + answer.content).strip()
        assert widget.reasoning == answer.reasoning and widget.content == answer.content
        assert "tok/s" in answer.footer
        last = app.query_one(PerfPanel).view.last
        assert last is not None and last.completion_tokens == GREEDY.max_tokens
        # second turn: the whole history goes back to the engine
        prompt.insert("and again")
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.conversation.messages) == 4)
        assert len(app.query(AssistantMessage)) == 2
        last = app.query_one(PerfPanel).view.last
        assert last is not None and (last.prompt_tokens or 0) > 24


async def test_follow_up_turn_reuses_the_shared_prefix(
    make_app: MakeApp, tiny_llama_model_dir: Path
) -> None:
    app = make_app(model=tiny_llama_model_dir)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.info is not None)
        for n, text in enumerate(["first question", "second question"], start=1):
            app.query_one(PromptArea).insert(text)
            await pilot.press("enter")
            await wait_for(pilot, lambda n=n: len(app.conversation.messages) == 2 * n)
        last = app.query_one(PerfPanel).view.last
        assert last is not None and last.prompt_tokens is not None
        assert 0 < (last.cached_tokens or 0) < last.prompt_tokens
        assert "cached" in app.conversation.messages[3].footer


async def test_escape_cancels_generation_at_once(make_app: MakeApp, tiny_model_dir: Path) -> None:
    app = make_app(model=tiny_model_dir, chat=ChatSettings(temperature=0.0, max_tokens=3000))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.info is not None)
        app.query_one(PromptArea).insert("tell me a long story")
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.turn is not None and app.query(AssistantMessage)
                       and bool(app.query_one(AssistantMessage).reasoning))
        await pilot.press("escape")
        await wait_for(pilot, lambda: len(app.conversation.messages) == 2, timeout=2.0)
        answer = app.conversation.messages[1]
        assert answer.footer.startswith("cancelled")
        assert app.turn is None and app.state == "ready"
        # the engine let go: a new turn runs to completion
        app.settings = GREEDY
        app.query_one(PromptArea).insert("short one")
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.conversation.messages) == 4)
        assert "cancelled" not in app.conversation.messages[3].footer


async def test_perf_panel_toggles_and_shows_engine_numbers(
    make_app: MakeApp, tiny_model_dir: Path
) -> None:
    app = make_app(model=tiny_model_dir, perf_interval_s=0.1)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.info is not None)
        panel = app.query_one(PerfPanel)
        await wait_for(pilot, lambda: panel.region.width > 0, timeout=30)
        app.query_one(PromptArea).insert("hello")
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.conversation.messages) == 2)
        await wait_for(pilot, lambda: (panel.view.engine.context_tokens or 0) > 0)
        rows = dict(_rows(panel))
        assert rows["device"] == "cpu"
        assert rows["spec acc"] == "off"
        # the in-process engine's lanes: requests running / waiting, rows per decode round
        assert re.fullmatch(r"\d+ run · \d+ wait · B \d+\.\d", rows["batch"]), rows["batch"]
        assert re.fullmatch(r"\d+%", rows["prefix hit"]), rows["prefix hit"]
        assert rows["context"].split("/")[1].startswith("4096")
        assert "tok/s" in rows["decode"] and "ms" in rows["TTFT"]
        assert "CPU" in rows and "RAM" in rows   # psutil on the CPU backend
        assert rows["GPU"]                        # a name or why it is unavailable
        await pilot.press("f2")
        await wait_for(pilot, lambda: panel.region.width == 0, timeout=30)
        assert not app.screen.has_class("-show-perf")
        await pilot.press("f2")
        await wait_for(pilot, lambda: panel.region.width > 0, timeout=30)


def _rows(panel: PerfPanel) -> list[tuple[str, str]]:
    from ninfer_nb.tui.widgets.perf import perf_rows

    return perf_rows(panel.view)


async def test_slash_commands(make_app: MakeApp, tiny_model_dir: Path, tmp_path: Path) -> None:
    app = make_app(model=tiny_model_dir)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.info is not None)
        prompt = app.query_one(PromptArea)

        async def run(text: str) -> str:
            before = len(app.query(NoteMessage))
            prompt.focus()
            prompt.insert(text)
            await pilot.press("enter")
            await wait_for(pilot, lambda: len(app.query(NoteMessage)) > before or not prompt.text)
            await pilot.pause()
            notes = app.query(NoteMessage)
            return notes.last().text if len(notes) > before else ""

        assert "temperature = 0.3" in await run("/temp 0.3")
        assert app.settings.temperature == 0.3
        assert "top_p = 0.9" in await run("/top_p 0.9")
        assert "max_tokens = 8" in await run("/max_tokens 8")
        assert (app.settings.top_p, app.settings.max_tokens) == (0.9, 8)
        assert "thinking off" in await run("/think off")
        assert app.settings.thinking is False
        assert "System prompt set" in await run("/system You are terse.")
        assert app.settings.system == "You are terse."
        status = str(app.query_one("#status").render())
        assert "temp 0.3" in status and "think off" in status and "max 8" in status
        bad = await run("/temp 7")
        assert "temperature must be in [0, 2]" in bad and app.settings.temperature == 0.3
        assert "unknown command" in await run("/frobnicate")
        info = await run("/model")
        assert "architecture" in info and "qwen3_5" in info and "cpu" in info
        # the system prompt and settings reach the engine: a greedy 8-token reply
        prompt.insert("hello")
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.conversation.messages) == 2)
        last = app.query_one(PerfPanel).view.last
        assert last is not None and last.completion_tokens == 8
        target = tmp_path / "out" / "chat.md"
        assert str(target) in await run(f"/save {target}")
        text = target.read_text()
        assert text.startswith("# hello") and "## User" in text and "You are terse." in text
        assert "## Assistant" in text
        default_note = await run("/save")
        assert (app.config.data_dir / "transcripts") .as_posix() in default_note
        await run("/perf")
        assert not app.screen.has_class("-show-perf")
        await run("/history")
        assert app.screen.has_class("-show-history")
        await run("/help")
        await wait_for(pilot, lambda: app.screen.__class__.__name__ == "HelpScreen")
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen.__class__.__name__ != "HelpScreen")
        await run("/clear")
        assert app.conversation.messages == [] and not app.query(UserMessage)


async def test_history_persists_reloads_and_deletes(
    make_app: MakeApp, tiny_model_dir: Path
) -> None:
    app = make_app(model=tiny_model_dir)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.info is not None)
        app.query_one(PromptArea).insert("remember me")
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.conversation.messages) == 2)
        saved = list(app.conversation.messages)
        conv_id = app.conversation.id
        assert conv_id is not None
    # a fresh app (new process in real life) on the same data folder
    app = make_app(model=tiny_model_dir)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.info is not None)
        await pilot.press("ctrl+b")
        history = app.query_one("#history")
        assert history.has_focus
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.conversation.id == conv_id)
        assert app.conversation.messages == saved
        assert app.conversation.title == "remember me"
        log = app.query_one(ChatLog)
        assert [w.text for w in log.query(UserMessage)] == ["remember me"]
        assert log.query_one(AssistantMessage).content == saved[1].content
        # continue the reloaded chat
        app.query_one(PromptArea).insert("more")
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.conversation.messages) == 4)
        assert app.store.load(conv_id) is not None
        assert len(app.store.load(conv_id).messages) == 4  # type: ignore[union-attr]
        history.focus()
        await pilot.press("d")
        await wait_for(pilot, lambda: app.store.list() == [])
        assert app.conversation.messages == [] and app.conversation.id is None


async def test_failed_model_load_is_shown_and_app_stays_usable(
    make_app: MakeApp, tmp_path: Path
) -> None:
    app = make_app(model=tmp_path / "no-such-model")
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(app.query(NoteMessage)) == 1)
        note = app.query_one(NoteMessage)
        assert "could not load model" in note.text and note.has_class("error")
        assert app.state.startswith("error")
        prompt = app.query_one(PromptArea)
        prompt.insert("are you there?")
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.query(NoteMessage)) == 2)
        # nothing was lost: the prompt is back for editing, the context holds no dead turn
        assert prompt.text == "are you there?"
        assert app.conversation.messages == []
        assert app.query_one(UserMessage).has_class("not-sent")
        assert "No model loaded" in (await _slash(app, pilot, "/model"))


async def _slash(app, pilot, text: str) -> str:  # type: ignore[no-untyped-def]
    prompt = app.query_one(PromptArea)
    prompt.clear()
    before = len(app.query(NoteMessage))
    prompt.insert(text)
    await pilot.press("enter")
    await wait_for(pilot, lambda: len(app.query(NoteMessage)) > before)
    return app.query(NoteMessage).last().text
