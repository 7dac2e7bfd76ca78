"""What a token pick is, for the backends (engine/backends/base.py) and the samplers: `Pick`
(temperature, seed, offset, filters) and its `PickFilters`. Plain data; the semantics are the
host sampler's (engine/sampler.py), which the decode graph's sampler (kernels/sample_pick.py)
reproduces.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple


@dataclass(frozen=True)
class PickFilters:
    """What a pick applies beyond the temperature (engine/sampler.py has the semantics; the
    decode graph's sampler, kernels/sample_pick.py, computes the same): top-k (0: off), top-p
    (1: off), min-p (0: off), the penalties, a sparse logit bias; and, for the penalties, the
    request's live token history (the prompt ids and the generated tokens' counts), which the
    backend uploads when its device copy is not that request's (`key`) at the pick's offset.

    logprobs >= 0: whoever takes the pick (the decode graph, or `gumbel_max_pick` on the host)
    also computes the chosen token's logprob and its `logprobs` most likely alternatives under
    the raw row (engine/logprobs.py TokenLogprobs) and leaves it in `logprobs_out` (a live
    one-entry list the request's sampler takes it from when it observes the token).

    matcher: the request's grammar (structured/constraint.py Matcher, live): the pick keeps
    only the ids it allows at the pick's step (the backend asks it for a bitmask when it
    writes the pick, so a step cannot be queued before the last token was observed)."""

    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    key: int = 0
    prompt_ids: Any = field(default=(), compare=False)                    # int array / sequence
    counts: dict[int, int] = field(default_factory=dict, compare=False)    # token -> times generated
    logprobs: int = -1                                                     # -1: none; else top-k (<= 20)
    logprobs_out: list[Any] = field(default_factory=list, compare=False)   # [TokenLogprobs] of the last pick
    matcher: Any = field(default=None, compare=False)                      # a grammar's Matcher, or None

    @property
    def penalized(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0


class Pick(NamedTuple):
    """A token pick: temperature 0 is the argmax, else a Gumbel-max sample from
    softmax(logits / temperature) keyed by (seed, offset), over the ids `filters` keep."""

    temperature: float
    seed: int
    offset: int
    filters: PickFilters | None = None


ARGMAX: Pick = Pick(0.0, 0, 0)
