"""Token bitmasks: the allowed-token set of one decoding step, as int32 words [ceil(V/32)].

Bit j of word i allows token 32*i + j (little-endian bit order, the layout llguidance, xgrammar
and a device kernel share). `apply_token_bitmask` is the host reference a device kernel is
checked against. This module knows nothing about grammars.
"""
from __future__ import annotations

import numpy as np

__all__ = ["allocate_bitmask", "allowed_token_ids", "apply_token_bitmask", "bitmask_words"]


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def allocate_bitmask(vocab_size: int, batch: int | None = None) -> np.ndarray:
    """All-allowed bitmask: int32 [words], or [batch, words] when `batch` is given."""
    shape = (bitmask_words(vocab_size),) if batch is None else (batch, bitmask_words(vocab_size))
    return np.full(shape, -1, dtype=np.int32)


def _allowed_bits(bitmask: np.ndarray, vocab_size: int) -> np.ndarray:
    """bool [..., vocab_size]: which ids the bitmask allows (ids past its words are disallowed)."""
    words = np.ascontiguousarray(bitmask, dtype="<i4")
    bits = np.unpackbits(words.view(np.uint8), axis=-1, bitorder="little").astype(bool)
    if bits.shape[-1] >= vocab_size:
        return bits[..., :vocab_size]
    pad = np.zeros(bits.shape[:-1] + (vocab_size - bits.shape[-1],), dtype=bool)
    return np.concatenate([bits, pad], axis=-1)


def allowed_token_ids(bitmask: np.ndarray, vocab_size: int) -> np.ndarray:
    """int64 ids [n] allowed by a one-row bitmask [words], ascending."""
    return np.flatnonzero(_allowed_bits(bitmask, vocab_size))


def apply_token_bitmask(logits: np.ndarray, bitmask: np.ndarray) -> np.ndarray:
    """Copy of `logits` [V] or [B, V] with -inf where `bitmask` [words] or [B, words] disallows."""
    allowed = _allowed_bits(bitmask, logits.shape[-1])
    return np.where(allowed, logits, np.array(-np.inf, dtype=logits.dtype))
