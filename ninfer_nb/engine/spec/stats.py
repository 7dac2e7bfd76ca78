"""SpecStats: what speculation did over a run (rounds, drafts, acceptance), for bench and logs."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SpecStats:
    rounds: int = 0                        # verify forwards
    drafted: int = 0                       # draft tokens fed to verifies
    accepted: int = 0                      # drafts the target kept
    emitted: int = 0                       # tokens the rounds produced (accepted + one each)
    plain_steps: int = 0                   # decode steps with no draft (no n-gram match)
    accepted_at: list[int] = field(default_factory=list)   # [K] rounds that kept draft i

    def record(self, drafted: int, accepted: int) -> None:
        self.rounds += 1
        self.drafted += drafted
        self.accepted += accepted
        self.emitted += accepted + 1
        while len(self.accepted_at) < drafted:
            self.accepted_at.append(0)
        for i in range(accepted):
            self.accepted_at[i] += 1

    def as_metrics(self) -> dict[str, Any]:
        """Running totals for /metrics (vLLM's spec_decode_* counters): verify rounds, draft
        tokens, accepted drafts, and the rounds that kept the draft at each position."""
        return {"spec_drafts": self.rounds, "spec_draft_tokens": self.drafted,
                "spec_accepted_tokens": self.accepted, "spec_accepted_per_pos": list(self.accepted_at)}

    @property
    def acceptance(self) -> float:
        """Fraction of draft tokens kept."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_round(self) -> float:
        """Tokens per decode forward (verify rounds and plain steps together)."""
        forwards = self.rounds + self.plain_steps
        return (self.emitted + self.plain_steps) / forwards if forwards else 0.0
