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

from .sampler import top_k_ids

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


def _top_ids(z: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest entries of z [V], most likely first (lowest id on ties among
    those kept). The sampler's exact top-k (a bound from a subsample, then a partition of the
    few values above it)."""
    part = top_k_ids(z, k) if k < z.shape[0] else np.arange(z.shape[0])
    return part[np.lexsort((part, -z[part]))]


def token_logprobs(row: np.ndarray, token: int, k: int, valid_vocab: int) -> TokenLogprobs:
    """`token`'s logprob under the logits row [V] and the top `k` (0..20) alternatives.
    One pass for the log-sum-exp (float32 exp, float64 sum); only the k + 1 wanted entries
    become logprobs."""
    z = row[:valid_vocab].astype(np.float32, copy=False)
    m = float(z.max())
    lse = m + float(np.log(np.exp(z - np.float32(m)).sum(dtype=np.float64)))
    value = float(z[token]) - lse if 0 <= token < z.shape[0] else float("-inf")
    top = tuple((int(i), float(z[i]) - lse) for i in _top_ids(z, k)) if k > 0 else ()
    return TokenLogprobs(int(token), value, top)


def prompt_logprobs(logits: np.ndarray, ids: list[int], k: int,
                    valid_vocab: int) -> list[TokenLogprobs | None]:
    """Per prompt token: its logprob given the tokens before it (logits [T, V] at every
    position of `ids`; row t predicts ids[t + 1]). The first token has none (None)."""
    out: list[TokenLogprobs | None] = [None]
    for t in range(1, len(ids)):
        out.append(token_logprobs(logits[t - 1], ids[t], k, valid_vocab))
    return out
