"""The race behind a TUI turn that never ended: Textual's MarkdownStream.stop() cancels its
task and awaits it, so a stream stopped before its task first ran raises CancelledError into
the caller (our turn worker) although nobody cancelled the caller. `_stop_stream` absorbs
exactly that case and still lets a real cancellation of the caller through."""
from __future__ import annotations

import asyncio

import pytest
from textual.widgets import Markdown
from textual.widgets.markdown import MarkdownStream

from ninfer_nb.tui.widgets.messages import _stop_stream


async def test_stopping_a_stream_before_its_task_ran_is_not_our_cancellation() -> None:
    stream = MarkdownStream(Markdown())
    stream.start()                        # task created, not yet run
    with pytest.raises(asyncio.CancelledError):
        await stream.stop()               # Textual as is: the race this guards against
    stream = MarkdownStream(Markdown())
    stream.start()
    await _stop_stream(stream)            # absorbed: the turn goes on to render and finish


async def test_a_real_cancellation_still_propagates() -> None:
    class SlowStop:                       # a stop() that is still running when we are cancelled
        async def stop(self) -> None:
            await asyncio.sleep(10)

    task = asyncio.create_task(_stop_stream(SlowStop()))  # type: ignore[arg-type]
    await asyncio.sleep(0)                # now inside stop()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
