"""Hopper (sm_90a) tensor-core GEMM for prefill: out[M, N] (fp32) = xb[M, K] @ W[N, K]^T (+ bias).

Same contract as `gemm_mma_kernel` (x already rounded to bf16 by `f32_to_bf16_kernel`, W bf16
as uint16, K % 64 == 0, 16-byte aligned operands, ragged M and N), but the products run on
`wgmma.mma_async` instead of `mma.sync`; `CudaOps.linear` picks it on cc 9.0 for M >= 256.

Design (the best large-M configuration of the design spike, about twice mma.sync's rate):
* CTA tile 256 x 128 x 64, 4 warpgroups (512 threads); warpgroup g owns rows 64g..64g+63 of the
  tile and all 128 columns: one m64n128k16 wgmma per 16-wide k step, 64 fp32 accumulators per
  thread (one UniTuple, tied asm operands, so registers).
* The tensor cores read A and B straight from shared memory through descriptors: K-major
  tiles with 128-byte rows (64 bf16), the 128B-swizzle layout (16-byte chunk c of row r stored
  at chunk c ^ (r & 7), tile bases 1024-byte aligned; what TMA SWIZZLE_128B would write).
  Descriptor: start >> 4 | LBO 16 B | SBO 1024 B (8 rows) | swizzle mode 1; +32 B per k16 step.
* 4-stage ring filled with 16-byte `cp.async` by all threads (6 chunks each per stage),
  prefetch distance 2, one wgmma group kept in flight (`wgmma.wait_group 1`), so the stage being
  refilled was read two tiles ago. Per k-tile: wait for the copies, `fence.proxy.async` (make
  the generic-proxy writes visible to the async proxy), barrier, 4 wgmma, commit.
* 4 x 48 KB stages + 1 KB for alignment = 193 KB of dynamic shared memory (the kernel is
  opted in through `KernelSpec.dynamic_smem`); 1 CTA per SM.
* Ragged M / N: loads clamp rows to the last valid one (their products are never stored);
  the epilogue is `gemm_mma._store_rows` (predicated, + bias, 8-byte stores when N is even).
* Grouped rasterisation (GROUP_M = 8) as in gemm_mma.
`gemm_wgmma_swiglu_kernel` is the MLP's gate_up GEMM with the SwiGLU in its epilogue: the
CTA's 128 B rows are gate rows n0.. n0+63 and the matching up rows, so each thread holds the
gate and up of its outputs and writes h = bf16(silu(gate) * up) [M, I], the down GEMM's bf16
operand as is (CudaOps.linear_swiglu returns it as uint16; `linear` takes it without the fp32
-> bf16 pass). Same values as the unfused path (its fp32 h is rounded the same way before the
down GEMM). tests/kernels/test_gemm_mma_gpu.py checks it against NumPy and mma.sync.
"""
from __future__ import annotations

import math

from numba import cuda, float32, int32, uint32

from ninfer_nb.kernels.common.bf16 import from_f32
from ninfer_nb.kernels.common.nbtypes import f32_1, f32_2, i32, u16_2
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
from ninfer_nb.kernels.linear.gemm_mma import _store_rows, grouped_tile

