"""Tensor-core GEMM for prefill: out[M, N] (fp32) = x[M, K] @ W[N, K]^T (+ bias[N]), W bf16 (uint16).

Two kernels, launched back to back by `CudaOps.linear` for M > GEMV_MAX_T and K % 64 == 0:

* `f32_to_bf16_kernel`: x fp32 -> a bf16 scratch copy (16-byte loads, `cvt.rn.bf16x2.f32`,
  16-byte stores). x is small next to W for the engine's shapes (M*K*6 bytes moved vs 2*M*N*K
  FLOPs: <= 2 % of the GEMM time at N = 17408, ~10 % at N = 5120, K = 17408, M = 8192), and it
  keeps the GEMM a plain bf16 x bf16 kernel whose A and B paths are identical.
* `gemm_mma_kernel`: `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`, fp32 accumulate.
  - CTA tile 128 x 128 x 32, 8 warps as 2 (M) x 4 (N), warp tile 64 x 32 = 4 x 4 MMA tiles,
    64 fp32 accumulators per thread held as 16 4-tuples (SSA values, so registers).
  - 3-stage `cp.async.cg` (16 B) ring, one `__syncthreads` per k-tile, prefetch distance 2.
    Stage = (128 + 128) rows x 64 B = 16 KB; 3 stages = 48 KB of *static* shared memory, so no
    `cuKernelSetAttribute` opt-in is needed, and 2 CTAs fit per SM (launch_bounds (256, 2):
    <= 128 registers). 128x128x64 with 96 KB of dynamic shared memory was only ~3 % faster.
  - 64-byte tile rows, 16-byte chunk c of row r stored at chunk c ^ ((r >> 1) & 3): the 8 row
    addresses of every `ldmatrix` 8x8 matrix then fall in 8 distinct 16-byte bank groups.
  - Both operands use non-transposed `ldmatrix.x4`: x[M, K] row-major is the `.row` A operand
    and W[N, K] row-major is exactly the `.col` B operand.
  - Grouped rasterisation (GROUP_M = 8 row tiles share each W column tile in time) for L2 reuse.
  - Ragged M / N: loads clamp the row to the last valid one (the extra rows/columns computed
    from duplicated data are never stored); the epilogue stores are predicated. N even uses
    8-byte `st.global.v2.f32`; odd N falls back to scalar stores. K % 32 == 0 is required
    (the dispatcher asks for K % 64 == 0); x, W, out must be 16-byte aligned.
Compile time: the kernel is ~100 lines of hand-unrolled Python (well under the super-linear
numba compile-time zone). GPU only (inline PTX): not simulator-safe.
"""
from __future__ import annotations

from numba import cuda, float32, int32, uint32

from ninfer_nb.kernels.common.nbtypes import f32_1, f32_2, i32, u16_1, u16_2
from ninfer_nb.kernels.common.ptx import (
    cp_async16,
    cp_async_commit,
    cp_async_wait0,
    cp_async_wait1,
    gptr,
    ldg_v4_f32,
    ldsm_x4,
    mma_bf16,
    pack_bf16x2,
    smem_u32,
    st_v2_f32,
    st_v4_u32,
)
from ninfer_nb.kernels.common.registry import kernel

BM = 128
BN = 128
BK = 32
STAGES = 3
THREADS = 256
GROUP_M = 8
ROW_BYTES = BK * 2                         # one tile row: 32 bf16 = 64 B = 4 chunks of 16 B
A_BYTES = BM * ROW_BYTES                   # 8 KB
STAGE_BYTES = (BM + BN) * ROW_BYTES        # 16 KB
SMEM_WORDS = STAGES * STAGE_BYTES // 4     # 48 KB static
K_ALIGN = 64                               # what the dispatcher requires of K
CVT_THREADS = 256
CVT_MAX_BLOCKS = 8192

