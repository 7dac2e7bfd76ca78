"""Depthwise causal conv1d + SiLU with a rolling state (Gated DeltaNet input conv).

x [T, C] fp32, conv_state [K-1, C] fp32 (oldest first, updated in place), weight [C, K] fp32
(tap K-1 multiplies the current input), K <= 8.

* `causal_conv1d_kernel`: one thread per channel walks the tokens and rolls the state (decode
  and short chunks: one launch).
* `conv1d_tokens_kernel` + `conv1d_state_kernel`: prefill chunks. The first computes every
  (token, channel) output in parallel, TOKENS_PER_THREAD tokens per thread, reading the window
  from x or the old state, and writes nothing else; the second then rolls the state (one thread
  per channel), so no block reads a state row another block has already overwritten.
  The first can write its output already split by channel ranges (CudaOps.causal_conv1d_split:
  the GDN's q | k | v, each part a contiguous [T, width] block), which saves the separate
  split pass over [T, C].
"""
from __future__ import annotations

import math

from numba import cuda, float32

from ninfer_nb.kernels.common.nbtypes import f32_1, f32_2, i32
from ninfer_nb.kernels.common.registry import kernel
from ninfer_nb.kernels.elementwise import split_part

MAX_K = 8


@kernel((f32_2, f32_2, f32_2, f32_2))
def causal_conv1d_kernel(x, conv_state, weight, out):
    """grid ceil(C / 128), block 128."""
    win = cuda.local.array(MAX_K, float32)
    c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if c >= x.shape[1]:
        return
    kw = weight.shape[1]
    for j in range(MAX_K):
        win[j] = conv_state[j, c] if j < kw - 1 else float32(0.0)
    for t in range(x.shape[0]):
        cur = x[t, c]
        y = float32(0.0)
        for j in range(MAX_K):
            if j < kw - 1:
                y += win[j] * weight[c, j]
        y += cur * weight[c, kw - 1]
        for j in range(MAX_K - 1):
            if j < kw - 2:
                win[j] = win[j + 1]
        if kw >= 2:
            win[kw - 2] = cur
        out[t, c] = y / (float32(1.0) + math.exp(-y))
    for j in range(MAX_K):
        if j < kw - 1:
            conv_state[j, c] = win[j]


TOKENS_PER_THREAD = 16
PARALLEL_MIN_T = 32         # shorter chunks: the serial kernel (one launch)


@cuda.jit(device=True)
def _part_of(c, b1, b2, n_ch, n_tok):
    """Channel c's place in the split output: (out index of (token 0, c), its part's width);
    parts [0, b1), [b1, b2), [b2, n_ch), each a contiguous [T, width] block at (first channel) * T
    (elementwise.split's layout)."""
    lo, hi = split_part(c, n_ch, b1, b2, n_ch)
    return lo * n_tok + (c - lo), hi - lo


@kernel((f32_2, f32_2, f32_2, f32_1, i32, i32))
def conv1d_tokens_kernel(x, conv_state, weight, out, b1, b2):
    """grid (ceil(C / 128), ceil(T / TOKENS_PER_THREAD)), block 128; reads conv_state only.
    out: flat [T * C], the channels split at b1 <= b2 into up to three parts, each a
    contiguous [T, part width] block at offset (first channel) * T: what `split` would copy
    out of a [T, C] result (b1 = b2 = C: one part, out is [T, C])."""
    taps = cuda.local.array(MAX_K, float32)
    win = cuda.local.array(MAX_K, float32)
    c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    n_ch = x.shape[1]
    if c >= n_ch:
        return
    kw = weight.shape[1]
    n_tok = x.shape[0]
    base, width = _part_of(c, b1, b2, n_ch, n_tok)
    t0 = cuda.blockIdx.y * TOKENS_PER_THREAD
    for j in range(MAX_K):
        taps[j] = weight[c, j] if j < kw else float32(0.0)
    for j in range(MAX_K):                     # the kw - 1 inputs before t0, oldest first
        if j < kw - 1:
            src = t0 - (kw - 1) + j            # < 0: from the state (row kw - 1 + src)
            win[j] = x[src, c] if src >= 0 else conv_state[(kw - 1 + src) & 0xFFFF, c]
    for i in range(TOKENS_PER_THREAD):
        t = t0 + i
        if t < n_tok:
            cur = x[t, c]
            y = cur * taps[kw - 1]
            for j in range(MAX_K):
                if j < kw - 1:
                    y += win[j] * taps[j]
            for j in range(MAX_K - 1):
                if j < kw - 2:
                    win[j] = win[j + 1]
            if kw >= 2:
                win[kw - 2] = cur
            out[base + t * width] = y / (float32(1.0) + math.exp(-y))


@kernel((f32_2, f32_2, f32_2, f32_1, i32, i32))
def conv1d_tokens_k4_kernel(x, conv_state, weight, out, b1, b2):
    """conv1d_tokens_kernel for the models' kernel width 4 (weight [C, 4]): the taps and the
    3-input window are scalars, so they stay in registers. The general kernel indexes its
    window and taps with the runtime width and keeps them in local memory (64-byte stack
    frame), about twice as slow."""
    c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    n_ch = x.shape[1]
    if c >= n_ch:
        return
    n_tok = x.shape[0]
    base, width = _part_of(c, b1, b2, n_ch, n_tok)
    t0 = cuda.blockIdx.y * TOKENS_PER_THREAD
    w0 = weight[c, 0]
    w1 = weight[c, 1]
    w2 = weight[c, 2]
    w3 = weight[c, 3]
    p0 = x[t0 - 3, c] if t0 >= 3 else conv_state[t0 & 0xFFFF, c]          # inputs t0-3 .. t0-1
    p1 = x[t0 - 2, c] if t0 >= 2 else conv_state[(t0 + 1) & 0xFFFF, c]
    p2 = x[t0 - 1, c] if t0 >= 1 else conv_state[2, c]
    for i in range(TOKENS_PER_THREAD):
        t = t0 + i
        if t < n_tok:
            cur = x[t, c]
            y = p0 * w0 + p1 * w1 + p2 * w2 + cur * w3
            p0 = p1
            p1 = p2
            p2 = cur
            out[base + t * width] = y / (float32(1.0) + math.exp(-y))


@kernel((f32_2, f32_2))
def conv1d_state_kernel(x, conv_state):
    """grid ceil(C / 128), block 128: conv_state <- the last K-1 rows of [conv_state; x]
    (ascending rows: row j reads row j + T > j of the old state before anyone writes it)."""
    c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if c >= x.shape[1]:
        return
    n_tok = x.shape[0]
    n_state = conv_state.shape[0]
    for j in range(n_state):
        src = n_tok + j - n_state              # row of x, or (< 0) row n_state + src of the state
        conv_state[j, c] = x[src, c] if src >= 0 else conv_state[(n_state + src) & 0xFFFF, c]
