"""A dependency-free progress bar on stderr for long work (loading, pulling, benchmarking).

Draws only when enabled and stderr is a terminal or `force` is set; otherwise prints nothing
(except one final line when `force`). Knows nothing about what is being counted.
"""
from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, label: str, total: float, *, unit: str = "", enabled: bool = True) -> None:
        self.label, self.total, self.unit = label, max(float(total), 1e-9), unit
        self.enabled = enabled
        self.done = 0.0
        self._start = time.perf_counter()
        self._last = 0.0
        self._tty = sys.stderr.isatty()

    def update(self, amount: float = 1.0) -> None:
        self.done += amount
        now = time.perf_counter()
        if self.enabled and self._tty and (now - self._last > 0.1 or self.done >= self.total):
            self._last = now
            self._draw()

    def _draw(self) -> None:
        frac = min(self.done / self.total, 1.0)
        width = 30
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        sys.stderr.write(f"\r{self.label} [{bar}] {frac * 100:5.1f}% ")
        sys.stderr.flush()

    def close(self, message: str | None = None) -> None:
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self._start
        if self._tty:
            self._draw()
            sys.stderr.write("\n")
        sys.stderr.write(f"{message or self.label} ({elapsed:.1f} s)\n")
        sys.stderr.flush()
