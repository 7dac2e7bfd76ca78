"""Typed events an EngineClient streams to the app, plus the value objects they carry.

Plain frozen data: no Textual, no engine, no HTTP. A generation stream is a sequence of
deltas/ticks that ends with exactly one `Done` or `Failed`.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str          # JSON text as the model wrote it


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ContentDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    call: ToolCall


@dataclass(frozen=True, slots=True)
class TokenTick:
    """Decode progress: `tokens` completion tokens so far, `tok_s` over the recent window."""

    tokens: int
    tok_s: float


@dataclass(frozen=True, slots=True)
class TurnTimings:
    """What one finished turn cost. Fields the backend did not report stay None."""

    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    ttft_s: float | None = None
    prefill_tok_s: float | None = None
    decode_tok_s: float | None = None
    draft_tokens: int | None = None
    draft_accepted: int | None = None

    def summary(self) -> str:
        """One short line for a message footer; unknown parts are left out."""
        parts: list[str] = []
        if self.ttft_s is not None:
            parts.append(f"TTFT {self.ttft_s * 1000:.0f} ms")
        if self.prompt_tokens is not None:
            cached = f" ({self.cached_tokens} cached)" if self.cached_tokens else ""
            parts.append(f"prompt {self.prompt_tokens}{cached}")
        if self.prefill_tok_s:
            parts.append(f"prefill {self.prefill_tok_s:.1f} tok/s")
        if self.completion_tokens is not None:
            parts.append(f"{self.completion_tokens} tok")
        if self.decode_tok_s:
            parts.append(f"{self.decode_tok_s:.1f} tok/s")
        if self.draft_tokens:
            parts.append(f"draft {self.draft_accepted or 0}/{self.draft_tokens}")
        return " · ".join(parts)


@dataclass(frozen=True, slots=True)
class Done:
    finish_reason: str                      # stop | length | cancelled | tool_calls
    timings: TurnTimings = field(default_factory=TurnTimings)


@dataclass(frozen=True, slots=True)
class Failed:
    """The turn could not complete. `message` is one user-facing line."""

    message: str


@dataclass(frozen=True, slots=True)
class EngineStats:
    """What the engine (or the server's /metrics) says about itself. None = not reported."""

    context_tokens: int | None = None
    max_context: int | None = None
    kv_cache_used_bytes: int | None = None
    kv_cache_bytes: int | None = None
    kv_usage: float | None = None           # 0..1 when only a ratio is known
    spec_acceptance: float | None = None    # None = speculation off / unknown
    device: str | None = None
    device_memory_used: int | None = None
    device_memory_total: int | None = None
    requests_running: int | None = None
    requests_waiting: int | None = None
    batch_size: float | None = None         # mean rows per decode round (requests decoding together)
    prefix_hit_rate: float | None = None    # prompt tokens the prefix cache served / looked up
    spec_per_pos: tuple[float, ...] = ()    # acceptance at each draft position (0..1)


def spec_per_position(accepted_at: dict[int, float], rounds: float | None) -> tuple[float, ...]:
    """Acceptance at each draft position: rounds that kept the draft there / verify rounds."""
    if not rounds or not accepted_at:
        return ()
    return tuple(accepted_at.get(i, 0.0) / rounds for i in range(max(accepted_at) + 1))


@dataclass(frozen=True, slots=True)
class StatsUpdate:
    stats: EngineStats


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """Shown by /model and in the status line."""

    model_id: str
    backend: str                            # "in-process" or the server URL
    device: str = ""
    max_context: int | None = None
    details: tuple[tuple[str, str], ...] = ()


ChatEvent = (
    ReasoningDelta | ContentDelta | ToolCallDelta | TokenTick | StatsUpdate | Done | Failed
)
