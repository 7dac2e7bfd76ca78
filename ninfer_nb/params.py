"""SamplingParams: how one request samples and when it stops. Validated at the edge.

Knows nothing about models or devices; `validate()` raises InvalidRequestError with a message
naming the bad field, so front-ends can turn it into exit status 2 or an HTTP 400.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .errors import InvalidRequestError


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.7        # 0 = greedy
    top_k: int = 0                  # 0 = off
    top_p: float = 1.0              # 1 = off
    min_p: float = 0.0              # 0 = off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # HF / vLLM: a token seen in the prompt or the output has its logit divided (> 0) or
    # multiplied (< 0) by this; 1 = off
    repetition_penalty: float = 1.0
    # (token id, bias) pairs added to the logits before the penalties (OpenAI logit_bias)
    logit_bias: tuple[tuple[int, float], ...] = ()
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None     # None: off; k: the chosen token's logprob + top k (0..20)
    # a thinking-token budget: after this many generated tokens still inside <think>, the
    # engine emits `thinking_end_ids` (ids ending with the </think> id) instead of sampling
    thinking_budget: int | None = None
    thinking_end_ids: tuple[int, ...] = ()
    speculative: bool = True        # False: this request decodes plainly when the engine speculates

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1

    def replace(self, **changes: object) -> "SamplingParams":
        return replace(self, **changes)  # type: ignore[arg-type]

    def validate(self) -> "SamplingParams":
        def bad(msg: str) -> InvalidRequestError:
            return InvalidRequestError(msg)

        checks: list[tuple[str, object, type | tuple[type, ...]]] = [
            ("max_tokens", self.max_tokens, int),
            ("temperature", self.temperature, (int, float)),
            ("top_k", self.top_k, int),
            ("top_p", self.top_p, (int, float)),
            ("min_p", self.min_p, (int, float)),
            ("presence_penalty", self.presence_penalty, (int, float)),
            ("frequency_penalty", self.frequency_penalty, (int, float)),
        ]
        for name, value, kind in checks:
            if isinstance(value, bool) or not isinstance(value, kind):
                raise bad(f"{name} must be a number, got {value!r}")
            if isinstance(value, float) and not math.isfinite(value):
                raise bad(f"{name} must be finite, got {value!r}")
        if self.max_tokens < 1:
            raise bad(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not 0.0 <= self.temperature <= 2.0:
            raise bad(f"temperature must be in [0, 2], got {self.temperature}")
        if self.top_k < 0:
            raise bad(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise bad(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise bad(f"min_p must be in [0, 1], got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = float(getattr(self, name))
            if not -2.0 <= v <= 2.0:
                raise bad(f"{name} must be in [-2, 2], got {v}")
        rep = self.repetition_penalty
        if isinstance(rep, bool) or not isinstance(rep, (int, float)) or not math.isfinite(rep) or not 0.0 < rep <= 2.0:
            raise bad(f"repetition_penalty must be a number in (0, 2], got {rep!r}")
        if len(self.logit_bias) > 300:
            raise bad(f"logit_bias has {len(self.logit_bias)} entries (at most 300)")
        seen: set[int] = set()
        for entry in self.logit_bias:
            if (not isinstance(entry, tuple) or len(entry) != 2 or isinstance(entry[0], bool)
                    or not isinstance(entry[0], int) or not 0 <= entry[0] < 2**31 or entry[0] in seen
                    or isinstance(entry[1], bool) or not isinstance(entry[1], (int, float))
                    or not -100.0 <= entry[1] <= 100.0):
                raise bad(f"logit_bias entries must be distinct (token id in [0, 2^31), bias in [-100, 100]), "
                          f"got {entry!r}")
            seen.add(entry[0])
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise bad(f"seed must be an integer, got {self.seed!r}")
        if self.logprobs is not None and (isinstance(self.logprobs, bool) or not isinstance(self.logprobs, int)
                                          or not 0 <= self.logprobs <= 20):
            raise bad(f"logprobs must be an integer in [0, 20], got {self.logprobs!r}")
        if self.thinking_budget is not None and (isinstance(self.thinking_budget, bool)
                                                 or not isinstance(self.thinking_budget, int)
                                                 or self.thinking_budget < 0):
            raise bad(f"thinking_budget must be an integer >= 0, got {self.thinking_budget!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise bad("stop must be non-empty strings")
        return self
