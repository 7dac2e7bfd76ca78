"""Host-side sampling from one row of logits: penalties, temperature, top-k/top-p/min-p.

A `Sampler` is made per request (it owns the seeded RNG and the counts of generated tokens).
Ids at or above `valid_vocab` (padding rows of the LM head) are never sampled. Exactness: top-k
partitions only the values at or above a bound that provably holds the top k (`top_k_ids`); the
top-p nucleus is computed on a partial sort that is widened until it provably contains the
nucleus. Requests the decode graph can serve (greedy, temperature alone) never get here on
CUDA (`device_pick`). Knows nothing about models or tokenizers.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..params import SamplingParams
from ..structured.bitmask import apply_token_bitmask

if TYPE_CHECKING:
    from ..structured import Matcher

DEVICE_SEED_SALT = 0x5EED_D0       # the device pick's key is not the host generator's stream


class Sampler:
    def __init__(self, params: SamplingParams, valid_vocab: int, seed: int | None = None,
                 matcher: Matcher | None = None) -> None:
        self.params = params
        self.matcher = matcher             # the request's output constraint: masks and follows tokens
        self.valid_vocab = valid_vocab
        self.seed = params.seed if params.seed is not None else seed
        self.rng = np.random.default_rng(self.seed)
        self.counts: dict[int, int] = {}

    def device_pick(self) -> tuple[float, int] | None:
        """(temperature, seed) when the decode graph's pick kernel can choose this request's
        tokens: greedy without penalties -> (0.0, 0), the argmax; temperature alone (no top-k,
        top-p, min-p or penalties) -> a sample from softmax(logits / T) by the Gumbel-max trick,
        keyed by a 63-bit seed derived from the request's (or the engine's) seed, so a seed
        reproduces the tokens; random without one. The host generator is left untouched.
        None: the host samples from the logits row."""
        p = self.params
        if p.presence_penalty != 0.0 or p.frequency_penalty != 0.0:
            return None
        if p.greedy:
            return 0.0, 0
        if p.top_k == 0 and p.top_p >= 1.0 and p.min_p <= 0.0:
            key = np.random.default_rng(None if self.seed is None else [self.seed, DEVICE_SEED_SALT])
            return float(p.temperature), int(key.integers(0, 2**63 - 1))
        return None

    def observe(self, token: int) -> None:
        self.counts[token] = self.counts.get(token, 0) + 1
        if self.matcher is not None:
            self.matcher.advance(token)

    def constrain(self, logits: np.ndarray) -> np.ndarray:
        """logits [V] with -inf where the request's constraint forbids the next token."""
        if self.matcher is None:
            return logits
        return apply_token_bitmask(logits, self.matcher.allowed_tokens())

    def apply_penalties(self, logits: np.ndarray) -> np.ndarray:
        p = self.params
        if not self.counts or (p.presence_penalty == 0.0 and p.frequency_penalty == 0.0):
            return logits
        ids = np.fromiter(self.counts.keys(), dtype=np.int64)
        counts = np.fromiter(self.counts.values(), dtype=np.float32)
        logits = logits.copy()
        logits[ids] -= p.presence_penalty + p.frequency_penalty * counts
        return logits

    def sample(self, logits: np.ndarray) -> int:
        """logits [V] float32 -> token id (within the request's constraint, if any)."""
        if self.params.greedy:
            return int(np.argmax(self.apply_penalties(self._valid(self.constrain(logits)))))
        ids, probs = self.distribution(logits)
        cum = np.cumsum(probs, dtype=np.float64)
        pick = int(np.searchsorted(cum, self.rng.random() * cum[-1], side="right"))
        return int(ids[min(pick, len(probs) - 1)])

    def distribution(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The distribution `sample` draws from (sampled requests): ids [N] int and their
        probabilities [N] float64 summing to 1, after the constraint, penalties, temperature,
        top-k, min-p and top-p (ids outside them have probability 0 or are absent). Speculative
        verification (engine/spec/verify.py) accepts and resamples against it."""
        p = self.params
        if p.greedy:
            raise ValueError("distribution: a greedy request has none (it takes the argmax)")
        z = self.apply_penalties(self._valid(self.constrain(logits))) / np.float32(p.temperature)
        ids = np.arange(z.shape[0])
        if 0 < p.top_k < z.shape[0]:
            ids = top_k_ids(z, p.top_k)
            z = z[ids]
        probs = np.exp(z - z.max())
        probs /= probs.sum()
        if p.min_p > 0.0:
            probs = np.where(probs >= p.min_p * probs.max(), probs, 0.0)
        if p.top_p < 1.0:
            probs = _nucleus(probs / probs.sum(), p.top_p)
        probs = probs.astype(np.float64)
        return ids, probs / probs.sum()

    def _valid(self, logits: np.ndarray) -> np.ndarray:
        return logits[: self.valid_vocab].astype(np.float32, copy=False)


def gumbel_max_pick(row: np.ndarray, temperature: float, seed: int, offset: int) -> int:
    """The token a pick (temperature, seed, offset) takes from one logits row [V]: the argmax
    at temperature 0 (lowest id on ties), else a sample from softmax(row / T) by the Gumbel-max
    trick with noise keyed by (seed, offset). The CPU backend's token ring; the decode graph's
    pick kernel (kernels/sampling.py) draws its noise from Philox instead."""
    if temperature <= 0.0:
        return int(np.argmax(row))
    noise = np.random.default_rng([seed, offset]).gumbel(size=row.shape[0])
    return int(np.argmax(row.astype(np.float64) / temperature + noise))


TOP_K_SUBSAMPLE = 4096    # logits a top-k threshold is first estimated from


def top_k_ids(z: np.ndarray, k: int) -> np.ndarray:
    """Ascending ids of the k largest values of z [V] (0 < k < V; which of several values
    tied at the k-th is kept is arbitrary but deterministic). Exact, and cheaper than an
    argpartition of the whole row at a large vocabulary: the k-th largest value of a strided
    subsample is at most the k-th largest of z, so the values at or above it hold the top k,
    and only those are partitioned."""
    n = z.shape[0]
    cand: np.ndarray | None = None
    if n >= 8 * TOP_K_SUBSAMPLE and k <= TOP_K_SUBSAMPLE // 8:
        sub = z[:: n // TOP_K_SUBSAMPLE]
        threshold = np.partition(sub, sub.size - k)[sub.size - k]
        cand = np.flatnonzero(z >= threshold)
        if cand.size < k:                     # NaN in the subsample: no usable bound
            cand = None
    if cand is None:
        cand = np.arange(n)
    vals = z[cand]
    return np.sort(cand[np.argpartition(vals, vals.size - k)[vals.size - k:]])


def _nucleus(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Zero every probability outside the smallest set of largest ones whose sum reaches top_p.
    Sorts only a prefix, widened until it provably contains the nucleus."""
    n = probs.shape[0]
    width = min(n, 256)
    while True:
        part = np.argpartition(-probs, width - 1)[:width] if width < n else np.arange(n)
        order = part[np.argsort(-probs[part], kind="stable")]
        cum = np.cumsum(probs[order])
        if cum[-1] >= top_p or width == n:
            keep = int(np.searchsorted(cum, top_p, side="left")) + 1
            out = np.zeros_like(probs)
            kept = order[: min(keep, len(order))]
            out[kept] = probs[kept]
            return out
        width = min(n, width * 4)
