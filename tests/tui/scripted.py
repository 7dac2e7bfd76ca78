"""A scripted EngineClient for tests that need exact events (reasoning, tool calls, timings).

Every turn replays the next script from `scripts` (the last one repeats); `delay_s` spaces the
events so cancellation can land mid-stream. Its probe reports fixed numbers.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from ninfer_nb.tui.client import ClientError
from ninfer_nb.tui.events import ChatEvent, EngineStats, ModelInfo
from ninfer_nb.tui.settings import ChatSettings
from ninfer_nb.tui.sysmon import GpuStats, SystemStats
from ninfer_nb.tui.turn import Turn


class FixedProbe:
    def __init__(self, stats: SystemStats) -> None:
        self.stats = stats

    def sample(self) -> SystemStats:
        return self.stats

    def close(self) -> None:
        return None


FIXED_SYSTEM = SystemStats(
    gpu=GpuStats("Test GPU 80GB", 12 << 30, 80 << 30, 42), cpu_percent=12.0,
    rss_bytes=512 << 20, ram_total=16 << 30,
)


class ScriptedClient:
    remote = False

    def __init__(
        self,
        scripts: Sequence[Sequence[ChatEvent]],
        *,
        delay_s: float = 0.0,
        start_error: str | None = None,
        stats: EngineStats | None = None,
    ) -> None:
        self.scripts = [list(s) for s in scripts]
        self.delay_s = delay_s
        self.start_error = start_error
        self.fixed_stats = stats or EngineStats(
            context_tokens=321, max_context=4096, kv_cache_used_bytes=3 << 20,
            kv_cache_bytes=64 << 20, device="cuda:0",
        )
        self.requests: list[tuple[list[dict[str, Any]], ChatSettings]] = []
        self.closed = False

    @property
    def description(self) -> str:
        return "scripted"

    async def start(self) -> ModelInfo:
        if self.start_error is not None:
            raise ClientError(self.start_error)
        return ModelInfo("scripted-model", "in-process", "cuda:0", 4096, (("layers", "2"),))

    def chat(self, messages: list[dict[str, Any]], settings: ChatSettings) -> Turn:
        self.requests.append((messages, settings))
        script = self.scripts[min(len(self.requests) - 1, len(self.scripts) - 1)]
        return Turn(self._replay(script), lambda e: None)

    async def _replay(self, script: list[ChatEvent]) -> AsyncIterator[ChatEvent]:
        for ev in script:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            yield ev

    async def stats(self) -> EngineStats:
        return self.fixed_stats

    def system_probe(self) -> FixedProbe:
        return FixedProbe(FIXED_SYSTEM)

    async def close(self) -> None:
        self.closed = True
