"""Partial NeoX rotary embedding on the first rotary_dim dims of each head, from a table.

x [T, heads, D] fp32 -> out (same shape); positions [T] int32 read from device memory; table
[3, rotary_dim/2] fp32 (models/rope.py): rows inv_freq hi and lo (inv_freq = hi + lo) and the
cos/sin amplitude (yarn's attention factor, else 1). `rope_angle` forms position * inv_freq in
float64 and reduces it to [-pi, pi] there, so fp32 cos/sin of the remainder are good to ~2e-7
at any position up to 2^18 (an fp32 angle would be off by ~0.016 rad at 262143).

`qk_norm_rope_store_kernel`: an attention layer's whole prologue in one launch (q / k head
norms, RoPE on q and k, K / V into an fp32 or bf16 cache), instead of five: two rms_norm, two
rope, one kv_store.
"""
from __future__ import annotations

import math

from numba import cuda, float32, float64

from ninfer_nb.kernels.attention.paging import flat_row, paged_row, seq_of
from ninfer_nb.kernels.common.bf16 import from_f32
from ninfer_nb.kernels.common.nbtypes import f32, f32_1, f32_2, f32_3, i32, i32_1, i32_2, u16_3
from ninfer_nb.kernels.common.registry import KernelSpec, kernel
from ninfer_nb.kernels.norm import MAX_BLOCK, _block_sum

FUSED_MAX_D = 256         # qk_norm_rope_store: one head row per block, one element per thread
TWO_PI = 2.0 * math.pi
INV_TWO_PI = 1.0 / TWO_PI


@cuda.jit(device=True, inline=True)
def rope_angle(position, table, j):
    """(cos, sin) * amplitude of pair j at this position, in float32: the angle
    position * (hi + lo) and its reduction mod 2 pi in float64, cos / sin of the remainder in
    float32."""
    ang = float64(position) * (float64(table[0, j]) + float64(table[1, j]))
    r = float32(ang - math.floor(ang * INV_TWO_PI + 0.5) * TWO_PI)
    amp = table[2, j]
    return math.cos(r) * amp, math.sin(r) * amp


@kernel((f32_3, i32_1, f32_2, f32_3))
def rope_kernel(x, positions, table, out):
    """grid (heads, T), block 128: thread i rotates pair (i, i + half), then copies the tail."""
    h = cuda.blockIdx.x
    t = cuda.blockIdx.y
    d = x.shape[2]
    half = table.shape[1]
    pos = positions[t]
    for i in range(cuda.threadIdx.x, half, cuda.blockDim.x):
        c, s = rope_angle(pos, table, i)
        x1 = x[t, h, i]
        x2 = x[t, h, i + half]
        out[t, h, i] = x1 * c - x2 * s
        out[t, h, i + half] = x2 * c + x1 * s
    for i in range(2 * half + cuda.threadIdx.x, d, cuda.blockDim.x):
        out[t, h, i] = x[t, h, i]


def _make_qk_norm_rope_store(paged: bool) -> KernelSpec:
    """qk_norm_rope_store_kernel (k / v rows at the positions), or
    qk_norm_rope_store_paged_kernel: page_table [B, P] after the caches, token t's row through
    its sequence's table row (kernels/attention/paging.py)."""
    key_row = paged_row if paged else flat_row

    @cuda.jit(device=True, inline=True)
    def prologue(q, k, v, q_norm, k_norm, has_norm, positions, table, eps, k_cache, v_cache, page_table, q_out):
        """grid (Hq + Hkv, T), block: a power of two >= D (<= FUSED_MAX_D), thread i owns dim i.
        Block (h, t): row = q[t, h] (h < Hq) or k[t, h - Hq]; rms-normed with q_norm / k_norm when
        has_norm; RoPE at positions[t] by the table (the pair meets in shared memory); the q row goes
        to q_out [T, Hq, D], the k row and v[t, h - Hq] to the caches at token t's row."""
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
        half = table.shape[1]
        y = x
        if i < 2 * half:
            j = i if i < half else i - half
            c, s = rope_angle(positions[t], table, j)
            if i < half:
                y = row[i] * c - row[i + half] * s
            else:
                y = row[i] * c + row[i - half] * s
        if i < d:
            if is_q:
                q_out[t, h, i] = y
            else:
                p = key_row(page_table, seq_of(t, positions.shape[0], page_table.shape[0]), positions[t])
                k_cache[p, hk, i] = from_f32(k_cache, y)
                v_cache[p, hk, i] = from_f32(v_cache, v[t, hk, i])

    if paged:
        def qk_norm_rope_store_paged_kernel(q, k, v, q_norm, k_norm, has_norm, positions, table, eps,
                                            k_cache, v_cache, page_table, q_out):
            prologue(q, k, v, q_norm, k_norm, has_norm, positions, table, eps, k_cache, v_cache, page_table, q_out)

        return kernel(*[(f32_3, f32_3, f32_3, f32_1, f32_1, i32, i32_1, f32_2, f32, c, c, i32_2, f32_3)
                        for c in (f32_3, u16_3)])(qk_norm_rope_store_paged_kernel)

    def qk_norm_rope_store_kernel(q, k, v, q_norm, k_norm, has_norm, positions, table, eps,
                                  k_cache, v_cache, q_out):
        prologue(q, k, v, q_norm, k_norm, has_norm, positions, table, eps, k_cache, v_cache, positions, q_out)

    return kernel(*[(f32_3, f32_3, f32_3, f32_1, f32_1, i32, i32_1, f32_2, f32, c, c, f32_3)
                    for c in (f32_3, u16_3)])(qk_norm_rope_store_kernel)


qk_norm_rope_store_kernel = _make_qk_norm_rope_store(False)
qk_norm_rope_store_paged_kernel = _make_qk_norm_rope_store(True)