BM = 256
BN = 128
BK = 64
STAGES = 4
PREFETCH = STAGES - 2                      # tiles in flight ahead of the one being multiplied
THREADS = 128 * (BM // 64)                 # one warpgroup per 64 rows
ROW_BYTES = BK * 2                         # 128 B: one swizzle row
A_BYTES = BM * ROW_BYTES                   # 32 KB
STAGE_BYTES = (BM + BN) * ROW_BYTES        # 48 KB
SMEM_BYTES = STAGES * STAGE_BYTES + 1024   # + room to align the ring to 1024 B
MIN_M = 256                                # below this the 256-row tile is mostly padding
K_ALIGN = 64
# descriptor high bits: LBO = 16 B (>> 4 = 1, unused for swizzled K-major), SBO = 1024 B
# (>> 4 = 64: the stride between 8-row core-matrix groups), bits 62-63 = 1: 128-byte swizzle
DESC_HI = (1 << 16) | (64 << 32) | (1 << 62)


def gemm_grid(m: int, n: int) -> int:
    return ((m + BM - 1) // BM) * ((n + BN - 1) // BN)


@cuda.jit(device=True)
def _copy_stage(st, sa, sb, go, ga0, ga1, ga2, ga3, gb0, gb1):
    """This thread's 6 16-byte chunks of one k-tile (byte offset go along K) into stage st."""
    cp_async16(st + sa, ga0 + go)
    cp_async16(st + sa + 64 * ROW_BYTES, ga1 + go)
    cp_async16(st + sa + 128 * ROW_BYTES, ga2 + go)
    cp_async16(st + sa + 192 * ROW_BYTES, ga3 + go)
    cp_async16(st + sb, gb0 + go)
    cp_async16(st + sb + 64 * ROW_BYTES, gb1 + go)


@cuda.jit(device=True)
def _tile_loop(sbase, wg, sa, sb, k_dim, ga0, ga1, ga2, ga3, gb0, gb1):
    """The 256 x 128 CTA tile's main loop: A rows at ga0..ga3 (tile rows r + 64 i), B rows at
    gb0, gb1 (tile rows r, r + 64); returns warpgroup wg's 64 fp32 accumulators."""
    kt_n = int32(k_dim // BK)
    for s in range(PREFETCH):
        if s < kt_n:
            _copy_stage(sbase + s * STAGE_BYTES, sa, sb, s * ROW_BYTES, ga0, ga1, ga2, ga3, gb0, gb1)
        cp_async_commit()
    acc = f32_zeros_64()                 # 64 fp32 accumulators per thread
    for kt in range(kt_n):
        cp_async_wait1()                 # PREFETCH - 1 groups may still fly: tile kt landed
        fence_proxy_async()              # our generic-proxy smem writes -> visible to wgmma
        cuda.syncthreads()               # ... and everyone else's
        st = sbase + (kt % STAGES) * STAGE_BYTES
        da = DESC_HI | ((st + wg * 64 * ROW_BYTES) >> 4)
        db = DESC_HI | ((st + A_BYTES) >> 4)
        wgmma_fence()
        acc = wgmma_m64n128k16(da, db, acc)
        acc = wgmma_m64n128k16(da + 2, db + 2, acc)
        acc = wgmma_m64n128k16(da + 4, db + 4, acc)
        acc = wgmma_m64n128k16(da + 6, db + 6, acc)
        wgmma_commit()
        wgmma_wait1()                    # tile kt - 1's group is done: its stage may be reused
        nk = kt + PREFETCH
        if nk < kt_n:
            _copy_stage(sbase + (nk % STAGES) * STAGE_BYTES, sa, sb, nk * ROW_BYTES, ga0, ga1, ga2, ga3, gb0, gb1)
        cp_async_commit()
    wgmma_wait0()
    cp_async_wait0()
    return acc


@kernel((u16_2, u16_2, f32_1, f32_2, i32), sim=False, launch_bounds=(THREADS, 1), dynamic_smem=SMEM_BYTES)
def gemm_wgmma_kernel(xb, w, bias, out, has_bias):
    """grid gemm_grid(M, N), block 512, SMEM_BYTES dynamic shared memory."""
    smem = cuda.shared.array(0, uint32)
    sbase = (int32(smem_u32(smem)) + 1023) & -1024
    tid = int32(cuda.threadIdx.x)
    lane = tid & 31
    wg = tid >> 7                        # warpgroup: rows 64 wg .. 64 wg + 63 of the tile
    wq = (tid >> 5) & 3                  # warp within the warpgroup: 16 of those rows
    m_dim = xb.shape[0]
    n_dim = w.shape[0]
    k_dim = w.shape[1]
    pid_m, pid_n = grouped_tile(int32(cuda.blockIdx.x), int32((m_dim + BM - 1) // BM),
                                int32((n_dim + BN - 1) // BN))
    # global -> shared: thread copies chunk c of tile rows r, r + 64, r + 128, r + 192 of A and
    # r, r + 64 of B; all those rows share r & 7, hence one swizzled chunk offset
    r = tid >> 3
    c = tid & 7
    sw = (c ^ (r & 7)) << 4
    sa = r * ROW_BYTES + sw
    sb = A_BYTES + r * ROW_BYTES + sw
    xp = gptr(xb)
    wp = gptr(w)
    row0 = pid_m * BM + r
    col0 = pid_n * BN + r
    acc = _tile_loop(sbase, wg, sa, sb, k_dim,
                     xp + (min(row0, m_dim - 1) * k_dim + c * 8) * 2,
                     xp + (min(row0 + 64, m_dim - 1) * k_dim + c * 8) * 2,
                     xp + (min(row0 + 128, m_dim - 1) * k_dim + c * 8) * 2,
                     xp + (min(row0 + 192, m_dim - 1) * k_dim + c * 8) * 2,
                     wp + (min(col0, n_dim - 1) * k_dim + c * 8) * 2,
                     wp + (min(col0 + 64, n_dim - 1) * k_dim + c * 8) * 2)
    # epilogue: acc[4j + e] is row r0 (+8 for e >= 2), columns q0 + 8j (+1 for odd e)
    even = (n_dim & 1) == 0
    r0 = pid_m * BM + wg * 64 + wq * 16 + (lane >> 2)
    q0 = pid_n * BN + 2 * (lane & 3)
    _store_rows(out, bias, has_bias, r0, q0, (acc[0], acc[1], acc[2], acc[3]), m_dim, n_dim, even)
    _store_rows(out, bias, has_bias, r0, q0 + 8, (acc[4], acc[5], acc[6], acc[7]), m_dim, n_dim, even)
    _store_rows(out, bias, has_bias, r0, q0 + 16, (acc[8], acc[9], acc[10], acc[11]), m_dim, n_dim, even)
    _store_rows(out, bias, has_bias, r0, q0 + 24, (acc[12], acc[13], acc[14], acc[15]), m_dim, n_dim, even)
    _store_rows(out, bias, has_bias, r0, q0 + 32, (acc[16], acc[17], acc[18], acc[19]), m_dim, n_dim, even)
    _store_rows(out, bias, has_bias, r0, q0 + 40, (acc[20], acc[21], acc[22], acc[23]), m_dim, n_dim, even)
    _store_rows(out, bias, has_bias, r0, q0 + 48, (acc[24], acc[25], acc[26], acc[27]), m_dim, n_dim, even)
    _store_rows(out, bias, has_bias, r0, q0 + 56, (acc[28], acc[29], acc[30], acc[31]), m_dim, n_dim, even)
    _store_rows(out, bias, has_bias, r0, q0 + 64, (acc[32], acc[33], acc[34], acc[35]), m_dim, n_dim, even)
    _store_rows(out, bias, has_bias, r0, q0 + 72, (acc[36], acc[37], acc[38], acc[39]), m_dim, n_dim, even)
    _store_rows(out, bias, has_bias, r0, q0 + 80, (acc[40], acc[41], acc[42], acc[43]), m_dim, n_dim, even)
    _store_rows(out, bias, has_bias, r0, q0 + 88, (acc[44], acc[45], acc[46], acc[47]), m_dim, n_dim, even)
    _store_rows(out, bias, has_bias, r0, q0 + 96, (acc[48], acc[49], acc[50], acc[51]), m_dim, n_dim, even)
    _store_rows(out, bias, has_bias, r0, q0 + 104, (acc[52], acc[53], acc[54], acc[55]), m_dim, n_dim, even)
    _store_rows(out, bias, has_bias, r0, q0 + 112, (acc[56], acc[57], acc[58], acc[59]), m_dim, n_dim, even)
    _store_rows(out, bias, has_bias, r0, q0 + 120, (acc[60], acc[61], acc[62], acc[63]), m_dim, n_dim, even)


@cuda.jit(device=True)
def _swiglu_rows(h, r, c, g0, g1, g2, g3, u0, u1, u2, u3, m_dim):
    """h[r, c..c+1] and h[r + 8, c..c+1] = bf16(silu(gate) * up) (rows < m_dim)."""
    if r < m_dim:
        h[r, c] = from_f32(h, g0 / (float32(1.0) + math.exp(-g0)) * u0)
        h[r, c + 1] = from_f32(h, g1 / (float32(1.0) + math.exp(-g1)) * u1)
    if r + 8 < m_dim:
        h[r + 8, c] = from_f32(h, g2 / (float32(1.0) + math.exp(-g2)) * u2)
        h[r + 8, c + 1] = from_f32(h, g3 / (float32(1.0) + math.exp(-g3)) * u3)


@cuda.jit(device=True)
def swiglu_epilogue(h, r0, q0, acc, m_dim):
    """A warpgroup's 64 x 128 accumulator tile whose columns 0-63 are gates and 64-127 the
    matching ups (acc[4j + e] pairs with acc[4j + 32 + e]): h[r0 (+8), q0 + 8j (+1)] =
    bf16(silu(gate) * up) for rows < m_dim (shared with moe_wgmma's gate_up)."""
    _swiglu_rows(h, r0, q0, acc[0], acc[1], acc[2], acc[3], acc[32], acc[33], acc[34], acc[35], m_dim)
    _swiglu_rows(h, r0, q0 + 8, acc[4], acc[5], acc[6], acc[7], acc[36], acc[37], acc[38], acc[39], m_dim)
    _swiglu_rows(h, r0, q0 + 16, acc[8], acc[9], acc[10], acc[11], acc[40], acc[41], acc[42], acc[43], m_dim)
    _swiglu_rows(h, r0, q0 + 24, acc[12], acc[13], acc[14], acc[15], acc[44], acc[45], acc[46], acc[47], m_dim)
    _swiglu_rows(h, r0, q0 + 32, acc[16], acc[17], acc[18], acc[19], acc[48], acc[49], acc[50], acc[51], m_dim)
    _swiglu_rows(h, r0, q0 + 40, acc[20], acc[21], acc[22], acc[23], acc[52], acc[53], acc[54], acc[55], m_dim)
    _swiglu_rows(h, r0, q0 + 48, acc[24], acc[25], acc[26], acc[27], acc[56], acc[57], acc[58], acc[59], m_dim)
    _swiglu_rows(h, r0, q0 + 56, acc[28], acc[29], acc[30], acc[31], acc[60], acc[61], acc[62], acc[63], m_dim)


@kernel((u16_2, u16_2, u16_2), sim=False, launch_bounds=(THREADS, 1), dynamic_smem=SMEM_BYTES)
def gemm_wgmma_swiglu_kernel(xb, w, h):
    """grid gemm_grid(M, 2 I), block 512: h [M, I] bf16 = silu(xb @ gate^T) * (xb @ up^T) for
    w = gate_up [2I, K] (gate rows first), I % 64 == 0. The CTA's 128 B rows are gate rows
    n0 .. n0 + 63 and up rows I + n0 .. (n0 = 64 pid_n), so accumulator columns j and j + 64
    of a thread are the gate and up of output column n0 + j: the SwiGLU runs in registers and
    the [M, 2I] fp32 product never reaches memory."""
    smem = cuda.shared.array(0, uint32)
    sbase = (int32(smem_u32(smem)) + 1023) & -1024
    tid = int32(cuda.threadIdx.x)
    lane = tid & 31
    wg = tid >> 7
    wq = (tid >> 5) & 3
    m_dim = xb.shape[0]
    inter = h.shape[1]
    k_dim = w.shape[1]
    pid_m, pid_n = grouped_tile(int32(cuda.blockIdx.x), int32((m_dim + BM - 1) // BM),
                                int32((2 * inter + BN - 1) // BN))
    r = tid >> 3
    c = tid & 7
    sw = (c ^ (r & 7)) << 4
    sa = r * ROW_BYTES + sw
    sb = A_BYTES + r * ROW_BYTES + sw
    xp = gptr(xb)
    wp = gptr(w)
    row0 = pid_m * BM + r
    n0 = pid_n * (BN // 2)
    acc = _tile_loop(sbase, wg, sa, sb, k_dim,
                     xp + (min(row0, m_dim - 1) * k_dim + c * 8) * 2,
                     xp + (min(row0 + 64, m_dim - 1) * k_dim + c * 8) * 2,
                     xp + (min(row0 + 128, m_dim - 1) * k_dim + c * 8) * 2,
                     xp + (min(row0 + 192, m_dim - 1) * k_dim + c * 8) * 2,
                     wp + ((n0 + r) * k_dim + c * 8) * 2,
                     wp + ((inter + n0 + r) * k_dim + c * 8) * 2)
    swiglu_epilogue(h, pid_m * BM + wg * 64 + wq * 16 + (lane >> 2), n0 + 2 * (lane & 3), acc, m_dim)
