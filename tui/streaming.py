"""`stream_turn`: feed one `Turn`'s events into an `AssistantMessage` and report the outcome.

The only place that interprets a generation's events for display. Perf updates go out
through a callback so this module does not know the panel exists.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .conversation import Message
from .events import (
    ContentDelta,
    Done,
    Failed,
    ReasoningDelta,
    StatsUpdate,
    TokenTick,
    ToolCallDelta,
    TurnTimings,
)
from .turn import Turn
from .widgets.messages import AssistantMessage

OnTick = Callable[[TokenTick], None]

_FINISH_NOTES = {
    "length": "stopped at max_tokens",
    "cancelled": "cancelled",
    "tool_calls": "tool call",
}


@dataclass(frozen=True, slots=True)
class TurnOutcome:
    message: Message | None          # what to add to the conversation (None: nothing usable)
    finish_reason: str               # stop | length | cancelled | tool_calls | error
    timings: TurnTimings | None = None
    error: str | None = None


def footer_for(reason: str, timings: TurnTimings) -> str:
    note = _FINISH_NOTES.get(reason)
    summary = timings.summary()
    return " · ".join(p for p in (note, summary) if p)


async def stream_turn(turn: Turn, widget: AssistantMessage, on_tick: OnTick) -> TurnOutcome:
    async for ev in turn:
        if isinstance(ev, ReasoningDelta):
            widget.append_reasoning(ev.text)
        elif isinstance(ev, ContentDelta):
            widget.append_content(ev.text)
        elif isinstance(ev, ToolCallDelta):
            await widget.add_tool_call(ev.call)
        elif isinstance(ev, TokenTick):
            on_tick(ev)
        elif isinstance(ev, StatsUpdate):
            continue
        elif isinstance(ev, Done):
            footer = footer_for(ev.finish_reason, ev.timings)
            await widget.finish(footer)
            msg = Message(
                "assistant",
                widget.content,
                widget.reasoning,
                tuple(widget.tool_calls),
                footer,
            )
            return TurnOutcome(msg, ev.finish_reason, ev.timings)
        elif isinstance(ev, Failed):
            await widget.finish(f"⚠ {ev.message}", error=True)
            kept = bool(widget.content or widget.tool_calls)
            kept_msg = (
                Message("assistant", widget.content, widget.reasoning, tuple(widget.tool_calls),
                        f"⚠ {ev.message}")
                if kept
                else None
            )
            return TurnOutcome(kept_msg, "error", None, ev.message)
    await widget.finish("⚠ the answer ended unexpectedly", error=True)
    return TurnOutcome(None, "error", None, "the answer ended unexpectedly")
