"""Paged KV caches: where a sequence's key at position p lives.

A paged cache is the usual [rows, Hkv, D] array cut into pages of PAGE tokens (consecutive
rows); sequence b's position p is row page_table[b, p // PAGE] * PAGE + p % PAGE (page_table
[B, P] int32 in device memory). A batch of T tokens holds B sequences of T / B tokens each, so
token t belongs to sequence t // (T / B) (ops/base.py). Without a page table the row is the
position itself: the kernels built for that case take `flat_row`, which ignores the table, so
the single-sequence kernels do no extra work. Knows nothing of models or requests.
"""
from __future__ import annotations

from numba import cuda

from ninfer_nb.kernels.common.nbtypes import i32_1, i32_2
from ninfer_nb.kernels.common.registry import kernel

PAGE = 64                      # tokens per page (ops/base.py PAGE_SIZE)
PAGE_SHIFT = 6
PAGE_MASK = PAGE - 1
assert 1 << PAGE_SHIFT == PAGE


@cuda.jit(device=True, inline=True)
def paged_row(page_table, b, j):
    """Cache row of sequence b's key at position j."""
    return page_table[b, j >> PAGE_SHIFT] * PAGE + (j & PAGE_MASK)


@cuda.jit(device=True, inline=True)
def flat_row(page_table, b, j):
    """The contiguous cache's row of position j (page_table and b unused)."""
    return j


@cuda.jit(device=True, inline=True)
def seq_of(t, n_tokens, n_seqs):
    """The sequence of token t in a batch of n_tokens tokens over n_seqs equal sequences."""
    return t // (n_tokens // n_seqs)


@kernel((i32_1, i32_2, i32_1))
def cache_rows_kernel(positions, page_table, rows):
    """grid ceil(T / 128), block 128: rows[t] = the cache row of token t at positions[t]."""
    t = cuda.grid(1)
    n = positions.shape[0]
    if t < n:
        rows[t] = paged_row(page_table, seq_of(t, n, page_table.shape[0]), positions[t])
