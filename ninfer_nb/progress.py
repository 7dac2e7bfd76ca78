"""A progress bar on stderr for long work (loading, pulling, benchmarking), drawn by rich.progress.

When enabled, a bar is drawn only if stderr is a terminal, and `close` always prints one summary
line with the elapsed time; when disabled nothing is printed. Knows nothing about what is counted.
"""
from __future__ import annotations

import sys
import time
from typing import Any


class Progress:
    def __init__(self, label: str, total: float, *, unit: str = "", enabled: bool = True) -> None:
        """`unit="B"` shows sizes and transfer speed next to the bar."""
        self.label, self.total, self.unit = label, max(float(total), 1e-9), unit
        self.enabled = enabled
        self.done = 0.0
        self._start = time.perf_counter()
        self._bar: Any = None
        if enabled and sys.stderr.isatty():
            self._bar = _rich_bar(label, self.total, unit)

    def update(self, amount: float = 1.0) -> None:
        self.done += amount
        if self._bar is not None:
            self._bar.advance(self._bar.task_ids[0], amount)

    def close(self, message: str | None = None) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        elapsed = time.perf_counter() - self._start
        sys.stderr.write(f"{message or self.label} ({elapsed:.1f} s)\n")
        sys.stderr.flush()


def _rich_bar(label: str, total: float, unit: str) -> Any:
    """A started rich Progress with one task (rich is imported only when a bar is drawn)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TransferSpeedColumn,
    )
    from rich.progress import Progress as RichProgress

    sizes = [DownloadColumn(), TransferSpeedColumn()] if unit == "B" else []
    bar = RichProgress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), *sizes,
                       TimeElapsedColumn(), console=Console(file=sys.stderr), transient=True)
    bar.add_task(label, total=total)
    bar.start()
    return bar
