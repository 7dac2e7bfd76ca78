"""The host side of the decode graph's sampler: each row's `Pick` into the device buffers that
`ops.sample_pick` reads (ops/cuda/sampling.py SamplePickBuffers), before a host-fed replay.

Penalties need the request's token counts on the device: a row's counts are uploaded (one
[vocab] int32 row: generated count | PROMPT_BIT) only when the device does not already hold
that request's counts at the pick's offset; the sampler counts every token it picks, so a
request decoding step after step uploads them once. Knows nothing about models or requests
beyond the Pick.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..kernels.sample_pick import COUNT_MASK, PROMPT_BIT
from .pick import Pick, PickFilters


def counts_row(filters: PickFilters, vocab: int) -> np.ndarray:
    """[vocab] int32: each token's generated count, PROMPT_BIT where it is in the prompt."""
    row = np.zeros(vocab, np.int32)
    if filters.repetition_penalty != 1.0:
        prompt = np.asarray(filters.prompt_ids, dtype=np.int64)
        row[prompt[(prompt >= 0) & (prompt < vocab)]] = PROMPT_BIT
    if filters.counts:
        ids = np.fromiter(filters.counts.keys(), dtype=np.int64, count=len(filters.counts))
        n = np.fromiter(filters.counts.values(), dtype=np.int64, count=len(filters.counts))
        ok = (ids >= 0) & (ids < vocab)
        row[ids[ok]] |= np.minimum(n[ok], COUNT_MASK).astype(np.int32)
    return row


class DevicePicker:
    """The sampler's parameter buffers for `rows` rows over `vocab` ids, and which request's
    counts each row holds on the device."""

    def __init__(self, ops: Any, rows: int, vocab: int) -> None:
        from ..ops.cuda.sampling import SamplePickBuffers

        self.rows, self.vocab = rows, vocab
        self.bufs = SamplePickBuffers(ops, rows, vocab)
        # per row: (filters.key, offset) whose counts the device row holds, None: nobody's
        self._held: list[tuple[int, int] | None] = [None] * rows

    def write(self, picks: Sequence[Pick]) -> None:
        """Rows 0..len(picks)-1 take these picks at the next replay (host -> device; syncs)."""
        if len(picks) > self.rows:
            raise ValueError(f"DevicePicker: {len(picks)} picks for {self.rows} rows")
        for b, pick in enumerate(picks):
            pick = Pick(*pick)
            f = pick.filters or PickFilters()
            counts = None
            if f.penalized:
                if self._held[b] != (f.key, pick.offset):
                    counts = counts_row(f, self.vocab)
                self._held[b] = (f.key, pick.offset + 1)
            else:
                self._held[b] = None
            self.bufs.set_row(b, temperature=pick.temperature, seed=pick.seed, offset=pick.offset, top_k=f.top_k,
                              top_p=f.top_p, min_p=f.min_p, repetition_penalty=f.repetition_penalty,
                              frequency_penalty=f.frequency_penalty, presence_penalty=f.presence_penalty,
                              logit_bias=dict(f.logit_bias), counts=counts)
        self.bufs.flush(len(picks))

    def stepped(self, rows: int) -> None:
        """A replay the host did not feed picked (and counted) one more token in rows 0..rows-1."""
        for b in range(rows):
            held = self._held[b]
            if held is not None:
                self._held[b] = (held[0], held[1] + 1)
