"""`RateMeter`: decode tokens/s over a sliding window of recent tokens, throttled ticks.

Used by both clients to turn "a token arrived" into occasional `TokenTick`s for the
sparkline. Takes timestamps from the caller, so it is deterministic under test.
"""
from __future__ import annotations

from collections import deque

from .events import TokenTick


class RateMeter:
    def __init__(self, window: int = 16, min_interval_s: float = 0.2) -> None:
        self._times: deque[float] = deque(maxlen=window)
        self._last_tick = float("-inf")
        self._min_interval = min_interval_s
        self.tokens = 0

    def add(self, n: int, now: float) -> TokenTick | None:
        """Record `n` tokens at time `now`; returns a tick when one is due."""
        self.tokens += n
        for _ in range(n):
            self._times.append(now)
        if now - self._last_tick < self._min_interval and self.tokens > n:
            return None
        self._last_tick = now
        return TokenTick(self.tokens, self.rate())

    def rate(self) -> float:
        if len(self._times) < 2:
            return 0.0
        span = self._times[-1] - self._times[0]
        return (len(self._times) - 1) / span if span > 0 else 0.0
