"""Acceptance of a verify round: which drafts the target keeps, and the token after them.

The target's logits rows [K+1, V] come from one forward over [last token, d1..dK]: row i is the
distribution of the token after d_i (row 0: after the last token). Greedy requests keep the
longest prefix of drafts equal to the argmax and add the argmax after it (exactly the plain
greedy output). Sampled requests use rejection sampling against the host sampler's filtered
distribution p (`Sampler.distribution`): a deterministic draft has a one-hot q, so d_i is kept
with probability p(d_i), and on rejection the token is drawn from p with d_i removed and
renormalized; each emitted token is then distributed exactly as plain sampling's. Knows
nothing about models or caches.
"""
from __future__ import annotations

import numpy as np

from ..sampler import Sampler


def verify_drafts(drafts: list[int], rows: np.ndarray, sampler: Sampler) -> list[int]:
    """The tokens a round emits: the accepted prefix of `drafts`, then one bonus (all kept) or
    corrected token; 1..K+1 tokens. rows [K+1, V] float32. Every emitted token is observed by
    `sampler` (penalties count it) before the next row is scored."""
    if rows.shape[0] != len(drafts) + 1:
        raise ValueError(f"{rows.shape[0]} logits rows for {len(drafts)} drafts (need K + 1)")
    out: list[int] = []
    for i, draft in enumerate(drafts):
        token = _accept_or_replace(draft, rows[i], sampler)
        out.append(token)
        sampler.observe(token)
        if token != draft:
            return out
    out.append(sampler.sample(rows[-1]))
    sampler.observe(out[-1])
    return out


def accept_greedy(drafts: list[int], picks: list[int]) -> list[int]:
    """The tokens a greedy round emits from the target's argmax ids picks [K+1] (row i: the
    token after d_i): the drafts while they equal the argmax, then the argmax after them."""
    if len(picks) != len(drafts) + 1:
        raise ValueError(f"{len(picks)} argmax ids for {len(drafts)} drafts (need K + 1)")
    out: list[int] = []
    for draft, pick in zip(drafts, picks):
        out.append(pick)
        if pick != draft:
            return out
    out.append(picks[-1])
    return out


def _accept_or_replace(draft: int, row: np.ndarray, sampler: Sampler) -> int:
    """`draft` if the target accepts it, else the target's replacement token."""
    if sampler.params.greedy:
        return sampler.sample(row)                 # the argmax: equal to the draft or replacing it
    ids, probs = sampler.distribution(row)
    return accept_one_hot(draft, ids, probs, sampler.rng)


def accept_one_hot(draft: int, ids: np.ndarray, probs: np.ndarray, rng: np.random.Generator) -> int:
    """Rejection sampling of a one-hot draft against target p (ids [N], probs [N] summing to 1):
    keep `draft` with probability p(draft), else sample p without it, renormalized. The result
    is distributed as p."""
    where = np.flatnonzero(ids == draft)
    p_draft = float(probs[where[0]]) if where.size else 0.0
    if p_draft > 0.0 and rng.random() < p_draft:
        return draft
    residual = probs.copy()
    if where.size:
        residual[where[0]] = 0.0
    total = residual.sum()
    if total <= 0.0:                               # p is one-hot at the draft (rng.random() < 1 kept it)
        return draft
    cum = np.cumsum(residual)
    pick = int(np.searchsorted(cum, rng.random() * cum[-1], side="right"))
    return int(ids[min(pick, len(ids) - 1)])
