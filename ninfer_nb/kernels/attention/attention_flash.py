"""Flash attention for prefill on mma.sync (bf16 in, fp32 accumulate), head dim 256.

`CudaOps.attention` takes this path for prefill chunks when head_dim == HEAD_DIM and the GPU
has ldmatrix / cp.async (cc >= 8.0; prefill_attention="flash", the default). Its inputs are
attention_gemm's gathers, bf16 and laid out per kv head:

  qb [Hkv, T*G, D] bf16   q regrouped by kv head: row r = token r // G, q head h G + r % G
  kb [Hkv, Lp, D]  bf16   keys 0..L-1, zero rows up to Lp (L = last position + 1, Lp % 64 == 0)
  vt [Hkv, D, Lp]  bf16   values, transposed, zero columns past L

Grid (ceil(T*G / BR), Hkv), THREADS threads; block b takes BR query rows of kv head h (the
GQA rows of one kv head share every K / V tile), heaviest blocks (the chunk's last rows, the
most keys) first. Each warp owns 16 rows and walks the key tiles 0.. of its block:

  S  = Q K^T            [16 x BC] per warp, fp32 in registers   (ldmatrix Q / K, mma m16n8k16)
  online softmax        running row max m, row sum l, O scaled by exp2((m_old - m_new) c)
  O += P V              [16 x D] fp32 in registers, P packed to bf16 straight from S's
                        accumulator layout (the m16n8 C fragment is the A fragment of k16)
  out[t, h G + j, :] = O / l   fp32

Shared memory (dynamic, SMEM_BYTES = 102 KB: 2 blocks per SM): the Q tile [BR][D] (loaded
once), one K tile [BC][D] and one V^T tile [D][BC], each row padded by 16 bytes so the 8 rows
an ldmatrix phase reads fall in distinct banks. Copies are cp.async, overlapped with compute
as in FlashAttention-2: K of the next tile is issued once every warp is done with S, V of the
next tile once every warp is done with P V; each wait leaves the other copy in flight.

Keys past a row's position are masked (score -inf) in the tiles that reach past the block's
first row; rows past T*G (last block) read the last real row and are not written. Limits:
D == HEAD_DIM (the O accumulator is 32 m16n8 tiles per warp: 128 fp32 registers), positions
increasing within the chunk (prefill). Knows nothing of the gathers' cache formats or of
models.

ptxas (sm_90a): 254 registers, no spills.
"""
from __future__ import annotations

import math

from numba import cuda, float32, uint32

from ninfer_nb.kernels.common.nbtypes import f32, f32_2, i32, i32_1, u16_3
from ninfer_nb.kernels.common.ptx import (
    cp_async16,
    cp_async_commit,
    cp_async_wait1,
    ex2,
    gptr,
    ldsm_x4,
    mma_bf16,
    pack_bf16x2,
    shfl_xor,
    smem_u32,
)
from ninfer_nb.kernels.common.registry import kernel

HEAD_DIM = 256
WARPS = 4
THREADS = 32 * WARPS
BR = 16 * WARPS           # query rows per block (16 per warp)
BC = 64                   # keys per tile
ROW_BYTES = 2 * HEAD_DIM + 16       # Q / K tile row pitch: 528 B = 132 words (= 4 mod 32)
VT_BYTES = 2 * BC + 16              # V^T tile row pitch: 144 B = 36 words (= 4 mod 32)
Q_OFF = 0
K_OFF = BR * ROW_BYTES
V_OFF = K_OFF + BC * ROW_BYTES
SMEM_BYTES = V_OFF + HEAD_DIM * VT_BYTES          # 104,448 B
CHUNKS_QK = BR * HEAD_DIM * 2 // 16 // THREADS    # 16-byte copies per thread: Q tile (16)
CHUNKS_K = BC * HEAD_DIM * 2 // 16 // THREADS     # K tile (16)
CHUNKS_V = HEAD_DIM * BC * 2 // 16 // THREADS     # V^T tile (16)
K_ROWS_PER_PASS = THREADS // 32     # Q / K rows one pass of 16-byte copies covers (32 parts per row)
V_ROWS_PER_PASS = THREADS // 8      # V^T rows one pass covers (8 parts per row)
KSTEPS = HEAD_DIM // 16   # k-steps of S = Q K^T
NT_S = BC // 8            # m16n8 tiles of S per warp (8)
NT_O = HEAD_DIM // 8      # m16n8 tiles of O per warp (32)
PSTEPS = BC // 16         # k-steps of O += P V (4)
O_REGS = 4 * NT_O         # O accumulator registers per lane (128)
S_REGS = 4 * NT_S         # S accumulator registers per lane (32)
NEG_INF = -math.inf
LOG2E = 1.4426950408889634


