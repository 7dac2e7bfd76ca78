"""Grouped-by-expert MoE prefill on the pipelined mma.sync GEMM of gemm_mma.py (cp.async ring,
swizzled shared tiles, ldmatrix), in place of the GEMMs of moe_grouped.py (which stage their
operands with plain 4-byte loads) from CudaOps' MOE_PIPELINED_MIN_PAIRS routed pairs up, on
GPUs without wgmma (on cc 9.0, moe_wgmma.py's 64-row tiles replace it).

After moe_grouped's hist / scan / scatter (offs [E+1] row offsets, order [P] expert-sorted
pairs), CudaOps runs:
1. `moe_tile_offsets_kernel`, grid 1: tile_off[e] = sum over e' < e of ceil(count[e'] / BM)
   for this file's BM = 128-row tiles (moe_grouped's tile_off counts 64-row tiles).
2. `moe_gather_bf16_kernel`, grid P: xs[r] = bf16(x[order[r] // k]), the routed rows as one
   contiguous expert-sorted bf16 matrix [P, H] (the GEMM's A operand, like gemm_mma's xb).
3. `moe_mma_grouped_kernel` (gate_up): G [P, 2I] fp32, G[r] = xs[r] @ gate_up[e]^T.
4. `moe_swiglu_bf16_kernel`: h [P, I] bf16, h[r, j] = bf16(silu(G[r, j]) * G[r, I + j]).
5. `moe_mma_grouped_kernel` (down, scatter = 1): y[order[r]] = weights[order[r]] * (h[r] @
   down[e]^T), fp32 [P, H] in pair order; then moe_grouped's combine sums each token's slots.
The numerics are moe_grouped's: x and h rounded to bf16, fp32 accumulation; the row order of a
sum differs, so results match it to bf16 rounding of h, not bitwise. Deterministic (no atomics).

`moe_mma_grouped_kernel`: grid (ceil(N / BN), max_row_tiles(P, E)), block 256, gemm_mma's CTA
tile and main loop (`gemm_mma._mma_tile_loop`: 128 x 128 x 32, 8 warps as 2 x 4, 3-stage
cp.async ring, one barrier per k-tile). Block
(bx, by) finds its expert e by binary search of tile_off (by >= tile_off[E]: exit at once) and
owns rows [offs[e] + 128 (by - tile_off[e]), offs[e + 1]) of the sorted list, at most 128; A
rows past the expert's last row are clamped to it (never stored), B = rows bx*128.. of the
expert's [N, K] weight. A warp whose 64 rows are all past the expert's end skips its ldmatrix
and MMAs (warp-uniform; it still copies and meets the barriers): with ~64 rows per expert in a
35B chunk that halves the tensor work of most tiles. K % 32 == 0, N even, 16-byte alignment.
Left: the G round trip (fp32 [P, 2I] written and re-read for the SwiGLU), the gather, and
128-row tiles for ~64-row experts (moe_wgmma.py has 64-row tiles). GPU only (inline PTX).
"""
from __future__ import annotations

from numba import cuda, float32, int32, uint32

from ninfer_nb.kernels.common.bf16 import from_f32
from ninfer_nb.kernels.common.nbtypes import f32_1, f32_2, i32, i32_1, u16_2, u16_3
from ninfer_nb.kernels.common.ptx import gptr, smem_u32, st_v2_f32
from ninfer_nb.kernels.common.registry import kernel
from ninfer_nb.kernels.linear.gemm_mma import (
    BM,
    BN,
    SMEM_WORDS,
    THREADS,
    _mma_tile_loop,
)
from ninfer_nb.kernels.moe.moe_grouped import _expert_rows, _silu

GATHER_THREADS = 256
SWIGLU_THREADS = 256
SWIGLU_MAX_BLOCKS = 8192


