"""Depthwise causal conv1d + SiLU with a rolling state (Gated DeltaNet input conv).

x [T, C] fp32, conv_state [K-1, C] fp32 (oldest first, updated in place), weight [C, K] fp32
(tap K-1 multiplies the current input), K <= 8. One thread per channel walks the tokens.
"""
from __future__ import annotations

import math

from numba import cuda, float32

from ninfer_nb.kernels.nbtypes import f32_2
from ninfer_nb.kernels.registry import kernel

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
        out[t, c] = y / (1.0 + math.exp(-y))
    for j in range(MAX_K):
        if j < kw - 1:
            conv_state[j, c] = win[j]