def supported(d_head: int, arch: tuple[int, int] | None) -> bool:
    return d_head == HEAD_DIM and arch is not None and tuple(arch) >= (8, 0)


def grid(rows: int, n_kv_heads: int) -> tuple[int, int]:
    return ((rows + BR - 1) // BR, n_kv_heads)


@cuda.jit(device=True, inline=True)
def _mma_pair(acc, i, a, b):
    """Two m16n8k16 products of A fragment a with an ldmatrix.x4 B pair b (n-tiles b[0:2] and
    b[2:4]) into the accumulator registers acc[i .. i + 7]."""
    c0 = mma_bf16(a, b[0], b[1], (acc[i], acc[i + 1], acc[i + 2], acc[i + 3]))
    c1 = mma_bf16(a, b[2], b[3], (acc[i + 4], acc[i + 5], acc[i + 6], acc[i + 7]))
    acc[i], acc[i + 1], acc[i + 2], acc[i + 3] = c0
    acc[i + 4], acc[i + 5], acc[i + 6], acc[i + 7] = c1


@cuda.jit(device=True, inline=True)
def _copy_k(k_s, k_g, key0):
    """K tile: keys key0.. of this head's kb rows -> [BC][ROW_BYTES]. Thread tid copies row
    tid / 32 + 4 i, 16-byte part tid % 32 (k_s, k_g: its addresses for i = 0, key0 = 0)."""
    g0 = k_g + key0 * (2 * HEAD_DIM)
    for i in range(CHUNKS_K):
        cp_async16(k_s + i * (K_ROWS_PER_PASS * ROW_BYTES), g0 + i * (K_ROWS_PER_PASS * 2 * HEAD_DIM))


@cuda.jit(device=True, inline=True)
def _copy_v(v_s, v_g, key0, v_step):
    """V^T tile: columns key0.. of this head's vt rows -> [D][VT_BYTES]. Thread tid copies
    row tid / 8 + 16 i, 16-byte part tid % 8 (v_step: the global stride of 16 rows)."""
    g0 = v_g + key0 * 2
    for i in range(CHUNKS_V):
        cp_async16(v_s + i * (V_ROWS_PER_PASS * VT_BYTES), g0 + i * v_step)


@kernel((u16_3, u16_3, u16_3, i32_1, i32, f32, f32_2), launch_bounds=(THREADS, 2), dynamic_smem=SMEM_BYTES)
def flash_attn_kernel(qb, kb, vt, positions, grp, scale, out):
    """qb [Hkv, R, D], kb [Hkv, Lp, D], vt [Hkv, D, Lp] bf16 (see the module doc); positions
    [T] int32; out [T * Hq, D] fp32 (row t Hq + head). Grid `grid(R, Hkv)`, THREADS threads,
    SMEM_BYTES of dynamic shared memory."""
    smem = cuda.shared.array(0, uint32)
    sbase = smem_u32(smem)
    tid = cuda.threadIdx.x
    lane = tid & 31
    warp = tid >> 5
    h = cuda.blockIdx.y
    n_rows = qb.shape[1]
    lp = kb.shape[1]
    n_q_heads = out.shape[0] // positions.shape[0]
    row0 = (cuda.gridDim.x - 1 - cuda.blockIdx.x) * BR            # heaviest blocks first
    last_row = min(row0 + BR, n_rows) - 1
    n_keys = positions[last_row // grp] + 1
    n_tiles = (n_keys + BC - 1) // BC

    qbase = gptr(qb) + h * n_rows * (2 * HEAD_DIM)
    kbase = gptr(kb) + h * lp * (2 * HEAD_DIM)
    vbase = gptr(vt) + h * HEAD_DIM * lp * 2
    crow = tid >> 5                                               # this thread's copy row / part
    cpart = (tid & 31) * 16
    for i in range(CHUNKS_QK):                                    # Q tile, rows past R: the last row
        src = min(row0 + crow + K_ROWS_PER_PASS * i, last_row)
        cp_async16(sbase + (Q_OFF + (crow + K_ROWS_PER_PASS * i) * ROW_BYTES) + cpart,
                   qbase + src * (2 * HEAD_DIM) + cpart)
    k_s = sbase + K_OFF + crow * ROW_BYTES + cpart
    k_g = kbase + crow * (2 * HEAD_DIM) + cpart
    v_s = sbase + V_OFF + (tid >> 3) * VT_BYTES + (tid & 7) * 16
    v_g = vbase + (tid >> 3) * lp * 2 + (tid & 7) * 16
    v_step = V_ROWS_PER_PASS * lp * 2
    _copy_k(k_s, k_g, 0)
    cp_async_commit()                                             # group: Q + K tile 0
    _copy_v(v_s, v_g, 0, v_step)
    cp_async_commit()                                             # group: V tile 0

    g = lane >> 2
    c4 = lane & 3
    r_lo = min(row0 + warp * 16 + g, last_row)                    # this lane's two rows
    r_hi = min(row0 + warp * 16 + g + 8, last_row)
    pos_lo = positions[r_lo // grp]
    pos_hi = positions[r_hi // grp]
    pos_min = positions[min(row0, last_row) // grp]
    sl2 = scale * float32(LOG2E)                                  # float32: LOG2E alone is a double
    # ldmatrix row addresses: A (Q) rows lane & 15, column half lane >> 4; B (K, V^T) rows
    # (lane & 7) + 8 (lane >> 4), column half (lane >> 3) & 1
    qa = sbase + Q_OFF + (warp * 16 + (lane & 15)) * ROW_BYTES + (lane >> 4) * 16
    b_row = (lane & 7) + ((lane >> 4) << 3)
    b_half = ((lane >> 3) & 1) * 16
    ka = sbase + K_OFF + b_row * ROW_BYTES + b_half
    va = sbase + V_OFF + b_row * VT_BYTES + b_half

    o = cuda.local.array(O_REGS, float32)                       # O [16 x D], m16n8 C layout
    for i in range(O_REGS):
        o[i] = 0.0
    s = cuda.local.array(S_REGS, float32)                       # S [16 x BC]
    m_lo = float32(-1.0e30)
    m_hi = float32(-1.0e30)
    l_lo = float32(0.0)                                           # this lane's share of the row sums
    l_hi = float32(0.0)

    for it in range(n_tiles):
        key0 = it * BC
        cp_async_wait1()                                          # Q and K tile `it` have landed
        cuda.syncthreads()
        for i in range(S_REGS):
            s[i] = 0.0
        for kk in range(KSTEPS):
            a = ldsm_x4(qa + kk * 32)
            for npair in range(NT_S // 2):
                b = ldsm_x4(ka + npair * 16 * ROW_BYTES + kk * 32)
                _mma_pair(s, 8 * npair, a, b)
        cuda.syncthreads()                                        # every warp is done with K
        if it + 1 < n_tiles:
            _copy_k(k_s, k_g, key0 + BC)
        cp_async_commit()                                         # group: K tile it + 1 (maybe empty)

        if key0 + BC - 1 > pos_min:                               # the tile reaches past a row's position
            for nt in range(NT_S):
                key = key0 + 8 * nt + 2 * c4
                if key > pos_lo:
                    s[4 * nt] = NEG_INF
                if key + 1 > pos_lo:
                    s[4 * nt + 1] = NEG_INF
                if key > pos_hi:
                    s[4 * nt + 2] = NEG_INF
                if key + 1 > pos_hi:
                    s[4 * nt + 3] = NEG_INF
        mx_lo = m_lo
        mx_hi = m_hi
        for nt in range(NT_S):
            mx_lo = max(mx_lo, max(s[4 * nt], s[4 * nt + 1]))
            mx_hi = max(mx_hi, max(s[4 * nt + 2], s[4 * nt + 3]))
        mx_lo = max(mx_lo, shfl_xor(mx_lo, 1))
        mx_lo = max(mx_lo, shfl_xor(mx_lo, 2))
        mx_hi = max(mx_hi, shfl_xor(mx_hi, 1))
        mx_hi = max(mx_hi, shfl_xor(mx_hi, 2))
        alpha_lo = ex2((m_lo - mx_lo) * sl2)
        alpha_hi = ex2((m_hi - mx_hi) * sl2)
        m_lo = mx_lo
        m_hi = mx_hi
        off_lo = mx_lo * sl2
        off_hi = mx_hi * sl2
        sum_lo = float32(0.0)
        sum_hi = float32(0.0)
        for nt in range(NT_S):
            p0 = ex2(s[4 * nt] * sl2 - off_lo)
            p1 = ex2(s[4 * nt + 1] * sl2 - off_lo)
            p2 = ex2(s[4 * nt + 2] * sl2 - off_hi)
            p3 = ex2(s[4 * nt + 3] * sl2 - off_hi)
            s[4 * nt], s[4 * nt + 1], s[4 * nt + 2], s[4 * nt + 3] = p0, p1, p2, p3
            sum_lo += p0 + p1
            sum_hi += p2 + p3
        l_lo = l_lo * alpha_lo + sum_lo
        l_hi = l_hi * alpha_hi + sum_hi
        for nt in range(NT_O):
            o[4 * nt] *= alpha_lo
            o[4 * nt + 1] *= alpha_lo
            o[4 * nt + 2] *= alpha_hi
            o[4 * nt + 3] *= alpha_hi

        cp_async_wait1()                                          # V tile `it` has landed
        cuda.syncthreads()
        for ks in range(PSTEPS):
            j = 8 * ks                                            # S tiles 2 ks, 2 ks + 1
            a = (pack_bf16x2(s[j + 1], s[j]), pack_bf16x2(s[j + 3], s[j + 2]),
                 pack_bf16x2(s[j + 5], s[j + 4]), pack_bf16x2(s[j + 7], s[j + 6]))
            for dpair in range(NT_O // 2):
                b = ldsm_x4(va + dpair * 16 * VT_BYTES + ks * 32)
                _mma_pair(o, 8 * dpair, a, b)
        cuda.syncthreads()                                        # every warp is done with V
        if it + 1 < n_tiles:
            _copy_v(v_s, v_g, key0 + BC, v_step)
        cp_async_commit()                                         # group: V tile it + 1 (maybe empty)

    l_lo += shfl_xor(l_lo, 1)
    l_lo += shfl_xor(l_lo, 2)
    l_hi += shfl_xor(l_hi, 1)
    l_hi += shfl_xor(l_hi, 2)
    inv_lo = float32(1.0) / l_lo
    inv_hi = float32(1.0) / l_hi
    row = row0 + warp * 16 + g
    if row < n_rows:
        t = row // grp
        orow = t * n_q_heads + h * grp + (row - t * grp)
        for nt in range(NT_O):
            out[orow, 8 * nt + 2 * c4] = o[4 * nt] * inv_lo
            out[orow, 8 * nt + 2 * c4 + 1] = o[4 * nt + 1] * inv_lo
    row += 8
    if row < n_rows:
        t = row // grp
        orow = t * n_q_heads + h * grp + (row - t * grp)
        for nt in range(NT_O):
            out[orow, 8 * nt + 2 * c4] = o[4 * nt + 2] * inv_hi
            out[orow, 8 * nt + 2 * c4 + 1] = o[4 * nt + 3] * inv_hi