def max_row_tiles(n_pairs: int, n_exp: int) -> int:
    """Upper bound of sum_e ceil(count[e] / BM) for any routing (as moe_grouped.max_row_tiles)."""
    n_used = min(n_exp, n_pairs)
    return min(n_pairs, (n_pairs + n_used * (BM - 1)) // BM)


@kernel((i32_1, i32_1))
def moe_tile_offsets_kernel(offs, tile_off):
    """grid 1, block 32: tile_off [E+1] = exclusive prefix sum of ceil(count[e] / BM), count from
    the row offsets offs [E+1] (one thread; E is a few hundred)."""
    if cuda.threadIdx.x == 0:
        n_exp = offs.shape[0] - 1
        acc = 0
        for e in range(n_exp):
            tile_off[e] = acc
            acc += (offs[e + 1] - offs[e] + BM - 1) // BM
        tile_off[n_exp] = acc


@kernel((f32_2, i32_1, i32, u16_2))
def moe_gather_bf16_kernel(x, order, top_k, xs):
    """grid P, block GATHER_THREADS: xs[r, :] = bf16(x[order[r] // top_k, :]) (RNE)."""
    r = cuda.blockIdx.x
    src = order[r] // top_k
    for j in range(cuda.threadIdx.x, xs.shape[1], cuda.blockDim.x):
        xs[r, j] = from_f32(xs, x[src, j])


@kernel((f32_2, u16_2))
def moe_swiglu_bf16_kernel(g, h):
    """grid-stride, block SWIGLU_THREADS: h[r, j] = bf16(silu(g[r, j]) * g[r, I + j]), g [P, 2I]."""
    inter = h.shape[1]
    n = h.shape[0] * inter
    i = cuda.grid(1)
    while i < n:
        r = i // inter
        j = i - r * inter
        h[r, j] = from_f32(h, _silu(g[r, j]) * g[r, inter + j])
        i += cuda.gridsize(1)


@cuda.jit(device=True)
def _store_grouped(out, order, wt, scatter, r, c, acc, row_end, n_dim):
    """Fragment rows r, r + 8 (if < row_end), columns c, c + 1 (N even: 8-byte stores). scatter:
    the row goes to pair order[r], scaled by that pair's routing weight."""
    if c >= n_dim:
        return
    if r < row_end:
        dst = r
        s = float32(1.0)
        if scatter != 0:
            dst = order[r]
            s = wt[dst]
        st_v2_f32(out, dst * n_dim + c, acc[0] * s, acc[1] * s)
    if r + 8 < row_end:
        dst = r + 8
        s = float32(1.0)
        if scatter != 0:
            dst = order[r + 8]
            s = wt[dst]
        st_v2_f32(out, dst * n_dim + c, acc[2] * s, acc[3] * s)


@kernel((u16_2, u16_3, i32_1, i32_1, i32_1, f32_1, i32, f32_2), sim=False, launch_bounds=(THREADS, 2))
def moe_mma_grouped_kernel(xs, w, offs, tile_off, order, wt, scatter, out):
    """grid (ceil(N / BN), max_row_tiles), block 256. xs [P, K] bf16 expert-sorted rows;
    w [E, N, K] bf16; out [P, N] fp32 (sorted rows, or pair rows when scatter)."""
    smem = cuda.shared.array(SMEM_WORDS, uint32, alignment=128)
    by = int32(cuda.blockIdx.y)
    n_exp = tile_off.shape[0] - 1
    if by >= tile_off[n_exp]:
        return
    e, row0, last = _expert_rows(offs, tile_off, by, BM)
    row_end = last + 1
    pid_n = int32(cuda.blockIdx.x)
    sbase = int32(smem_u32(smem))
    tid = int32(cuda.threadIdx.x)
    lane = tid & 31
    warp = tid >> 5
    wm = warp >> 2                       # 0..1: 64-row half of the CTA tile
    wn = warp & 3                        # 0..3: 32-column quarter
    active = row0 + wm * 64 < row_end    # warp-uniform: this half holds real rows
    n_dim = w.shape[1]
    k_dim = w.shape[2]
    wp = gptr(w) + e * (n_dim * k_dim * 2)                # expert e's [N, K] weight
    c00, c01, c02, c03, c10, c11, c12, c13, c20, c21, c22, c23, c30, c31, c32, c33 = _mma_tile_loop(
        sbase, tid, wm, wn, gptr(xs), row0, row_end, wp, pid_n * BN, n_dim, k_dim, active)
    if not active:
        return
    r0 = row0 + wm * 64 + (lane >> 2)
    q0 = pid_n * BN + wn * 32 + 2 * (lane & 3)
    _store_grouped(out, order, wt, scatter, r0, q0, c00, row_end, n_dim)
    _store_grouped(out, order, wt, scatter, r0, q0 + 8, c01, row_end, n_dim)
    _store_grouped(out, order, wt, scatter, r0, q0 + 16, c02, row_end, n_dim)
    _store_grouped(out, order, wt, scatter, r0, q0 + 24, c03, row_end, n_dim)
    _store_grouped(out, order, wt, scatter, r0 + 16, q0, c10, row_end, n_dim)
    _store_grouped(out, order, wt, scatter, r0 + 16, q0 + 8, c11, row_end, n_dim)
    _store_grouped(out, order, wt, scatter, r0 + 16, q0 + 16, c12, row_end, n_dim)
    _store_grouped(out, order, wt, scatter, r0 + 16, q0 + 24, c13, row_end, n_dim)
    _store_grouped(out, order, wt, scatter, r0 + 32, q0, c20, row_end, n_dim)
    _store_grouped(out, order, wt, scatter, r0 + 32, q0 + 8, c21, row_end, n_dim)
    _store_grouped(out, order, wt, scatter, r0 + 32, q0 + 16, c22, row_end, n_dim)
    _store_grouped(out, order, wt, scatter, r0 + 32, q0 + 24, c23, row_end, n_dim)
    _store_grouped(out, order, wt, scatter, r0 + 48, q0, c30, row_end, n_dim)
    _store_grouped(out, order, wt, scatter, r0 + 48, q0 + 8, c31, row_end, n_dim)
    _store_grouped(out, order, wt, scatter, r0 + 48, q0 + 16, c32, row_end, n_dim)
    _store_grouped(out, order, wt, scatter, r0 + 48, q0 + 24, c33, row_end, n_dim)
