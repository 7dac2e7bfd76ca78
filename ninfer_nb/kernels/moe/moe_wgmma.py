"""Grouped-by-expert MoE prefill GEMMs on Hopper `wgmma` with 64-row tiles (sm_90a only).

A 35B prefill chunk routes ~64 rows to each expert (2048 tokens x 8 slots / 256 experts), so
moe_pipelined's 128-row mma.sync tiles are half padding, and it writes the gate|up product in
fp32 and re-reads it for the SwiGLU. Here one warpgroup owns a 64-row tile, exactly wgmma's M:
1. `moe_wgmma_gate_up_kernel`, grid (I / 64, max_row_tiles), block 128: A = the routed rows
   read straight from xb [T, H] (x in bf16) through the sorted pair list (row r of the tile is
   token order[r] // top_k: no gathered copy), B = gate rows n0 .. n0 + 63 of gate_up[e]
   followed by up rows I + n0 .. (128 tile rows), so each thread's accumulator columns j and
   j + 64 are the gate and up of one output column and the SwiGLU runs in the register
   epilogue: h[r, n0 + j] = bf16(silu(gate) * up), h [P, I] bf16 in sorted row order.
2. `moe_wgmma_down_kernel`, grid (ceil(H / 128), max_row_tiles), block 128: A = rows of h,
   B = rows n0 .. n0 + 127 of down[e]; the epilogue writes y[order[r]] = weights[order[r]] *
   (h[r] @ down[e]^T) in fp32 at the pair's own row (moe_pipelined's scatter store).
The routing bookkeeping (hist / scan / scatter: `offs`, `order`, and `tile_off` counting
64-row tiles) and the combine are moe_grouped's. Block (bx, by) finds its expert by binary
search of tile_off (by >= tile_off[E]: exit at once) and owns sorted rows
[offs[e] + 64 (by - tile_off[e]), offs[e + 1]), at most 64; A rows past the end are clamped
to the last one (computed, never stored).

Main loop (gemm_wgmma's, one warpgroup): k-tiles of 64 (128-byte K-major rows, 128B swizzle:
16-byte chunk c of row r at chunk c ^ (r & 7), tile bases 1024-byte aligned), a 4-stage
cp.async ring (A 64 rows = 8 KB + B 128 rows = 16 KB per stage: 97 KB of dynamic shared
memory, 2 CTAs per SM), prefetch distance 2, one wgmma group in flight; per k-tile 4 x
m64n128k16. Each thread copies chunk tid & 7 of tile rows tid >> 3 + 16 i (4 A rows, 8 B
rows: all the same row & 7, hence one swizzled offset).
Numerics are moe_pipelined's: x and h rounded to bf16, fp32 accumulation, deterministic.
H % 64 == 0 and I % 64 == 0 (k-tiles, gate/up pairing), 16-byte aligned operands (checked by
CudaOps). GPU only (inline PTX, sm_90a): not simulator-safe; tests/kernels compare it with
the bf16-operand NumPy reference on the GPU.
ptxas (sm_90a): gate_up 114, down 138 registers, no spills.
"""
from __future__ import annotations

from numba import cuda, int32, uint32

from ninfer_nb.kernels.common.nbtypes import f32_1, f32_2, i32, i32_1, u16_2, u16_3
from ninfer_nb.kernels.common.ptx import (
    cp_async16,
    cp_async_commit,
    cp_async_wait0,
    cp_async_wait1,
    f32_zeros_64,
    fence_proxy_async,
    gptr,
    smem_u32,
    wgmma_commit,
    wgmma_fence,
    wgmma_m64n128k16,
    wgmma_wait0,
    wgmma_wait1,
)
from ninfer_nb.kernels.common.registry import kernel
from ninfer_nb.kernels.linear.gemm_wgmma import swiglu_epilogue
from ninfer_nb.kernels.moe.moe_grouped import _expert_rows
from ninfer_nb.kernels.moe.moe_pipelined import _store_grouped

BM = 64                                    # rows per tile: moe_grouped.BM, whose tile_off we use
BN = 128                                   # B tile rows (gate_up: 64 gate + 64 up)
BN_GU = 64                                 # gate_up: output columns of I per tile
BK = 64
STAGES = 4
PREFETCH = STAGES - 2
THREADS = 128                              # one warpgroup
ROW_BYTES = BK * 2                         # 128 B: one swizzle row
A_BYTES = BM * ROW_BYTES                   # 8 KB
STAGE_BYTES = (BM + BN) * ROW_BYTES        # 24 KB (a multiple of 1024: stage bases stay aligned)
SMEM_BYTES = STAGES * STAGE_BYTES + 1024   # 97 KB: 2 CTAs per SM
K_ALIGN = 64
# descriptor high bits as gemm_wgmma: LBO 16 B, SBO 1024 B (8 rows), 128-byte swizzle
DESC_HI = (1 << 16) | (64 << 32) | (1 << 62)


