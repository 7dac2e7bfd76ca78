"""What generation returns: timings, streamed events, finished results.

Plain data; no engine or tokenizer knowledge. `Timings` follows the anchors' definitions:
TTFT = prepare + prefill (first token belongs to prefill), decode tok/s = (n - 1) / decode_s.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from .engine.logprobs import TokenLogprobs

FinishReason = Literal["stop", "length", "cancelled", "error"]


@dataclass
class Timings:
    prompt_tokens: int = 0
    cached_tokens: int = 0           # prompt tokens served from the prefix cache
    completion_tokens: int = 0
    ttft_s: float = 0.0              # request start -> first token sampled
    prefill_s: float = 0.0
    decode_s: float = 0.0            # first token -> last token

    @property
    def prefill_tok_s(self) -> float:
        n = self.prompt_tokens - self.cached_tokens
        return n / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tok_s(self) -> float:
        n = self.completion_tokens - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0

    def summary(self) -> str:
        return (
            f"TTFT {self.ttft_s * 1000:.0f} ms | prefill {self.prompt_tokens} tok "
            f"@ {self.prefill_tok_s:.1f} tok/s | decode {self.completion_tokens} tok "
            f"@ {self.decode_tok_s:.1f} tok/s"
        )

    def as_dict(self) -> dict[str, float]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "ttft_s": self.ttft_s,
            "prefill_s": self.prefill_s,
            "decode_s": self.decode_s,
            "prefill_tok_s": self.prefill_tok_s,
            "decode_tok_s": self.decode_tok_s,
        }


@dataclass
class StreamEvent:
    """One step of a streamed generation. `text` is the newly completed text (may be "")."""

    token_id: int | None
    text: str
    finished: bool = False
    finish_reason: FinishReason | None = None
    timings: Timings | None = None          # set on the final event
    logprobs: TokenLogprobs | None = None   # the token's, when params.logprobs is set


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: FinishReason
    prompt_token_ids: list[int] = field(default_factory=list)
    timings: Timings = field(default_factory=Timings)
