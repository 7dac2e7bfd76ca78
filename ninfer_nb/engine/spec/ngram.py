"""N-gram prompt lookup: draft the tokens that followed the latest earlier occurrence of the
sequence's own suffix.

For n from `max_n` down to `min_n`, the last n tokens of prompt + output are searched for an
earlier occurrence (the most recent one wins); the up-to-K tokens that followed it are the
draft. No match: no draft (the engine runs a plain decode step). No weights, any architecture.
Knows nothing about models or sampling.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class NgramProposer:
    max_n: int = 4                     # longest suffix tried first
    min_n: int = 1                     # shortest suffix that may still draft
    window: int = 8192                 # only the last `window` tokens are searched

    def __post_init__(self) -> None:
        if not 1 <= self.min_n <= self.max_n:
            raise ValueError(f"ngram sizes need 1 <= min_n <= max_n (got {self.min_n}, {self.max_n})")

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to k draft tokens to follow `tokens` (prompt + output so far); [] when the suffix
        occurs nowhere earlier."""
        if k <= 0 or len(tokens) < 2:
            return []
        seq = np.asarray(tokens[-self.window:], dtype=np.int64)            # [L]
        length = seq.shape[0]
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            suffix = seq[length - n:]
            # starts s < L - n of earlier windows seq[s:s+n] equal to the suffix
            hits = np.flatnonzero(seq[: length - n] == suffix[0])
            for j in range(1, n):
                hits = hits[seq[hits + j] == suffix[j]]
            if hits.size:
                follow = int(hits[-1]) + n                                 # most recent occurrence
                return [int(t) for t in seq[follow : follow + k]]
        return []
