"""Host-side sampling from one row of logits: logit bias, penalties, temperature, top-k / min-p /
top-p; the reference the device sampler (kernels/sample_pick.py) reproduces exactly.

Semantics (one row x [V], ids at or above `valid_vocab`, the LM head's padding, never sampled):
x += logit bias; a token seen in the prompt or the output: x / r if x > 0 else x * r
(repetition r); a generated token with count c: x -= frequency * c + presence; z = x / T
(greedy: the argmax of x, the lowest id on ties). Candidates are ordered by (z descending,
id ascending), e = exp(z - max z) in fp32. Kept: the eligible ids (e >= min-p, i.e. p >=
min-p * the top probability), of them the first top-k, of those the shortest prefix whose mass
reaches top-p of theirs, masses in fixed point (uint64 of e * 2^40: exact, order-free sums;
the target is top-p * the mass, rounded as fp32). The token is drawn from softmax(z) on the
kept ids. Top-k / min-p / top-p only look at prefixes of that order, so min-p and top-k
commute; top-p comes last. Exact at a large vocabulary without a full sort: `ordered_prefix`
partitions before it sorts, the nucleus is searched on a prefix widened until it holds it.

A `Sampler` is made per request (it owns the seeded RNG and the counts of generated tokens).
`device_sample` says whether the decode graph's sampler can serve the request (no per-row
hooks) and with which `Pick` parameters (a grammar's bitmask and logprobs too);
`device_pick` is its subset without filters (greedy, or temperature alone). Knows nothing
about models or tokenizers.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, Sequence

import numpy as np

from ..params import SamplingParams
from ..structured.bitmask import apply_token_bitmask
from .pick import Pick, PickFilters

if TYPE_CHECKING:
    from ..structured import Matcher

DEVICE_SEED_SALT = 0x5EED_D0       # the device pick's key is not the host generator's stream
FIXED_POINT = np.float32(2.0 ** 40)   # top-p masses: uint64(e * 2^40)
PROMPT_BIT = 1 << 30                  # a device counts row: the token is in the prompt


class DevicePick(NamedTuple):
    """How the decode graph's sampler serves a request: the Pick at each step but the offset."""

    temperature: float
    seed: int
    filters: PickFilters | None = None

    def at(self, offset: int) -> Pick:
        return Pick(self.temperature, self.seed, offset, self.filters)