# ---------------------------------------------------------------------------- host helpers
def cvt_grid(n_elems: int) -> int:
    return max(1, min(CVT_MAX_BLOCKS, (n_elems // 8 + CVT_THREADS - 1) // CVT_THREADS))


def gemm_grid(m: int, n: int) -> int:
    return ((m + BM - 1) // BM) * ((n + BN - 1) // BN)


# ---------------------------------------------------------------------------- kernels
@kernel((f32_1, u16_1), sim=False, launch_bounds=(CVT_THREADS, 4))
def f32_to_bf16_kernel(x, xb):
    """xb[i] = bf16(x[i]) (RNE); grid-stride, 8 elements per thread step; size % 8 == 0, 16-B aligned."""
    n = x.shape[0]
    step = cuda.gridDim.x * CVT_THREADS * 8
    for i in range((cuda.blockIdx.x * CVT_THREADS + cuda.threadIdx.x) * 8, n, step):
        a = ldg_v4_f32(x, i)
        b = ldg_v4_f32(x, i + 4)
        st_v4_u32(xb, i, pack_bf16x2(a[1], a[0]), pack_bf16x2(a[3], a[2]),
                  pack_bf16x2(b[1], b[0]), pack_bf16x2(b[3], b[2]))


@cuda.jit(device=True)
def grouped_tile(pid, num_m, num_n):
    """Block pid -> (row tile, column tile) in grouped order: GROUP_M row tiles walk one column
    tile of W together, so its weights are reused from L2 (shared with gemm_wgmma)."""
    width = GROUP_M * num_n
    first_m = (pid // width) * GROUP_M
    gsz = min(num_m - first_m, GROUP_M)
    return first_m + (pid % width) % gsz, (pid % width) // gsz


@cuda.jit(device=True)
def _store2(out, rr, c, v0, v1, n_dim, even, ok1):
    if even:
        st_v2_f32(out, rr * n_dim + c, v0, v1)
    else:
        out[rr, c] = v0
        if ok1:
            out[rr, c + 1] = v1


@cuda.jit(device=True)
def _store_rows(out, bias, has_bias, r, c, acc, m_dim, n_dim, even):
    """Write one 16x8 accumulator fragment's (r, c..c+1) and (r+8, c..c+1), predicated, + bias."""
    if c >= n_dim:
        return
    ok1 = c + 1 < n_dim
    b0 = float32(0.0)
    b1 = float32(0.0)
    if has_bias != 0:
        b0 = bias[c]
        if ok1:
            b1 = bias[c + 1]
    if r < m_dim:
        _store2(out, r, c, acc[0] + b0, acc[1] + b1, n_dim, even, ok1)
    if r + 8 < m_dim:
        _store2(out, r + 8, c, acc[2] + b0, acc[3] + b1, n_dim, even, ok1)


@cuda.jit(device=True)
def _mma_tile_loop(sbase, tid, wm, wn, xp, a_row0, a_end, wp, b_row0, b_end, k_dim, active):
    """The 128 x 128 CTA tile's main loop, shared with moe_pipelined's grouped GEMM. A = rows
    a_row0.. of the bf16 [*, K] matrix at byte address xp, B = rows b_row0.. of the one at wp;
    rows at or past a_end / b_end are clamped to the last valid one (computed, never stored).
    The 3-stage cp.async ring (this thread copies 16-byte chunk tid & 3 of tile rows tid >> 2
    and + 64 of both, advancing 64 B per k-tile), one barrier per k-tile, then ldmatrix +
    mma.sync into this warp's 64 x 32 accumulators (16 4-tuples, returned). active = False:
    the warp still copies and meets the barriers but skips its ldmatrix / MMAs (rows that are
    all padding). Ends with every copy complete."""
    lane = tid & 31
    r = tid >> 2
    c = tid & 3
    g0 = xp + (min(a_row0 + r, a_end - 1) * k_dim + c * 8) * 2
    g1 = xp + (min(a_row0 + r + 64, a_end - 1) * k_dim + c * 8) * 2
    g2 = wp + (min(b_row0 + r, b_end - 1) * k_dim + c * 8) * 2
    g3 = wp + (min(b_row0 + r + 64, b_end - 1) * k_dim + c * 8) * 2
    kt_n = int32(k_dim // BK)
    s0 = r * ROW_BYTES + ((c ^ ((r >> 1) & 3)) << 4)      # (r + 64) has the same swizzle
    s1 = s0 + 64 * ROW_BYTES
    s2 = s0 + A_BYTES
    s3 = s1 + A_BYTES
    for s in range(STAGES - 1):
        if s < kt_n:
            st = sbase + s * STAGE_BYTES
            go = s * ROW_BYTES
            cp_async16(st + s0, g0 + go)
            cp_async16(st + s1, g1 + go)
            cp_async16(st + s2, g2 + go)
            cp_async16(st + s3, g3 + go)
        cp_async_commit()
    # ldmatrix lane addresses (row part + swizzle key; the chunk is XOR-ed per k16 step)
    a_off = (wm * 64 + (lane & 15)) * ROW_BYTES
    a_sw = ((lane & 15) >> 1) & 3
    a_hi = lane >> 4
    b_off = A_BYTES + (wn * 32 + ((lane >> 4) << 3) + (lane & 7)) * ROW_BYTES
    b_sw = ((lane & 7) >> 1) & 3
    b_hi = (lane >> 3) & 1
    z = (float32(0.0), float32(0.0), float32(0.0), float32(0.0))
    c00, c01, c02, c03, c10, c11, c12, c13 = z, z, z, z, z, z, z, z
    c20, c21, c22, c23, c30, c31, c32, c33 = z, z, z, z, z, z, z, z
    rd = int32(0)
    wr = int32(STAGES - 1)
    for kt in range(kt_n):
        cp_async_wait1()                 # tile kt has landed (this thread's copies)
        cuda.syncthreads()               # ... everyone's, and stage wr is no longer read
        nk = kt + STAGES - 1
        if nk < kt_n:
            st = sbase + wr * STAGE_BYTES
            go = nk * ROW_BYTES
            cp_async16(st + s0, g0 + go)
            cp_async16(st + s1, g1 + go)
            cp_async16(st + s2, g2 + go)
            cp_async16(st + s3, g3 + go)
        cp_async_commit()
        wr = wr + 1 if wr < STAGES - 1 else 0
        cur = sbase + rd * STAGE_BYTES
        rd = rd + 1 if rd < STAGES - 1 else 0
        if active:
            for ks in range(BK // 16):
                pa = cur + a_off + (((2 * ks + a_hi) ^ a_sw) << 4)
                a0 = ldsm_x4(pa)
                a1 = ldsm_x4(pa + 16 * ROW_BYTES)
                a2 = ldsm_x4(pa + 32 * ROW_BYTES)
                a3 = ldsm_x4(pa + 48 * ROW_BYTES)
                pb = cur + b_off + (((2 * ks + b_hi) ^ b_sw) << 4)
                p = ldsm_x4(pb)                  # (n 0-7: k lo, k hi), (n 8-15: k lo, k hi)
                q = ldsm_x4(pb + 16 * ROW_BYTES)  # n 16-31
                c00 = mma_bf16(a0, p[0], p[1], c00)
                c01 = mma_bf16(a0, p[2], p[3], c01)
                c02 = mma_bf16(a0, q[0], q[1], c02)
                c03 = mma_bf16(a0, q[2], q[3], c03)
                c10 = mma_bf16(a1, p[0], p[1], c10)
                c11 = mma_bf16(a1, p[2], p[3], c11)
                c12 = mma_bf16(a1, q[0], q[1], c12)
                c13 = mma_bf16(a1, q[2], q[3], c13)
                c20 = mma_bf16(a2, p[0], p[1], c20)
                c21 = mma_bf16(a2, p[2], p[3], c21)
                c22 = mma_bf16(a2, q[0], q[1], c22)
                c23 = mma_bf16(a2, q[2], q[3], c23)
                c30 = mma_bf16(a3, p[0], p[1], c30)
                c31 = mma_bf16(a3, p[2], p[3], c31)
                c32 = mma_bf16(a3, q[0], q[1], c32)
                c33 = mma_bf16(a3, q[2], q[3], c33)
    cp_async_wait0()
    return c00, c01, c02, c03, c10, c11, c12, c13, c20, c21, c22, c23, c30, c31, c32, c33


@kernel((u16_2, u16_2, f32_1, f32_2, i32), sim=False, launch_bounds=(THREADS, 2))
def gemm_mma_kernel(xb, w, bias, out, has_bias):
    """grid gemm_grid(M, N), block 256. out[M, N] = bf16 xb[M, K] @ bf16 w[N, K]^T (+ bias), fp32."""
    smem = cuda.shared.array(SMEM_WORDS, uint32, alignment=128)
    sbase = int32(smem_u32(smem))
    tid = int32(cuda.threadIdx.x)
    lane = tid & 31
    warp = tid >> 5
    wm = warp >> 2                       # 0..1: 64-row half of the CTA tile
    wn = warp & 3                        # 0..3: 32-column quarter
    m_dim = xb.shape[0]
    n_dim = w.shape[0]
    k_dim = w.shape[1]
    # grouped rasterisation: GROUP_M row tiles walk one column tile of W together
    pid_m, pid_n = grouped_tile(int32(cuda.blockIdx.x), int32((m_dim + BM - 1) // BM),
                                int32((n_dim + BN - 1) // BN))
    c00, c01, c02, c03, c10, c11, c12, c13, c20, c21, c22, c23, c30, c31, c32, c33 = _mma_tile_loop(
        sbase, tid, wm, wn, gptr(xb), pid_m * BM, m_dim, gptr(w), pid_n * BN, n_dim, k_dim, True)
    # epilogue: fragment (mi, ni) holds rows r0 + 16 mi (+8), columns c0 + 8 ni (+1)
    even = (n_dim & 1) == 0
    r0 = pid_m * BM + wm * 64 + (lane >> 2)
    q0 = pid_n * BN + wn * 32 + 2 * (lane & 3)
    _store_rows(out, bias, has_bias, r0, q0, c00, m_dim, n_dim, even)
    _store_rows(out, bias, has_bias, r0, q0 + 8, c01, m_dim, n_dim, even)
    _store_rows(out, bias, has_bias, r0, q0 + 16, c02, m_dim, n_dim, even)
    _store_rows(out, bias, has_bias, r0, q0 + 24, c03, m_dim, n_dim, even)
    _store_rows(out, bias, has_bias, r0 + 16, q0, c10, m_dim, n_dim, even)
    _store_rows(out, bias, has_bias, r0 + 16, q0 + 8, c11, m_dim, n_dim, even)
    _store_rows(out, bias, has_bias, r0 + 16, q0 + 16, c12, m_dim, n_dim, even)
    _store_rows(out, bias, has_bias, r0 + 16, q0 + 24, c13, m_dim, n_dim, even)
    _store_rows(out, bias, has_bias, r0 + 32, q0, c20, m_dim, n_dim, even)
    _store_rows(out, bias, has_bias, r0 + 32, q0 + 8, c21, m_dim, n_dim, even)
    _store_rows(out, bias, has_bias, r0 + 32, q0 + 16, c22, m_dim, n_dim, even)
    _store_rows(out, bias, has_bias, r0 + 32, q0 + 24, c23, m_dim, n_dim, even)
    _store_rows(out, bias, has_bias, r0 + 48, q0, c30, m_dim, n_dim, even)
    _store_rows(out, bias, has_bias, r0 + 48, q0 + 8, c31, m_dim, n_dim, even)
    _store_rows(out, bias, has_bias, r0 + 48, q0 + 16, c32, m_dim, n_dim, even)
    _store_rows(out, bias, has_bias, r0 + 48, q0 + 24, c33, m_dim, n_dim, even)
