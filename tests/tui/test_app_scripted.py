"""Pilot tests with a scripted client, where exact events are needed: reasoning and tool-call
rendering, mid-stream failure, the command palette and the help key."""
from __future__ import annotations

from textual.command import CommandPalette
from textual.widgets import Collapsible

from ninfer_nb.tui.events import (
    ContentDelta,
    Done,
    Failed,
    ReasoningDelta,
    TokenTick,
    ToolCall,
    ToolCallDelta,
    TurnTimings,
)
from ninfer_nb.tui.screens.help import HelpScreen
from ninfer_nb.tui.widgets.messages import AssistantMessage, NoteMessage, UserMessage
from ninfer_nb.tui.widgets.perf import PerfPanel
from ninfer_nb.tui.widgets.prompt import PromptArea

from .conftest import MakeApp
from .helpers import wait_for
from .scripted import ScriptedClient

SIZE = (80, 24)
THINK_AND_CALL = [
    ReasoningDelta("The user wants **weather**."),
    ReasoningDelta(" I should call the tool."),
    ContentDelta("Checking the weather:\n\n```python\nprint('hi')\n```\n"),
    ToolCallDelta(ToolCall("call_1", "get_weather", '{"city": "Paris"}')),
    TokenTick(5, 40.0),
    Done("tool_calls", TurnTimings(20, 0, 9, 0.05, 400.0, 40.0)),
]


async def test_reasoning_collapses_and_tool_calls_render(make_app: MakeApp) -> None:
    client = ScriptedClient([THINK_AND_CALL])
    app = make_app(client)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.info is not None)
        app.query_one(PromptArea).insert("weather in Paris?")
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.conversation.messages) == 2)
        await pilot.pause()
        msg = app.query_one(AssistantMessage)
        box = msg.query_one(Collapsible)
        assert box.display and box.collapsed and box.title == "Reasoning"
        assert msg.reasoning == "The user wants **weather**. I should call the tool."
        calls = msg.query(".tool-call")
        assert len(calls) == 1 and "get_weather" in str(calls.first().render())
        answer = app.conversation.messages[1]
        assert answer.tool_calls == (ToolCall("call_1", "get_weather", '{"city": "Paris"}'),)
        assert answer.footer.startswith("tool call · TTFT 50 ms")
        # expanding the folded reasoning shows it
        await pilot.click(box.query_one("CollapsibleTitle"))
        await wait_for(pilot, lambda: not box.collapsed)
        # the next request carries the tool call back in OpenAI form
        app.query_one(PromptArea).focus()
        app.query_one(PromptArea).insert("thanks")
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(client.requests) == 2)
        sent = client.requests[1][0]
        assert sent[1]["tool_calls"][0]["function"]["name"] == "get_weather"


async def test_failure_mid_stream_keeps_conversation(make_app: MakeApp) -> None:
    ok = [ContentDelta("first answer"), Done("stop")]
    broken = [Failed("lost the connection to the server at http://x")]
    app = make_app(ScriptedClient([ok, broken, ok]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.info is not None)
        prompt = app.query_one(PromptArea)
        prompt.insert("one")
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.conversation.messages) == 2)
        prompt.insert("two")
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.state.startswith("error"))
        assert "lost the connection" in app.state
        assert [m.content for m in app.conversation.messages] == ["one", "first answer"]
        assert prompt.text == "two"                     # given back for a retry
        footer = app.query(AssistantMessage).last().query_one(".footer")
        assert footer.has_class("error") and "lost the connection" in str(footer.render())
        assert app.query(UserMessage).last().has_class("not-sent")
        await pilot.press("enter")                      # retry works
        await wait_for(pilot, lambda: len(app.conversation.messages) == 4)
        assert app.state == "ready"


async def test_command_palette_runs_slash_commands(make_app: MakeApp) -> None:
    app = make_app(ScriptedClient([[Done("stop")]]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.info is not None)
        await pilot.press("ctrl+p")
        await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette))
        for ch in "think off":
            await pilot.press("space" if ch == " " else ch)
        await pilot.pause(0.3)
        await pilot.press("enter")
        await wait_for(pilot, lambda: not app.settings.thinking)
        # commands that need a value are put into the prompt to finish
        await pilot.press("ctrl+p")
        await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette))
        for ch in "/temp":
            await pilot.press(ch)
        await pilot.pause(0.3)
        await pilot.press("enter")
        prompt = app.query_one(PromptArea)
        await wait_for(pilot, lambda: prompt.text == "/temp ")
        await pilot.press("1")
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.settings.temperature == 1.0)
        assert "temperature = 1" in app.query(NoteMessage).last().text


async def test_question_mark_opens_help_only_on_empty_prompt(make_app: MakeApp) -> None:
    app = make_app(ScriptedClient([[Done("stop")]]))
    async with app.run_test(size=SIZE) as pilot:
        prompt = app.query_one(PromptArea)
        await pilot.press("w", "h", "y", "question_mark")
        assert prompt.text == "why?" and not isinstance(app.screen, HelpScreen)
        prompt.clear()
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, HelpScreen))
        await pilot.press("f1")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))


async def test_live_ticks_feed_the_sparkline(make_app: MakeApp) -> None:
    ticks = [TokenTick(i, float(10 + i)) for i in range(1, 6)]
    app = make_app(ScriptedClient([[ContentDelta("x"), *ticks, Done("stop")]]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.info is not None)
        app.query_one(PromptArea).insert("go")
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.conversation.messages) == 2)
        view = app.query_one(PerfPanel).view
        assert list(view.history) == [11.0, 12.0, 13.0, 14.0, 15.0]
        assert list(app.query_one("#tok-spark").data) == [11.0, 12.0, 13.0, 14.0, 15.0]  # type: ignore[attr-defined]


async def test_resizes_cleanly(make_app: MakeApp) -> None:
    app = make_app(ScriptedClient([THINK_AND_CALL]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.info is not None)
        app.query_one(PromptArea).insert("hi")
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.conversation.messages) == 2)
        for w, h in [(60, 18), (120, 40), (80, 24)]:
            await pilot.resize_terminal(w, h)
            await pilot.pause(0.05)
            prompt = app.query_one(PromptArea).region
            status = app.query_one("#status").region
            assert app.screen.size == (w, h)
            assert prompt.right <= w and prompt.bottom <= h - 2 and prompt.height >= 3
            assert status.y == h - 2 and status.width == w