class Sampler:
    def __init__(self, params: SamplingParams, valid_vocab: int, seed: int | None = None,
                 matcher: Matcher | None = None, prompt_ids: Sequence[int] = ()) -> None:
        self.params = params
        self.matcher = matcher             # the request's output constraint: masks and follows tokens
        self.valid_vocab = valid_vocab
        self.seed = params.seed if params.seed is not None else seed
        self.rng = np.random.default_rng(self.seed)
        self.counts: dict[int, int] = {}
        self.logprobs_out: list[Any] = []  # a device pick's TokenLogprobs of its token (PickFilters)
        # the prompt's ids (the repetition penalty's "seen" set; only kept when it is on)
        self.prompt_ids = (np.unique(np.asarray(prompt_ids, dtype=np.int64))
                           if params.repetition_penalty != 1.0 and len(prompt_ids) else np.zeros(0, np.int64))

    needs_rows = False         # a per-row hook needs every logits row on the host

    def device_sample(self) -> DevicePick | None:
        """How the decode graph's sampler picks this request's tokens, or None (a per-row hook:
        the host samples from the logits row). A constraint goes with the filters (its matcher
        gives each step's bitmask). Greedy -> temperature 0 (the
        argmax; with penalties / bias it is taken after them); sampled -> a 63-bit key derived
        from the request's (or the engine's) seed, so a seed reproduces the tokens; random
        without one. filters: None when there are none (top-k, top-p, min-p, penalties, bias).
        The host generator is left untouched."""
        if self.needs_rows:
            return None
        p = self.params
        filters = pick_filters(p, self)
        if p.greedy:
            if filters is not None and not (filters.penalized or filters.logit_bias or filters.logprobs >= 0
                                            or filters.matcher is not None):
                filters = None
            return DevicePick(0.0, 0, filters)
        key = np.random.default_rng(None if self.seed is None else [self.seed, DEVICE_SEED_SALT])
        return DevicePick(float(p.temperature), int(key.integers(0, 2**63 - 1)), filters)

    def device_pick(self) -> tuple[float, int] | None:
        """(temperature, seed) when the decode graph's plain pick serves this request: greedy
        without penalties or bias -> (0.0, 0), the argmax; temperature alone -> a Gumbel-max
        sample keyed by `device_sample`'s seed. None otherwise."""
        d = self.device_sample()
        return None if d is None or d.filters is not None else (d.temperature, d.seed)

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
        """The logit bias, then the repetition, frequency and presence penalties (a new array
        when any applies)."""
        p = self.params
        return penalize(logits, p.logit_bias, p.repetition_penalty, p.frequency_penalty, p.presence_penalty,
                        self.prompt_ids, self.counts)

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
        probabilities [N] float64 summing to 1, after the constraint, bias, penalties,
        temperature, top-k, min-p and top-p (ids outside them are absent). Speculative
        verification (engine/spec/verify.py) accepts and resamples against it."""
        p = self.params
        if p.greedy:
            raise ValueError("distribution: a greedy request has none (it takes the argmax)")
        z = (self.apply_penalties(self._valid(self.constrain(logits))) / np.float32(p.temperature)).astype(np.float32)
        ids = kept_ids(z, p.top_k, p.top_p, p.min_p)
        probs = np.exp(z[ids].astype(np.float64) - float(z.max()))
        return ids, probs / probs.sum()

    def _valid(self, logits: np.ndarray) -> np.ndarray:
        return logits[: self.valid_vocab].astype(np.float32, copy=False)


def pick_filters(p: SamplingParams, sampler: Sampler) -> PickFilters | None:
    """The filters and penalties of p as a Pick's (None: none apply), and its logprobs; the
    penalties read the sampler's live token history, the logprobs go to its `logprobs_out`."""
    top_k = p.top_k if 1 < p.top_k < sampler.valid_vocab else 0
    logprobs = -1 if p.logprobs is None else int(p.logprobs)
    if not (top_k or p.top_p < 1.0 or p.min_p > 0.0 or p.presence_penalty or p.frequency_penalty
            or p.repetition_penalty != 1.0 or p.logit_bias or logprobs >= 0 or sampler.matcher is not None):
        return None
    return PickFilters(top_k=top_k, top_p=float(p.top_p), min_p=float(p.min_p),
                       presence_penalty=float(p.presence_penalty), frequency_penalty=float(p.frequency_penalty),
                       repetition_penalty=float(p.repetition_penalty),
                       logit_bias=tuple((int(t), float(b)) for t, b in p.logit_bias),
                       key=id(sampler), prompt_ids=sampler.prompt_ids, counts=sampler.counts,
                       logprobs=logprobs, logprobs_out=sampler.logprobs_out, matcher=sampler.matcher)


def penalize(logits: np.ndarray, logit_bias: Sequence[tuple[int, float]], repetition: float, frequency: float,
             presence: float, prompt_ids: np.ndarray, counts: dict[int, int]) -> np.ndarray:
    """x [V] fp32 after the bias and penalties (the input when none applies)."""
    x = logits
    n = x.shape[0]
    if logit_bias:
        x = np.array(x, dtype=np.float32)
        ids = np.array([t for t, _ in logit_bias], dtype=np.int64)
        vals = np.array([b for _, b in logit_bias], dtype=np.float32)
        ok = ids < n
        x[ids[ok]] = x[ids[ok]] + vals[ok]
    if counts and (presence != 0.0 or frequency != 0.0 or repetition != 1.0) or (repetition != 1.0 and prompt_ids.size):
        x = np.array(x, dtype=np.float32)
        out_ids = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
        out_n = np.fromiter(counts.values(), dtype=np.float32, count=len(counts))
        keep = out_ids < n
        out_ids, out_n = out_ids[keep], out_n[keep]
        if repetition != 1.0:
            seen = np.union1d(prompt_ids[prompt_ids < n], out_ids)
            r = np.float32(repetition)
            xs = x[seen]
            x[seen] = np.where(xs > 0, xs / r, xs * r)
        if presence != 0.0 or frequency != 0.0:
            x[out_ids] = x[out_ids] - (np.float32(frequency) * out_n + np.float32(presence))
    return x


