"""Per-request hooks on the host sampler: logprobs and a thinking-token budget.

`sampler_for` gives the engine a plain `Sampler`, or, when the request asks for logprobs or a
thinking budget, a `HookedSampler`: it samples like its base class, then (budget) replaces the
token by the forced closing sequence once the request has thought for `thinking_budget` tokens
without closing, then (logprobs) records the chosen token's logprob and its top alternatives
from the raw row into `request.logprobs`. A budget may change the token, so it needs the
logits row on the host (`needs_rows`: `Sampler.device_sample` -> None); logprobs alone do
not: the device pick computes them (PickFilters.logprobs) and `observe` records what it left
in `logprobs_out`. Neither speculates (`LLMEngine._can_speculate`). Knows nothing about text:
the front door gives the forced ids (`SamplingParams.thinking_end_ids`, ending with the
`</think>` id).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..params import SamplingParams
from .logprobs import token_logprobs
from .sampler import Sampler

if TYPE_CHECKING:
    from ..structured import Matcher
    from .request import Request


class ThinkingBudget:
    """Closes the reasoning channel after `budget` generated tokens: while the output has not
    produced `end_ids[-1]` (the `</think>` id) by itself, the token at position `budget` and
    the ones after it are replaced by `end_ids`, one per step."""

    def __init__(self, budget: int, end_ids: tuple[int, ...]) -> None:
        self.budget = budget
        self.end_ids = end_ids
        self.closed = not end_ids
        self._forced: list[int] = []

    def next(self, sampled: int, generated: int) -> int:
        """The token to emit at output position `generated` (0-based) given the sampled one."""
        if self.closed:
            return sampled
        if not self._forced and generated >= self.budget and sampled != self.end_ids[-1]:
            self._forced = list(self.end_ids)
        if self._forced:
            sampled = self._forced.pop(0)
        if sampled == self.end_ids[-1]:
            self.closed = True
            self._forced = []
        return sampled


class HookedSampler(Sampler):
    def __init__(self, request: Request, params: SamplingParams, valid_vocab: int,
                 seed: int | None = None, matcher: Matcher | None = None, **kw: Any) -> None:
        super().__init__(params, valid_vocab, seed=seed, matcher=matcher, **kw)
        self.request = request
        self.budget = (ThinkingBudget(params.thinking_budget, params.thinking_end_ids)
                       if params.thinking_budget is not None else None)

    @property
    def needs_rows(self) -> bool:        # type: ignore[override]
        return self.budget is not None

    def sample(self, logits: np.ndarray) -> int:
        token = super().sample(logits)
        req = self.request
        generated = len(req.output_ids)
        if self.budget is not None:
            token = self.budget.next(token, generated)
        k = self.params.logprobs
        if k is not None:
            del req.logprobs[generated:]         # a step retried after an error records once
            req.logprobs.append(token_logprobs(logits, token, k, self.valid_vocab))
        return token

    def observe(self, token: int) -> None:
        """Count `token`; a pick that computed its logprobs elsewhere (the decode graph, or
        gumbel_max_pick) left them in logprobs_out: recorded here, once per output position."""
        out = self.logprobs_out
        if out:
            lp = out[0]
            out.clear()
            if self.params.logprobs is not None and lp.token_id == token:
                generated = len(self.request.output_ids)
                del self.request.logprobs[generated:]
                self.request.logprobs.append(lp)
        super().observe(token)


def sampler_for(request: Request, params: SamplingParams, valid_vocab: int, seed: int | None = None,
                matcher: Matcher | None = None, **kw: Any) -> Sampler:
    """The request's host sampler: hooked when it wants logprobs or a thinking budget (`kw`:
    the Sampler's other arguments, passed on)."""
    if params.logprobs is None and params.thinking_budget is None:
        return Sampler(params, valid_vocab, seed=seed, matcher=matcher, **kw)
    return HookedSampler(request, params, valid_vocab, seed=seed, matcher=matcher, **kw)
