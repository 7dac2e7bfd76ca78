"""Prefill attention on the tensor-core GEMMs: S = Q K^T, a masked softmax, O = P V.

`CudaOps.attention` takes this path for prefill chunks (prefill_attention="gemm", the default).
Per kv head h and block of R query rows (row r = token t, q head j of h's group of G):

  qb [Hkv, T*G, D] bf16  q [T, Hq, D] regrouped by kv head           attn_gather_q_kernel
  kb [Hkv, Lp, D]  bf16  cache keys 0..L-1, zero rows up to Lp       attn_gather_kv_kernel
  vt [Hkv, D, Lp]  bf16  cache values, transposed, zero columns      (same kernel)
  S  [R, Lp] fp32 = qb[h] kb[h]^T                                    gemm_wgmma / gemm_mma
  P  [R, Lp] bf16 = softmax(scale S) over keys <= the row's position attn_softmax_rows_kernel
  O  [R, D]  fp32 = P vt[h]^T                                        gemm_wgmma / gemm_mma
  out[t, h G + j, :] = O[r]                                          attn_scatter_o_kernel

L is the number of keys the chunk sees (its last position + 1), Lp = L rounded up to 64 (the
GEMMs' K step). Q, K, V and the normalised P are bf16 GEMM operands; S, the softmax and O are
fp32. What it trades: S and P make one round trip through device memory (6 bytes per score),
and the masked upper triangle of the chunk's own keys is computed, then zeroed. In exchange
the products run at the GEMMs' tensor-core rate (wgmma: ~700 TFLOP/s at these shapes) instead
of a flash kernel's CUDA-core rate. Keys past the chunk's last position are zeroed in kb / vt,
so a stale cache row (even NaN) cannot reach the output.

Knows nothing about the GEMM kernels themselves (CudaOps launches them) or about models.
"""
from __future__ import annotations

import math

from numba import cuda, float32

from ninfer_nb.kernels.attention.kvquant import kv_load
from ninfer_nb.kernels.attention.paging import flat_row, paged_row
from ninfer_nb.kernels.common.bf16 import f32_to_bf16
from ninfer_nb.kernels.common.nbtypes import (
    f32,
    f32_2,
    f32_3,
    i8_3,
    i32,
    i32_1,
    i32_2,
    u16_2,
    u16_3,
)
from ninfer_nb.kernels.common.registry import KernelSpec, kernel

KEY_ALIGN = 64              # Lp = L rounded up to this (the PV GEMM's K must be a multiple of 64)
SOFTMAX_THREADS = 256
TILE = 32                   # gather/transposition tile: 32 keys x 32 dims, block (32, 8)
TILE_PITCH = 33             # shared tile row pitch (+1: conflict-free transposed reads)
NEG = -1.0e30


def padded_keys(n_keys: int) -> int:
    return (n_keys + KEY_ALIGN - 1) // KEY_ALIGN * KEY_ALIGN


@kernel((f32_3, u16_3))
def attn_gather_q_kernel(q, qb):
    """grid (T * G, Hkv), block 128: qb[h, t G + j, :] = bf16(q[t, h G + j, :])."""
    r = cuda.blockIdx.x
    h = cuda.blockIdx.y
    grp = qb.shape[1] // q.shape[0]
    t = r // grp
    head = h * grp + (r - t * grp)
    for d in range(cuda.threadIdx.x, q.shape[2], cuda.blockDim.x):
        qb[h, r, d] = f32_to_bf16(q[t, head, d])


_GATHER_SIGS = [(c, c, f32_3, f32_3, i32_1, u16_3, u16_3) for c in (f32_3, u16_3, i8_3)]


_GATHER_PAGED_SIGS = [(c, c, f32_3, f32_3, i32_1, i32_2, u16_3, u16_3) for c in (f32_3, u16_3, i8_3)]


