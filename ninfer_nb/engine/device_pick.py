"""The host side of the decode graph's sampler: each row's `Pick` into the device buffers that
`ops.sample_pick` reads (ops/cuda/sampling.py SamplePickBuffers), before a host-fed replay.

Penalties need the request's token counts on the device: a row's counts are uploaded (one
[vocab] int32 row: generated count | PROMPT_BIT) only when the device does not already hold
that request's counts at the pick's offset; the sampler counts every token it picks, so a
request decoding step after step uploads them once. Knows nothing about models or requests
beyond the Pick.

A pick that asks for logprobs (PickFilters.logprobs >= 0) makes the step also run
ops.token_logprobs on the raw rows: each row's chosen token's logprob and its LOGPROBS_TOP
most likely alternatives come back ([B, 1 + 20] fp32 and [B, 20] int32, not the rows), and
`deliver_logprobs` hands each row its first `logprobs` of them (PickFilters.logprobs_out).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..kernels.sample_pick import COUNT_MASK, PROMPT_BIT
from .logprobs import MAX_TOP_LOGPROBS, TokenLogprobs
from .pick import Pick, PickFilters

LOGPROBS_TOP = MAX_TOP_LOGPROBS      # alternatives a step with logprobs computes per row (one graph for any k)


def wants_logprobs(picks: Sequence[Pick]) -> bool:
    """Some pick asks for logprobs (the step computes them for every row)."""
    return any(p[3] is not None and p[3].logprobs >= 0 for p in picks)


def deliver_logprobs(picks: Sequence[Pick], tokens: np.ndarray, values: np.ndarray, ids: np.ndarray) -> None:
    """Each pick that asks for logprobs gets its row's: tokens [B] the picked ids, values
    [B, 1 + LOGPROBS_TOP] (the token's logprob, then the alternatives'), ids [B, LOGPROBS_TOP]."""
    for b, pick in enumerate(picks):
        f = pick[3]
        if f is None or f.logprobs < 0:
            continue
        top = tuple((int(ids[b, j]), float(values[b, 1 + j])) for j in range(f.logprobs))
        f.logprobs_out[:] = [TokenLogprobs(int(tokens[b]), float(values[b, 0]), top)]


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

    def write(self, picks: Sequence[Pick], masks: bool = True) -> None:
        """Rows 0..len(picks)-1 take these picks at the next replay (host -> device; syncs).
        masks False: the grammar rows' bitmasks come later (write_masks_async)."""
        if len(picks) > self.rows:
            raise ValueError(f"DevicePicker: {len(picks)} picks for {self.rows} rows")
        row_masks = self._masks(picks) if masks else {}
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
                              logit_bias=dict(f.logit_bias), counts=counts, mask=row_masks.get(b),
                              has_mask=f.matcher is not None)
        self.bufs.flush(len(picks))

    def write_masks_async(self, picks: Sequence[Pick]) -> None:
        """The grammar rows' bitmasks as their grammars allow now, uploaded without a sync
        (ordered on the stream before the next launch: a forward may still run)."""
        for b, mask in self._masks(picks).items():
            self.bufs.put_mask_async(b, mask)

    @staticmethod
    def _masks(picks: Sequence[Pick]) -> dict[int, np.ndarray]:
        """Row -> the bitmask its grammar allows now (the rows' masks computed in parallel)."""
        rows = [(b, p[3].matcher) for b, p in enumerate(picks) if p[3] is not None and p[3].matcher is not None]
        if not rows:
            return {}
        from ..structured.constraint import Matcher, fill_batch_bitmask

        out = np.empty((len(rows), rows[0][1].words), np.int32)
        if len(rows) > 1 and all(isinstance(m, Matcher) and m.words == out.shape[1] for _, m in rows):
            fill_batch_bitmask([m for _, m in rows], out)
            return {b: out[i] for i, (b, _) in enumerate(rows)}
        return {b: m.allowed_tokens() for b, m in rows}

    def stepped(self, rows: int) -> None:
        """A replay the host did not feed picked (and counted) one more token in rows 0..rows-1."""
        for b in range(rows):
            held = self._held[b]
            if held is not None:
                self._held[b] = (held[0], held[1] + 1)
