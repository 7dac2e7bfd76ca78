"""Adaptive draft length: K from the acceptance measured so far.

An exponential average of the drafts each round kept; the next round drafts one more than
it, between 1 and the configured maximum. A round that keeps every draft counts one above
what it drafted (it says nothing about longer drafts), so K grows back to the maximum while
drafts keep being right, and rounds that keep none shrink it to 1 (a verify of 2 tokens costs
little more than a plain step). Knows nothing about models or requests.
"""
from __future__ import annotations

from dataclasses import dataclass, field

AUTO_MAX_K = 5                               # `auto`'s maximum draft length


@dataclass
class AdaptiveK:
    max_k: int
    decay: float = 0.6                       # weight of the past in the average
    kept: float = field(init=False)          # the average of drafts kept per round

    def __post_init__(self) -> None:
        if self.max_k < 1:
            raise ValueError(f"AdaptiveK needs max_k >= 1 (got {self.max_k})")
        self.kept = float(self.max_k)        # optimistic start: the first round drafts max_k

    @classmethod
    def parse(cls, value: int | str) -> tuple[int, bool]:
        """A `draft_tokens` setting -> (K or the adaptive maximum, adaptive): 3 or "3" is a fixed
        K = 3; "auto" adapts up to AUTO_MAX_K; "auto:7" up to 7."""
        text = str(value).strip().lower()
        adaptive = text == "auto" or text.startswith("auto:")
        k_text = text.partition(":")[2] if adaptive else text
        try:
            k = AUTO_MAX_K if text == "auto" else int(k_text)
        except ValueError:
            raise ValueError(f"draft tokens must be K, auto or auto:K (got {value!r})") from None
        if k < 1:
            raise ValueError(f"draft tokens must be >= 1 (got {value!r})")
        return k, adaptive

    def next_k(self) -> int:
        return max(1, min(self.max_k, int(self.kept) + 1))

    def record(self, drafted: int, accepted: int) -> None:
        seen = accepted + 1 if accepted == drafted else accepted
        self.kept = self.decay * self.kept + (1.0 - self.decay) * seen
