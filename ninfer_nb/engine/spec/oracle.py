"""The oracle drafter (benchmarks only): proposes the target's own greedy continuation,
recorded from a plain run of the same prompt.

Every draft is accepted (when the verify's argmax equals the plain decode's), so a run with it
measures the upper bound of the verify machinery: K + 1 tokens per round at the cost of one
verify forward. It knows the one prompt it was recorded for; any other sequence gets no draft.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OracleProposer:
    prompt: tuple[int, ...]             # the recorded run's prompt
    continuation: tuple[int, ...]       # what the plain greedy run generated after it

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """The recorded continuation's next k tokens when `tokens` is the prompt followed by a
        prefix of it; [] otherwise."""
        n = len(tokens) - len(self.prompt)
        if k <= 0 or n < 0 or tuple(tokens[: len(self.prompt)]) != self.prompt:
            return []
        if tuple(tokens[len(self.prompt):]) != self.continuation[:n]:
            return []
        return list(self.continuation[n : n + k])
