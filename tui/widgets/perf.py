"""`PerfPanel`: the live performance monitor. `perf_rows` turns what is known into
label/value rows (pure, tested on its own); the widget shows them with a tok/s sparkline.

Anything unknown is shown as "—" or a reason, never guessed. Knows nothing about where the
numbers come from.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from rich.table import Table
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Sparkline, Static

from ..events import EngineStats, ModelInfo, TurnTimings
from ..sysmon import SystemStats

DASH = "—"


def _bytes(n: int) -> str:
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    return f"{n / (1 << 20):.0f} MiB"


@dataclass
class PerfView:
    """Everything the panel may show; the app updates fields and calls `PerfPanel.show`."""

    info: ModelInfo | None = None
    generating: bool = False
    live_tok_s: float | None = None
    history: deque[float] = field(default_factory=lambda: deque(maxlen=48))
    last: TurnTimings | None = None
    engine: EngineStats = field(default_factory=EngineStats)
    system: SystemStats = field(default_factory=SystemStats)
    max_context: int | None = None


def perf_rows(v: PerfView) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    last = v.last or TurnTimings()
    if v.generating and v.live_tok_s is not None:
        rows.append(("decode", f"{v.live_tok_s:.1f} tok/s"))
    elif last.decode_tok_s:
        rows.append(("decode", f"{last.decode_tok_s:.1f} tok/s"))
    else:
        rows.append(("decode", DASH))
    rows.append(("TTFT", f"{last.ttft_s * 1000:.0f} ms" if last.ttft_s is not None else DASH))
    rows.append(("prefill", f"{last.prefill_tok_s:.1f} tok/s" if last.prefill_tok_s else DASH))
    if last.cached_tokens:
        rows.append(("cached", f"{last.cached_tokens} tok"))
    e = v.engine
    max_ctx = e.max_context or v.max_context or (v.info.max_context if v.info else None)
    used = e.context_tokens
    if used is None and last.prompt_tokens is not None:
        used = last.prompt_tokens + (last.completion_tokens or 0)
    if used is not None and max_ctx:
        rows.append(("context", f"{used}/{max_ctx} {100 * used / max_ctx:.0f}%"))
    else:
        rows.append(("context", f"{DASH}/{max_ctx}" if max_ctx else DASH))
    if e.kv_cache_bytes:
        used_kv = _bytes(e.kv_cache_used_bytes or 0)
        rows.append(("KV cache", f"{used_kv}/{_bytes(e.kv_cache_bytes)}"))
    elif e.kv_usage is not None:
        rows.append(("KV cache", f"{100 * e.kv_usage:.0f}% used"))
    else:
        rows.append(("KV cache", DASH))
    if e.requests_running is not None or e.batch_size is not None:
        run = DASH if e.requests_running is None else str(e.requests_running)
        wait = DASH if e.requests_waiting is None else str(e.requests_waiting)
        size = f" · B {e.batch_size:.1f}" if e.batch_size is not None else ""
        rows.append(("batch", f"{run} run · {wait} wait{size}"))
    if e.prefix_hit_rate is not None:
        rows.append(("prefix hit", f"{100 * e.prefix_hit_rate:.0f}%"))
    if e.spec_acceptance is not None:
        per_pos = "/".join(f"{100 * a:.0f}" for a in e.spec_per_pos)
        rows.append(("spec acc", f"{100 * e.spec_acceptance:.0f}%" + (f" ({per_pos})" if per_pos else "")))
    elif last.draft_tokens:
        rows.append(("spec acc", f"{100 * (last.draft_accepted or 0) / last.draft_tokens:.0f}%"))
    else:
        rows.append(("spec acc", "off"))
    device = e.device or (v.info.device if v.info else "") or DASH
    rows.append(("device", device))
    s = v.system
    if s.gpu is not None:
        rows.append(("GPU", s.gpu.name))
        rows.append(("VRAM", f"{_bytes(s.gpu.memory_used)}/{_bytes(s.gpu.memory_total)}"))
        util = s.gpu.utilization
        rows.append(("GPU util", f"{util}%" if util is not None else DASH))
    else:
        rows.append(("GPU", s.gpu_note or DASH))
        if e.device_memory_total and device != "cpu":   # on the CPU it is just RAM again
            used_mem = _bytes(e.device_memory_used or 0)
            rows.append(("dev mem", f"{used_mem}/{_bytes(e.device_memory_total)}"))
    if s.cpu_percent is not None:
        rows.append(("CPU", f"{s.cpu_percent:.0f}%"))
    if s.rss_bytes is not None:
        total = f"/{_bytes(s.ram_total)}" if s.ram_total else ""
        rows.append(("RAM", f"{_bytes(s.rss_bytes)}{total}"))
    return rows


class PerfPanel(Vertical):
    DEFAULT_CSS = """
    PerfPanel {
        width: 30;
        height: 1fr;
        border-left: vkey $primary 40%;
        padding: 0 0 0 1;
    }
    PerfPanel > .title { text-style: bold; color: $accent; }
    PerfPanel Sparkline { height: 2; margin: 0 1 0 0; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.view = PerfView()
        self._spark = Sparkline([], id="tok-spark")
        self._rows = Static(id="perf-rows")

    def compose(self) -> ComposeResult:
        yield Static("Engine monitor", classes="title")
        yield self._spark
        yield self._rows

    def show(self) -> None:
        """Re-render from `self.view`."""
        table = Table.grid(padding=(0, 1))
        table.add_column(style="dim", no_wrap=True)
        table.add_column(overflow="fold")
        for label, value in perf_rows(self.view):
            table.add_row(label, value)
        self._rows.update(table)
        self._spark.data = list(self.view.history)