def _make_gather_kv(paged: bool) -> KernelSpec:
    """attn_gather_kv_kernel, or attn_gather_kv_paged_kernel: the same with page_table [1, P]
    after positions (one sequence; key j at row paging.paged_row(page_table, 0, j))."""
    key_row = paged_row if paged else flat_row

    @cuda.jit(device=True, inline=True)
    def gather(k_cache, v_cache, k_scale, v_scale, positions, page_table, kb, vt):
        """grid (Lp / 32, ceil(D / 32), Hkv), block (32, 8). kb[h, key, :] = K, vt[h, :, key] = V
        (bf16) for key <= positions[-1], zero up to Lp. Any cache dtype (kv_load; int8 scales)."""
        tile = cuda.shared.array((TILE, TILE_PITCH), float32)
        k0 = cuda.blockIdx.x * TILE
        d0 = cuda.blockIdx.y * TILE
        h = cuda.blockIdx.z
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        n_keys = positions[positions.shape[0] - 1] + 1       # positions increase within a chunk
        d_head = kb.shape[2]
        d = d0 + tx
        for i in range(TILE // 8):
            key = k0 + ty + 8 * i
            kv = float32(0.0)
            vv = float32(0.0)
            if key < n_keys and d < d_head:
                row = key_row(page_table, 0, key)
                kv = kv_load(k_cache, k_scale, row, h, d)
                vv = kv_load(v_cache, v_scale, row, h, d)
            if d < d_head:
                kb[h, key, d] = f32_to_bf16(kv)
            tile[ty + 8 * i, tx] = vv
        cuda.syncthreads()
        for i in range(TILE // 8):
            dd = d0 + ty + 8 * i
            if dd < d_head:
                vt[h, dd, k0 + tx] = f32_to_bf16(tile[tx, ty + 8 * i])

    if paged:
        def attn_gather_kv_paged_kernel(k_cache, v_cache, k_scale, v_scale, positions, page_table, kb, vt):
            gather(k_cache, v_cache, k_scale, v_scale, positions, page_table, kb, vt)

        return kernel(*_GATHER_PAGED_SIGS)(attn_gather_kv_paged_kernel)

    def attn_gather_kv_kernel(k_cache, v_cache, k_scale, v_scale, positions, kb, vt):
        gather(k_cache, v_cache, k_scale, v_scale, positions, positions, kb, vt)

    return kernel(*_GATHER_SIGS)(attn_gather_kv_kernel)


attn_gather_kv_kernel = _make_gather_kv(False)
attn_gather_kv_paged_kernel = _make_gather_kv(True)


@kernel((f32_2, i32_1, i32, i32, f32, u16_2))
def attn_softmax_rows_kernel(s, positions, row0, grp, scale, p):
    """grid R, block 256. Row r of this block of rows is global row row0 + r (token
    (row0 + r) // grp): p[r, c] = exp(scale s[r, c] - m) / l for c <= positions[token], with m,
    l the row's max and sum of exponentials over those columns; 0 for later columns."""
    sm_m = cuda.shared.array(SOFTMAX_THREADS, float32)
    sm_l = cuda.shared.array(SOFTMAX_THREADS, float32)
    r = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    n_cols = s.shape[1]
    n_valid = min(positions[(row0 + r) // grp] + 1, n_cols)
    m = float32(NEG)
    l = float32(0.0)
    for c in range(tid, n_valid, SOFTMAX_THREADS):       # online max and sum, one pass
        x = s[r, c] * scale
        if x > m:
            l = l * math.exp(m - x) + float32(1.0)
            m = x
        else:
            l += math.exp(x - m)
    sm_m[tid] = m
    sm_l[tid] = l
    cuda.syncthreads()
    step = SOFTMAX_THREADS // 2
    while step > 0:                                       # tree merge of the (m, l) pairs
        if tid < step:
            m1 = sm_m[tid]
            m2 = sm_m[tid + step]
            mm = max(m1, m2)
            sm_l[tid] = sm_l[tid] * math.exp(m1 - mm) + sm_l[tid + step] * math.exp(m2 - mm)
            sm_m[tid] = mm
        cuda.syncthreads()
        step //= 2
    m = sm_m[0]
    inv = float32(1.0) / sm_l[0] if sm_l[0] > float32(0.0) else float32(0.0)
    for c in range(tid, n_cols, SOFTMAX_THREADS):
        v = math.exp(s[r, c] * scale - m) * inv if c < n_valid else float32(0.0)
        p[r, c] = f32_to_bf16(v)


@kernel((f32_2, i32, i32, i32, i32, f32_2))
def attn_scatter_o_kernel(o, row0, h, grp, hq, out):
    """grid R, block 128: out[t Hq + h G + j, :] = o[r, :] for global row row0 + r = t G + j;
    out is [T * Hq, D]."""
    r = cuda.blockIdx.x
    g_row = row0 + r
    t = g_row // grp
    dst = t * hq + h * grp + (g_row - t * grp)
    for d in range(cuda.threadIdx.x, o.shape[1], cuda.blockDim.x):
        out[dst, d] = o[r, d]