@cuda.jit(device=True)
def _copy_stage(st, sw_off, go, ga0, ga1, ga2, ga3, gb0, gb1, gb2, gb3, gb4, gb5, gb6, gb7):
    """This thread's 12 16-byte chunks of k-tile (byte offset go along K) into stage st."""
    s = st + sw_off
    cp_async16(s, ga0 + go)
    cp_async16(s + 16 * ROW_BYTES, ga1 + go)
    cp_async16(s + 32 * ROW_BYTES, ga2 + go)
    cp_async16(s + 48 * ROW_BYTES, ga3 + go)
    s = s + A_BYTES
    cp_async16(s, gb0 + go)
    cp_async16(s + 16 * ROW_BYTES, gb1 + go)
    cp_async16(s + 32 * ROW_BYTES, gb2 + go)
    cp_async16(s + 48 * ROW_BYTES, gb3 + go)
    cp_async16(s + 64 * ROW_BYTES, gb4 + go)
    cp_async16(s + 80 * ROW_BYTES, gb5 + go)
    cp_async16(s + 96 * ROW_BYTES, gb6 + go)
    cp_async16(s + 112 * ROW_BYTES, gb7 + go)


@cuda.jit(device=True)
def _tile_loop(sbase, sw_off, k_dim, ga0, ga1, ga2, ga3, gb0, gb1, gb2, gb3, gb4, gb5, gb6, gb7):
    """64 x 128 tile = A rows (addresses ga*) @ B rows (gb*)^T over K: the 4-stage ring and
    wgmma loop. Returns the 64 fp32 accumulators (gemm_wgmma's fragment layout)."""
    kt_n = int32(k_dim // BK)
    for s in range(PREFETCH):
        if s < kt_n:
            _copy_stage(sbase + s * STAGE_BYTES, sw_off, s * ROW_BYTES,
                        ga0, ga1, ga2, ga3, gb0, gb1, gb2, gb3, gb4, gb5, gb6, gb7)
        cp_async_commit()
    acc = f32_zeros_64()
    for kt in range(kt_n):
        cp_async_wait1()                 # tile kt landed (this thread's copies) ...
        fence_proxy_async()              # ... visible to the async proxy (wgmma) ...
        cuda.syncthreads()               # ... and everyone else's
        st = sbase + (kt % STAGES) * STAGE_BYTES
        da = DESC_HI | (st >> 4)
        db = DESC_HI | ((st + A_BYTES) >> 4)
        wgmma_fence()
        acc = wgmma_m64n128k16(da, db, acc)
        acc = wgmma_m64n128k16(da + 2, db + 2, acc)
        acc = wgmma_m64n128k16(da + 4, db + 4, acc)
        acc = wgmma_m64n128k16(da + 6, db + 6, acc)
        wgmma_commit()
        wgmma_wait1()                    # tile kt - 1's products are done: its stage is free
        nk = kt + PREFETCH
        if nk < kt_n:
            _copy_stage(sbase + (nk % STAGES) * STAGE_BYTES, sw_off, nk * ROW_BYTES,
                        ga0, ga1, ga2, ga3, gb0, gb1, gb2, gb3, gb4, gb5, gb6, gb7)
        cp_async_commit()
    wgmma_wait0()
    cp_async_wait0()
    return acc


@kernel((u16_2, u16_3, i32_1, i32_1, i32_1, i32, u16_2), sim=False, launch_bounds=(THREADS, 2),
        dynamic_smem=SMEM_BYTES)
def moe_wgmma_gate_up_kernel(xb, w, offs, tile_off, order, top_k, h):
    """grid (I // 64, max_row_tiles), block 128. xb [T, H] bf16; w = gate_up [E, 2I, H] bf16;
    h [P, I] bf16 (sorted rows) = silu(x_r @ gate^T) * (x_r @ up^T)."""
    smem = cuda.shared.array(0, uint32)
    by = int32(cuda.blockIdx.y)
    n_exp = tile_off.shape[0] - 1
    if by >= tile_off[n_exp]:
        return
    e, row0, last = _expert_rows(offs, tile_off, by, BM)
    sbase = (int32(smem_u32(smem)) + 1023) & -1024
    tid = int32(cuda.threadIdx.x)
    r = tid >> 3
    c = tid & 7
    sw_off = r * ROW_BYTES + ((c ^ (r & 7)) << 4)
    inter = h.shape[1]
    k_dim = xb.shape[1]
    krow = k_dim * 2
    xp = gptr(xb) + c * 16
    ga0 = xp + (order[min(row0 + r, last)] // top_k) * krow
    ga1 = xp + (order[min(row0 + r + 16, last)] // top_k) * krow
    ga2 = xp + (order[min(row0 + r + 32, last)] // top_k) * krow
    ga3 = xp + (order[min(row0 + r + 48, last)] // top_k) * krow
    n0 = int32(cuda.blockIdx.x) * BN_GU
    gp = gptr(w) + e * (2 * inter * krow) + (n0 + r) * krow + c * 16       # gate row n0 + r
    up = gp + inter * krow                                                   # up row I + n0 + r
    acc = _tile_loop(sbase, sw_off, k_dim, ga0, ga1, ga2, ga3,
                     gp, gp + 16 * krow, gp + 32 * krow, gp + 48 * krow,
                     up, up + 16 * krow, up + 32 * krow, up + 48 * krow)
    # acc[4j + e]: row 16 wq + lane / 4 (+8 for e >= 2), column 8j + 2 (lane % 4) + (e & 1);
    # columns < 64 are gate, column + 64 (j + 8) the matching up
    lane = tid & 31
    ra = row0 + (tid >> 5) * 16 + (lane >> 2)
    q = n0 + 2 * (lane & 3)
    swiglu_epilogue(h, ra, q, acc, last + 1)


@kernel((u16_2, u16_3, i32_1, i32_1, i32_1, f32_1, f32_2), sim=False, launch_bounds=(THREADS, 2),
        dynamic_smem=SMEM_BYTES)
def moe_wgmma_down_kernel(h, w, offs, tile_off, order, wt, y):
    """grid (ceil(H / 128), max_row_tiles), block 128. h [P, I] bf16 sorted rows; w = down
    [E, H, I] bf16; y [P, H] fp32 in pair order: y[order[r]] = wt[order[r]] * (h[r] @ w[e]^T)."""
    smem = cuda.shared.array(0, uint32)
    by = int32(cuda.blockIdx.y)
    n_exp = tile_off.shape[0] - 1
    if by >= tile_off[n_exp]:
        return
    e, row0, last = _expert_rows(offs, tile_off, by, BM)
    sbase = (int32(smem_u32(smem)) + 1023) & -1024
    tid = int32(cuda.threadIdx.x)
    r = tid >> 3
    c = tid & 7
    sw_off = r * ROW_BYTES + ((c ^ (r & 7)) << 4)
    n_dim = w.shape[1]
    k_dim = w.shape[2]
    krow = k_dim * 2
    hp = gptr(h) + c * 16
    ga0 = hp + min(row0 + r, last) * krow
    ga1 = hp + min(row0 + r + 16, last) * krow
    ga2 = hp + min(row0 + r + 32, last) * krow
    ga3 = hp + min(row0 + r + 48, last) * krow
    n0 = int32(cuda.blockIdx.x) * BN
    wp = gptr(w) + e * (n_dim * krow) + c * 16
    nl = n_dim - 1
    acc = _tile_loop(sbase, sw_off, k_dim, ga0, ga1, ga2, ga3,
                     wp + min(n0 + r, nl) * krow, wp + min(n0 + r + 16, nl) * krow,
                     wp + min(n0 + r + 32, nl) * krow, wp + min(n0 + r + 48, nl) * krow,
                     wp + min(n0 + r + 64, nl) * krow, wp + min(n0 + r + 80, nl) * krow,
                     wp + min(n0 + r + 96, nl) * krow, wp + min(n0 + r + 112, nl) * krow)
    lane = tid & 31
    ra = row0 + (tid >> 5) * 16 + (lane >> 2)
    q = n0 + 2 * (lane & 3)
    row_end = last + 1
    _store_grouped(y, order, wt, 1, ra, q, (acc[0], acc[1], acc[2], acc[3]), row_end, n_dim)
    _store_grouped(y, order, wt, 1, ra, q + 8, (acc[4], acc[5], acc[6], acc[7]), row_end, n_dim)
    _store_grouped(y, order, wt, 1, ra, q + 16, (acc[8], acc[9], acc[10], acc[11]), row_end, n_dim)
    _store_grouped(y, order, wt, 1, ra, q + 24, (acc[12], acc[13], acc[14], acc[15]), row_end, n_dim)
    _store_grouped(y, order, wt, 1, ra, q + 32, (acc[16], acc[17], acc[18], acc[19]), row_end, n_dim)
    _store_grouped(y, order, wt, 1, ra, q + 40, (acc[20], acc[21], acc[22], acc[23]), row_end, n_dim)
    _store_grouped(y, order, wt, 1, ra, q + 48, (acc[24], acc[25], acc[26], acc[27]), row_end, n_dim)
    _store_grouped(y, order, wt, 1, ra, q + 56, (acc[28], acc[29], acc[30], acc[31]), row_end, n_dim)
    _store_grouped(y, order, wt, 1, ra, q + 64, (acc[32], acc[33], acc[34], acc[35]), row_end, n_dim)
    _store_grouped(y, order, wt, 1, ra, q + 72, (acc[36], acc[37], acc[38], acc[39]), row_end, n_dim)
    _store_grouped(y, order, wt, 1, ra, q + 80, (acc[40], acc[41], acc[42], acc[43]), row_end, n_dim)
    _store_grouped(y, order, wt, 1, ra, q + 88, (acc[44], acc[45], acc[46], acc[47]), row_end, n_dim)
    _store_grouped(y, order, wt, 1, ra, q + 96, (acc[48], acc[49], acc[50], acc[51]), row_end, n_dim)
    _store_grouped(y, order, wt, 1, ra, q + 104, (acc[52], acc[53], acc[54], acc[55]), row_end, n_dim)
    _store_grouped(y, order, wt, 1, ra, q + 112, (acc[56], acc[57], acc[58], acc[59]), row_end, n_dim)
    _store_grouped(y, order, wt, 1, ra, q + 120, (acc[60], acc[61], acc[62], acc[63]), row_end, n_dim)