def ordered_prefix(z: np.ndarray, ids: np.ndarray, n: int) -> np.ndarray:
    """The first n of `ids` (ascending) in (z descending, id ascending) order, exactly,
    partitioning before sorting."""
    vals = z[ids]
    if n < ids.size:
        kth = np.partition(vals, vals.size - n)[vals.size - n]
        above = ids[vals > kth]
        ids = np.concatenate([above, ids[vals == kth][: n - above.size]])
        vals = z[ids]
    return ids[np.lexsort((ids, -vals))]


def kept_ids(z: np.ndarray, top_k: int, top_p: float, min_p: float) -> np.ndarray:
    """The ids the sampler draws from, given z [V] fp32 (see the module docstring); top-k /
    min-p alone give them ascending, top-p in (z descending, id ascending) order."""
    n = z.shape[0]
    e = np.exp(z - z.max()).astype(np.float32) if (min_p > 0.0 or top_p < 1.0) else None
    elig = np.flatnonzero(e >= np.float32(min_p)) if (e is not None and min_p > 0.0) else np.arange(n)
    topk_on = 0 < top_k < elig.size
    pre = elig
    if topk_on:
        pre = top_k_ids(z, top_k) if elig.size == n else np.sort(ordered_prefix(z, elig, top_k))
    if top_p >= 1.0:
        return pre
    assert e is not None
    mass = int((e[pre] * FIXED_POINT).astype(np.uint64).sum(dtype=np.uint64))
    target = max(int(np.float32(np.array([mass], np.uint64).astype(np.float32)[0] * np.float32(top_p))), 1)
    width = min(pre.size, 256)
    while True:
        prefix = ordered_prefix(z, pre, width)
        cum = np.cumsum((e[prefix] * FIXED_POINT).astype(np.uint64), dtype=np.uint64)
        if int(cum[-1]) >= target or width == pre.size:
            cut = int(np.searchsorted(cum, np.uint64(target), side="left")) + 1
            return prefix[: min(cut, pre.size)]
        width = min(pre.size, width * 4)


def gumbel_max_pick(row: np.ndarray, temperature: float, seed: int, offset: int,
                    filters: PickFilters | None = None) -> int:
    """The token a pick (temperature, seed, offset, filters) takes from one logits row [V]:
    the argmax at temperature 0 (lowest id on ties), else a sample from softmax(row / T) on
    the kept ids (filters: the Sampler's semantics) by the Gumbel-max trick with noise keyed
    by (seed, offset). The CPU backend's token ring; the decode graph's sampler
    (kernels/sample_pick.py) draws its noise from Philox instead. filters.logprobs >= 0: the
    token's logprobs under the raw row go to filters.logprobs_out, as the graph's do."""
    token = _gumbel_max_token(row, temperature, seed, offset, filters)
    if filters is not None and filters.logprobs >= 0:
        from .logprobs import token_logprobs

        filters.logprobs_out[:] = [token_logprobs(np.asarray(row), token, filters.logprobs, row.shape[0])]
    return token


def _gumbel_max_token(row: np.ndarray, temperature: float, seed: int, offset: int,
                      filters: PickFilters | None) -> int:
    x = np.asarray(row, dtype=np.float32)
    if filters is not None and filters.matcher is not None:
        x = apply_token_bitmask(x, filters.matcher.allowed_tokens())
    if filters is not None:
        x = penalize(x, filters.logit_bias, filters.repetition_penalty, filters.frequency_penalty,
                     filters.presence_penalty, np.asarray(filters.prompt_ids, dtype=np.int64), filters.counts)
    if temperature <= 0.0 or (filters is not None and filters.top_k == 1):
        return int(np.argmax(x))
    z = (x / np.float32(temperature)).astype(np.float32)
    ids = kept_ids(z, filters.top_k, filters.top_p, filters.min_p) if filters is not None else np.arange(z.shape[0])
    noise = np.random.default_rng([seed, offset]).gumbel(size=z.shape[0])[ids]
    return int(ids[np.argmax(z[ids].astype(np.float64) + noise)])


TOP_K_SUBSAMPLE = 4096    # logits a top-k threshold is first estimated from


def top_k_ids(z: np.ndarray, k: int) -> np.ndarray:
    """Ascending ids of the k largest values of z [V] (0 < k < V; of several values tied at
    the k-th, the lowest ids). Exact, and cheaper than an argpartition of the whole row at a
    large vocabulary: the k-th largest value of a strided subsample is at most the k-th
    largest of z, so the values at or above it hold the top k, and only those are ordered."""
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
    return np.sort(ordered_prefix(z, cand, k))
