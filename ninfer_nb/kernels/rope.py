"""Partial NeoX rotary embedding on the first `rotary_dim` dims of each head.

x [T, heads, D] fp32 -> out (same shape); positions [T] int32 read from device memory. Angles
and sin/cos are computed in float64 (positions up to 2^18 need it), like the NumPy reference.
"""
from __future__ import annotations

import math

from numba import cuda

from ninfer_nb.kernels.nbtypes import f32_3, f64, i32, i32_1
from ninfer_nb.kernels.registry import kernel


@kernel((f32_3, i32_1, f32_3, i32, f64))
def rope_kernel(x, positions, out, rotary_dim, theta):
    """grid (heads, T), block 128: thread i rotates pair (i, i + half), then copies the tail."""
    h = cuda.blockIdx.x
    t = cuda.blockIdx.y
    d = x.shape[2]
    half = rotary_dim // 2
    pos = float(positions[t])
    for i in range(cuda.threadIdx.x, half, cuda.blockDim.x):
        inv_freq = 1.0 / (theta ** ((2.0 * i) / rotary_dim))
        ang = pos * inv_freq
        c = math.cos(ang)
        s = math.sin(ang)
        x1 = float(x[t, h, i])
        x2 = float(x[t, h, i + half])
        out[t, h, i] = x1 * c - x2 * s
        out[t, h, i + half] = x2 * c + x1 * s
    for i in range(rotary_dim + cuda.threadIdx.x, d, cuda.blockDim.x):
        out[t, h, i] = x[t, h, i]
