"""Partial NeoX rotary embedding on the first `rotary_dim` dims of each head.

x [T, heads, D] fp32 -> out (same shape); positions [T] int32 read from device memory. Angles
and sin/cos are computed in float64 (positions up to 2^18 need it), like the NumPy reference.

`qk_norm_rope_store_kernel`: an attention layer's whole prologue in one launch (q / k head
norms, RoPE on q and k, K / V into an fp32 or bf16 cache), instead of five: two rms_norm, two
rope, one kv_store. Each launch is ~2 us plus a ~1 us gap in a decode graph (H200 profile).
"""
from __future__ import annotations

import math

from numba import cuda, float32

from ninfer_nb.kernels.common.bf16 import from_f32
from ninfer_nb.kernels.common.nbtypes import f32, f32_1, f32_3, f64, i32, i32_1, u16_3
from ninfer_nb.kernels.common.registry import kernel
from ninfer_nb.kernels.norm import MAX_BLOCK, _block_sum

FUSED_MAX_D = 256         # qk_norm_rope_store: one head row per block, one element per thread


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


@kernel(*[(f32_3, f32_3, f32_3, f32_1, f32_1, i32, i32_1, i32, f64, f32, c, c, f32_3) for c in (f32_3, u16_3)])
def qk_norm_rope_store_kernel(q, k, v, q_norm, k_norm, has_norm, positions, rotary_dim, theta, eps,
                              k_cache, v_cache, q_out):
    """grid (Hq + Hkv, T), block: a power of two >= D (<= FUSED_MAX_D), thread i owns dim i.
    Block (h, t): row = q[t, h] (h < Hq) or k[t, h - Hq]; rms-normed with q_norm / k_norm when
    has_norm; RoPE at positions[t] (the rotated pair meets in shared memory); the q row goes to
    q_out [T, Hq, D], the k row and v[t, h - Hq] to the caches at row positions[t]."""
    red = cuda.shared.array(MAX_BLOCK, float32)
    row = cuda.shared.array(FUSED_MAX_D, float32)
    h = cuda.blockIdx.x
    t = cuda.blockIdx.y
    i = cuda.threadIdx.x
    hq = q.shape[1]
    d = q.shape[2]
    is_q = h < hq
    hk = h - hq
    x = float32(0.0)
    if i < d:
        x = q[t, h, i] if is_q else k[t, hk, i]
    if has_norm != 0:
        ss = _block_sum(red, x * x)
        if i < d:
            x = (x * (float32(1.0) / math.sqrt(ss / float32(d) + eps))) * (q_norm[i] if is_q else k_norm[i])
    if i < d:
        row[i] = x
    cuda.syncthreads()
    half = rotary_dim // 2
    y = x
    if i < rotary_dim:
        j = i if i < half else i - half
        inv_freq = 1.0 / (theta ** ((2.0 * j) / rotary_dim))
        ang = float(positions[t]) * inv_freq
        c = math.cos(ang)
        s = math.sin(ang)
        if i < half:
            y = float(row[i]) * c - float(row[i + half]) * s
        else:
            y = float(row[i]) * c + float(row[i - half]) * s
    if i < d:
        if is_q:
            q_out[t, h, i] = y
        else:
            p = positions[t]
            k_cache[p, hk, i] = from_f32(k_cache, y)
            v_cache[p, hk, i] = from_f32(v_cache, v[t, hk, i])
