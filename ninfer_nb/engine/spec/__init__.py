"""Speculative decoding: drafters propose tokens, the target verifies them in one forward.

`ngram.NgramProposer` drafts by prompt lookup; `verify.verify_drafts` accepts a prefix of the
drafts from the target's logits (exact for greedy, distribution-preserving for sampled
requests). The engine (engine/llm_engine.py) runs a round; the generator (engine/generator.py)
feeds the K+1 tokens and rolls the caches back to the accepted prefix.
"""
from __future__ import annotations

from typing import Protocol


class Proposer(Protocol):
    """A drafter: up to k tokens likely to follow `tokens` (prompt + output); [] for none."""

    def propose(self, tokens: list[int], k: int) -> list[int]: ...
