"""Log-probabilities of tokens under the model, from logits rows on the host.

`token_logprobs` gives one generated token's logprob and the `k` most likely alternatives from
the raw logits row its sampler saw (before penalties, temperature, filters or a grammar mask:
the model's own distribution, like vLLM's default `raw_logprobs`); `prompt_logprobs` does the
same for every prompt token from the logits at all positions (`LLM.logits`). Only ids below
`valid_vocab` count (the LM head's padding rows are not tokens). Knows nothing about text.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class TokenLogprobs:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()     # (id, logprob), most likely first


def log_softmax(rows: np.ndarray) -> np.ndarray:
    """log softmax over the last axis, in float64 ([..., V] -> [..., V])."""
    z = rows.astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def _top(lp: np.ndarray, k: int) -> tuple[tuple[int, float], ...]:
    """The k largest entries of lp [V] as (id, logprob), most likely first (lowest id on ties)."""
    if k <= 0:
        return ()
    k = min(k, lp.shape[0])
    part = np.argpartition(-lp, k - 1)[:k]
    order = part[np.lexsort((part, -lp[part]))]
    return tuple((int(i), float(lp[i])) for i in order)


def token_logprobs(row: np.ndarray, token: int, k: int, valid_vocab: int) -> TokenLogprobs:
    """`token`'s logprob under the logits row [V] and the top `k` (0..20) alternatives."""
    lp = log_softmax(row[:valid_vocab])
    value = float(lp[token]) if 0 <= token < lp.shape[0] else float("-inf")
    return TokenLogprobs(int(token), value, _top(lp, k))


def prompt_logprobs(logits: np.ndarray, ids: list[int], k: int,
                    valid_vocab: int) -> list[TokenLogprobs | None]:
    """Per prompt token: its logprob given the tokens before it (logits [T, V] at every
    position of `ids`; row t predicts ids[t + 1]). The first token has none (None)."""
    out: list[TokenLogprobs | None] = [None]
    for t in range(1, len(ids)):
        out.append(token_logprobs(logits[t - 1], ids[t], k, valid_vocab))
    return out
