"""Tensor-core prepare kernel for the chunked gated delta rule (prefill): the chunk-parallel first
kernel of kernels/gdn/gdn_chunked.py (`gdc_prepare_kernel`, see its docstring for the maths) with
its tile products on `mma.sync.m16n8k8` TF32 (fp32 accumulate). Same inputs and outputs: W, Q'
[Hv, T, Dk], U [Hv, T, Dv], O_intra into out [T, Hv, Dv], ks [Hv, T], ec [Hv, ceil(T/C)].
Knows nothing of the state pass that consumes them.

Per block (chunk of C = 64 tokens, K head), 256 threads = 8 warps:
1. K and Q chunk rows [64][Dk] raw fp32 into shared memory (16-byte global loads, rows past T
   and columns past Dk zero); row norms |k|, |q| from shared memory (fp32, exact as before).
2. Raw Gram matrices K K^T and Q K^T on mma: only the 20 lower 16x8 tiles of each (those that
   touch the diagonal included), 5 tiles per warp, K = Dk; kept in registers (20 per thread)
   for all the V heads of this K head.
3. Per V head h (the Hv/Hk heads sharing K head hk): gates (beta, the cumulative log decay gam,
   each of threads 0..63 summing its own prefix in order, so gam is the sequential cumsum),
   ks, ec; A (strict lower) and P (lower incl. diagonal) from the Gram registers with the decay
   and the norms; T = (I + A)^-1 on CUDA cores in fp32 (the 16x16-block scheme of
   gdc_prepare_kernel, unchanged); M = P T on mma (20 lower tiles, k blocks from the tile's
   column block to its diagonal only); then the four [64 x D] products on mma with the
   per-token scale folded into the A operand's columns (the B operand is raw K / V, shared by
   all V heads):
       W  = (T diag(s)) K      Q' = e^gam q^ - (M diag(s)) K       s = beta e^gam / |k|
       U  = (T diag(beta)) V   O_intra = (M diag(beta)) V
   Warp w owns output columns 32 (w & 3) .. + 31 (four n8 tiles) and the row tiles {0, 3}
   (w < 4) or {1, 2}: the triangular k range (k blocks up to the diagonal) is then the same
   10 k8 steps for every warp. W and Q' (U and O_intra) share the B fragments; one row tile's
   32 accumulators at a time. Dv > 128 takes several 128-column passes over V.

Layouts (dynamic shared memory, SMEM_BYTES = 105.7 KB: 2 blocks per SM):
- K [64][LDK], Q then V [64][LDK] (the Q rows are dead after the Gram; the inversion scratch
  and then V reuse the buffer), LDK = 136 (= 8 mod 32, 16-byte rows); the Gram's A-like
  reads K[i0 + g][d0 + t] are 2-way bank conflicts, and so are the products' B reads (below).
- A -> T and P -> M [64][LDT], LDT = 68 (= 4 mod 32): the A reads T[i0 + g][j0 + t] are
  conflict-free; M = P T's B reads T[j0 + t][n0 + g] 2-way (a small product). Only the lower
  tiles (n tile <= 2 m tile + 1) are ever read.
- Standard m16n8k8 A fragments and k order (no k permutation: every operand goes through a
  scalar shared load and a cvt.rna.tf32 anyway, and the products' A carries the per-column
  scale). The products' n order is permuted instead: n tiles 2p and 2p + 1 of a warp cover the
  16 output columns 16p .. 16p + 15 of its group, C column n of tile 2p + h being column
  4 (n >> 1) + 2h + (n & 1), so lane t's accumulators of rows g / g+8 are the four
  consecutive columns 4t .. 4t + 3: W, Q', U and O_intra leave as 16-byte stores and q (the
  e^gam q^ term of Q') comes in as 16-byte loads. The B reads of the permuted columns are
  2-way bank conflicts at LDK = 136 (no single row stride avoids them).
- The V rows of a head's first column pass are loaded into registers at the head's start and
  stored to shared memory after the inversion (the scratch lives in the V buffer), so their
  global latency hides behind the gates, A / P and the inversion.
- P's upper tiles are zeroed once per block and never written; the inversion writes all of T.
Rows past T in the last chunk load as zero (beta = g = 0 there), which leaves every product
exact; those rows are never stored.

ptxas (sm_90a): 128 registers, no spills, 105.7 KB dynamic shared memory, 2 blocks per SM.
The Gram registers (20, live across the V-head loop) are what makes 128 tight: with the q loads
of the Q' epilogue as 16 scalar loads in flight the kernel spilled 300 B; as 2 x 2 16-byte
loads per row tile it does not.
Per (chunk, V head) ~1.5 k warp-level mma (Gram 640 per K head, M ~70, the four products
4 x 320 with the triangular skip) against ~290 MB of global traffic per 27B layer at T = 2048:
bound by memory and by its serial parts (the per-head inversion on 64 threads, 14 barriers per
head), not by shared-memory bandwidth as gdc_prepare_kernel is.

Precision: the Gram matrices and the products have TF32 operands (10 mantissa bits, ~2^-11
relative each), fp32 accumulation; norms, gates, decays and the inversion are fp32. The state
pass's TF32 products have the same operand precision. Limits: Dk % 16 == 0, Dk <= 128,
Dv % 4 == 0 (`supported`; 16-byte rows); q, k, v 16-byte aligned (CudaOps checks; the
outputs are its scratch allocations, aligned). Not known
here: how the error grows with ill-conditioned (I + A) (strongly correlated keys in one chunk):
the tests use random keys.
"""
from __future__ import annotations

import math

from numba import cuda, float32

from ninfer_nb.kernels.common.nbtypes import f32_2, f32_3
from ninfer_nb.kernels.common.ptx import ldg_v4_f32, mma_tf32, st_v4_f32, tf32
from ninfer_nb.kernels.common.registry import kernel
from ninfer_nb.kernels.gdn.gdn_chunked import C, invert_unit_lower

MAX_DK = 128              # key head dim limit; also the V column pass width
WARPS = 8
THREADS = 32 * WARPS
MIN_BLOCKS = 2            # blocks per SM (launch bounds; the shared memory allows 2)
LDK = MAX_DK + 8          # row stride of K and Q / V [C][LDK]
LDT = C + 4               # row stride of A / T and P / M [C][LDT]
K_OFF = 0
QV_OFF = C * LDK
T_OFF = 2 * C * LDK
P_OFF = T_OFF + C * LDT
VEC_OFF = P_OFF + C * LDT
GRAW = VEC_OFF            # per-token vectors [C] each: raw g
GAM = GRAW + C            # cumulative log decay
EG = GAM + C              # exp(gam)
BET = EG + C              # beta
NK = BET + C              # 1 / |k|
NQ = NK + C               # 1 / (|q| sqrt(Dk))
SK = NQ + C               # beta e^gam / |k| (the column scale of W and M Xk)
SMEM_WORDS = SK + C
SMEM_BYTES = 4 * SMEM_WORDS
BS = 16                   # block size of the blocked inversion
BLD = BS + 1
BSZ = BS * BLD
TD_OFF = QV_OFF           # inverted diagonal blocks [4][16][17] (in the Q / V buffer)
Y_OFF = TD_OFF + (C // BS) * BSZ   # block-row products [3][16][17]
GRAM_TILES = 20           # lower 16x8 tiles of a [64][64] matrix (n tile <= 2 m tile + 1)
GRAM_PER_WARP = 2 * GRAM_TILES // WARPS
ROW_LOADS = C * (MAX_DK // 4) // THREADS    # 16-byte loads per thread for a [64][128] tile (8)
NN = 0x7FFFFFFF           # index & NN is provably >= 0: no negative-index wraparound code
assert 2 * GRAM_TILES == WARPS * GRAM_PER_WARP and THREADS == 256 and ROW_LOADS == 8
assert Y_OFF + (C // BS - 1) * BSZ <= QV_OFF + C * LDK


def supported(d_k: int, d_v: int) -> bool:
    return d_k % 16 == 0 and 0 < d_k <= MAX_DK and d_v > 0 and d_v % 4 == 0


@cuda.jit(device=True, inline=True)
def _tile_mn(e):
    """Lower 16x8 tile e (0..19) of a [64][64] matrix -> (m tile, n tile), n <= 2 m + 1."""
    mt = 0 if e < 2 else (1 if e < 6 else (2 if e < 12 else 3))
    return mt, e - mt * (mt + 1)


@cuda.jit(device=True, inline=True)
def _ldg_rows(regs, src, row_stride, base, c0, n_t, ncol, tid):
    """regs[u, :] = src.flat[row * row_stride + base + col .. + 3] for chunk row
    (tid >> 5) + 8u, col 4 (tid & 31): unconditional 16-byte loads from clamped rows / columns
    (the store masks them)."""
    col = min(4 * (tid & 31), ncol - 4)
    for u in range(ROW_LOADS):
        i = min(c0 + (tid >> 5) + 8 * u, n_t - 1)
        x = ldg_v4_f32(src, i * row_stride + base + col)
        for e in range(4):
            regs[u, e] = x[e]


@cuda.jit(device=True, inline=True)
def _sts_rows(sm, off, regs, c0, n_t, ncol, tid):
    """Store _ldg_rows' registers to sm[off + row * LDK + col ..], zero past T / past ncol."""
    col = 4 * (tid & 31)
    for u in range(ROW_LOADS):
        row = (tid >> 5) + 8 * u
        ok = c0 + row < n_t and col < ncol
        for e in range(4):
            sm[(off + row * LDK + col + e) & NN] = regs[u, e] if ok else float32(0.0)


@cuda.jit(device=True, inline=True)
def _frag_a(sm, base, s0, s1):
    """A fragment (rows g / g+8, cols t / t+4 from sm[base]: base = row g, col t) with the
    columns scaled by s0 / s1, tf32-rounded."""
    return (tf32(sm[base & NN] * s0), tf32(sm[(base + 8 * LDT) & NN] * s0),
            tf32(sm[(base + 4) & NN] * s1), tf32(sm[(base + 8 * LDT + 4) & NN] * s1))


@cuda.jit(device=True, inline=True)
def _products(sm, a1_off, a2_off, s_off, b_off, ncol, mt, cg, g, t, acc1, acc2):
    """acc1[nt] = (A1 diag(s)) B, acc2[nt] = (A2 diag(s)) B for row tile mt of the [64][64]
    lower-triangular A1, A2 (stride LDT) and output columns 32 cg .. + 31 of B [64][LDK]
    (k = rows), k blocks up to the diagonal only. n tiles 2p, 2p + 1 cover columns
    32 cg + 16 p .. + 15 in the permuted order of the module docstring (lane t's accumulators
    are columns 4t .. 4t + 3); a pair at or past ncol is skipped."""
    for nt in range(4):
        for j in range(4):
            acc1[nt, j] = float32(0.0)
            acc2[nt, j] = float32(0.0)
    ra = (16 * mt + g) * LDT + t
    bc = b_off + t * LDK + 32 * cg + 4 * (g >> 1) + (g & 1)     # B column of n = g, tile 0
    for kb in range(2 * mt + 2):
        o = 8 * kb
        s0 = sm[(s_off + o + t) & NN]
        s1 = sm[(s_off + o + t + 4) & NN]
        a1 = _frag_a(sm, a1_off + ra + o, s0, s1)
        a2 = _frag_a(sm, a2_off + ra + o, s0, s1)
        bo = bc + o * LDK
        for nt in range(4):
            if 32 * cg + 16 * (nt >> 1) < ncol:      # warp-uniform
                cb = bo + 16 * (nt >> 1) + 2 * (nt & 1)
                b0 = tf32(sm[cb & NN])
                b1 = tf32(sm[(cb + 4 * LDK) & NN])
                r1 = mma_tf32(a1, b0, b1, (acc1[nt, 0], acc1[nt, 1], acc1[nt, 2], acc1[nt, 3]))
                r2 = mma_tf32(a2, b0, b1, (acc2[nt, 0], acc2[nt, 1], acc2[nt, 2], acc2[nt, 3]))
                for j in range(4):
                    acc1[nt, j] = r1[j]
                    acc2[nt, j] = r2[j]


@kernel((f32_3, f32_3, f32_3, f32_2, f32_2, f32_3, f32_3, f32_3, f32_2, f32_2, f32_3),
        launch_bounds=(THREADS, MIN_BLOCKS), dynamic_smem=SMEM_BYTES)
def gdc_prepare_mma_kernel(q, k, v, g, beta, wb, qb, ub, ks, ec, out):
    """q, k [T, Hk, Dk]; v [T, Hv, Dv]; g, beta [T, Hv] -> wb, qb [Hv, T, Dk]; ub [Hv, T, Dv];
    ks [Hv, T]; ec [Hv, ceil(T/C)]; out [T, Hv, Dv] (the intra-chunk part O_intra).
    Grid (ceil(T/C), Hk), THREADS threads, SMEM_BYTES of dynamic shared memory; q, k, v rows
    16-byte aligned (`supported`)."""
    sm = cuda.shared.array(0, float32)
    rows = cuda.local.array((ROW_LOADS, 4), float32)   # a [64][128] tile's 16-byte loads
    gr = cuda.local.array((GRAM_PER_WARP, 4), float32)  # this warp's raw Gram tiles
    mr = cuda.local.array((3, 4), float32)              # this warp's M tiles
    acc1 = cuda.local.array((4, 4), float32)
    acc2 = cuda.local.array((4, 4), float32)

    c = cuda.blockIdx.x & NN
    hk = cuda.blockIdx.y & NN
    tid = cuda.threadIdx.x & 1023
    warp = tid >> 5
    lane = tid & 31
    g8 = lane >> 2                       # fragment row / column group
    t4 = lane & 3
    n_t = v.shape[0]
    n_hk = k.shape[1]
    d_k = k.shape[2]
    n_hv = v.shape[1]
    d_v = v.shape[2]
    rep = (n_hv // n_hk) & NN
    c0 = c * C
    q_scale = float32(1.0) / math.sqrt(float32(d_k))
    rg = warp >> 2                       # products: row tiles {0, 3} (rg 0) or {1, 2}
    cg = warp & 3                        # products: output columns 32 cg .. 32 cg + 31

    # --- K, Q chunk rows into shared memory; P's upper tiles zero ---------------------------
    _ldg_rows(rows, k, n_hk * d_k, hk * d_k, c0, n_t, d_k, tid)
    _sts_rows(sm, K_OFF, rows, c0, n_t, d_k, tid)
    _ldg_rows(rows, q, n_hk * d_k, hk * d_k, c0, n_t, d_k, tid)
    _sts_rows(sm, QV_OFF, rows, c0, n_t, d_k, tid)
    for x in range(tid, C * LDT, THREADS):
        sm[(P_OFF + x) & NN] = float32(0.0)
    cuda.syncthreads()

    # --- row norms (threads 0..63: K rows, 64..127: Q rows; columns past Dk are zero) --------
    if tid < 2 * C:
        r = tid & (C - 1)
        base = (K_OFF if tid < C else QV_OFF) + r * LDK
        ssq = float32(0.0)
        for d in range(MAX_DK):
            x = sm[(base + ((d + r) & (MAX_DK - 1))) & NN]    # staggered: distinct banks
            ssq += x * x
        if tid < C:
            sm[NK + r] = float32(1.0) / math.sqrt(ssq + float32(1e-6))
        else:
            sm[NQ + r] = q_scale / math.sqrt(ssq + float32(1e-6))

    # --- raw Gram tiles: K K^T (tiles 0..19), Q K^T (20..39), warp w: tiles w + 8 r ---------
    n_k8 = d_k >> 3
    for r in range(GRAM_PER_WARP):
        idx = warp + WARPS * r
        which = 1 if idx >= GRAM_TILES else 0
        mt, nt = _tile_mn(idx - GRAM_TILES * which)
        a_off = (QV_OFF if which == 1 else K_OFF) + (16 * mt + g8) * LDK + t4
        b_off = K_OFF + (8 * nt + g8) * LDK + t4
        acc = (float32(0.0), float32(0.0), float32(0.0), float32(0.0))
        for kb in range(n_k8):
            o = 8 * kb
            a = (tf32(sm[(a_off + o) & NN]), tf32(sm[(a_off + 8 * LDK + o) & NN]),
                 tf32(sm[(a_off + o + 4) & NN]), tf32(sm[(a_off + 8 * LDK + o + 4) & NN]))
            acc = mma_tf32(a, tf32(sm[(b_off + o) & NN]), tf32(sm[(b_off + o + 4) & NN]), acc)
        for j in range(4):
            gr[r, j] = acc[j]

    for hr in range(rep):
        h = (hk * rep + hr) & NN
        # V rows of the first column pass: loads in flight during gates, A / P and inversion
        _ldg_rows(rows, v, n_hv * d_v, h * d_v, c0, n_t, d_v, tid)
        cuda.syncthreads()               # previous head done with T, M, V and the vectors
        # --- gates --------------------------------------------------------------------------
        if tid < C:
            i = c0 + tid
            gv = float32(0.0)
            bv = float32(0.0)
            if i < n_t:
                gv = g[i & NN, h]
                bv = beta[i & NN, h]
            sm[GRAW + tid] = gv
            sm[BET + tid] = bv
        cuda.syncthreads()
        if tid < C:
            run = float32(0.0)           # every thread sums in order: gam = the sequential cumsum
            gi = float32(0.0)
            for m in range(C):
                run += sm[GRAW + m]
                if m == tid:
                    gi = run
            e = math.exp(gi)
            sm[GAM + tid] = gi
            sm[EG + tid] = e
            sm[SK + tid] = sm[BET + tid] * e * sm[NK + tid]
            if c0 + tid < n_t:
                ks[h, (c0 + tid) & NN] = sm[NK + tid] * math.exp(run - gi)
            if tid == 0:
                ec[h, c] = math.exp(run)
        cuda.syncthreads()

        # --- A (strict lower) into T's buffer, P (lower incl. diagonal) from the Gram tiles ---
        for r in range(GRAM_PER_WARP):
            idx = warp + WARPS * r
            which = 1 if idx >= GRAM_TILES else 0
            mt, nt = _tile_mn(idx - GRAM_TILES * which)
            for j in range(4):
                i = 16 * mt + g8 + 8 * (j >> 1)
                jj = 8 * nt + 2 * t4 + (j & 1)
                val = float32(0.0)
                if i >= jj and (which == 1 or i > jj):
                    dec = math.exp(sm[(GAM + i) & NN] - sm[(GAM + jj) & NN]) * sm[(NK + jj) & NN]
                    if which == 1:
                        val = gr[r, j] * dec * sm[(NQ + i) & NN]
                    else:
                        val = gr[r, j] * dec * sm[(BET + i) & NN] * sm[(NK + i) & NN]
                sm[((P_OFF if which == 1 else T_OFF) + i * LDT + jj) & NN] = val
        cuda.syncthreads()

        # --- T = (I + A)^-1 by 16x16 blocks (fp32; scratch in the Q / V buffer) ---------------
        invert_unit_lower(sm, T_OFF, LDT, sm, TD_OFF, Y_OFF, tid, THREADS)
        _sts_rows(sm, QV_OFF, rows, c0, n_t, d_v, tid)    # V (first pass) over the scratch

        # --- M = P T on mma (lower tiles; k blocks nt .. 2 mt + 1), then over P --------------
        for r in range(3):
            e = warp + WARPS * r
            acc = (float32(0.0), float32(0.0), float32(0.0), float32(0.0))
            if e < GRAM_TILES:
                mt, nt = _tile_mn(e)
                a_off = P_OFF + (16 * mt + g8) * LDT + t4
                b_off = T_OFF + t4 * LDT + 8 * nt + g8
                for kb in range(nt, 2 * mt + 2):
                    o = 8 * kb
                    a = (tf32(sm[(a_off + o) & NN]), tf32(sm[(a_off + 8 * LDT + o) & NN]),
                         tf32(sm[(a_off + o + 4) & NN]), tf32(sm[(a_off + 8 * LDT + o + 4) & NN]))
                    acc = mma_tf32(a, tf32(sm[(b_off + o * LDT) & NN]), tf32(sm[(b_off + (o + 4) * LDT) & NN]), acc)
            for j in range(4):
                mr[r, j] = acc[j]
        cuda.syncthreads()
        for r in range(3):
            e = warp + WARPS * r
            if e < GRAM_TILES:
                mt, nt = _tile_mn(e)
                for j in range(4):
                    sm[(P_OFF + (16 * mt + g8 + 8 * (j >> 1)) * LDT + 8 * nt + 2 * t4 + (j & 1)) & NN] = mr[r, j]
        cuda.syncthreads()

        # --- W = (T diag(s)) K, Q' = e^gam q^ - (M diag(s)) K ---------------------------------
        if 32 * cg < d_k:
            for mi in range(2):
                mt = rg if mi == 0 else 3 - rg
                _products(sm, T_OFF, P_OFF, SK, K_OFF, d_k, mt, cg, g8, t4, acc1, acc2)
                for hf in range(2):                   # chunk rows 16 mt + g8 + 8 hf
                    row = 16 * mt + g8 + 8 * hf
                    i = c0 + row
                    qrow = (min(i, n_t - 1) * n_hk + hk) * d_k + 32 * cg + 4 * t4
                    qa = ldg_v4_f32(q, qrow)          # both loads first (clamped, unconditional)
                    qc = ldg_v4_f32(q, qrow + 16 if 32 * cg + 16 < d_k else qrow)
                    if i < n_t:
                        qs = sm[(EG + row) & NN] * sm[(NQ + row) & NN]
                        for p in range(2):
                            d = 32 * cg + 16 * p + 4 * t4
                            if d < d_k:
                                x = qa if p == 0 else qc
                                j0 = 2 * hf
                                ob = (h * n_t + i) * d_k + d
                                st_v4_f32(wb, ob, acc1[2 * p, j0], acc1[2 * p, j0 + 1],
                                          acc1[2 * p + 1, j0], acc1[2 * p + 1, j0 + 1])
                                st_v4_f32(qb, ob, x[0] * qs - acc2[2 * p, j0], x[1] * qs - acc2[2 * p, j0 + 1],
                                          x[2] * qs - acc2[2 * p + 1, j0], x[3] * qs - acc2[2 * p + 1, j0 + 1])

        # --- U = (T diag(beta)) V, O_intra = (M diag(beta)) V, 128-column passes over Dv ------
        for dv0 in range(0, d_v, MAX_DK):
            if dv0 > 0:
                _ldg_rows(rows, v, n_hv * d_v, h * d_v + dv0, c0, n_t, d_v - dv0, tid)
                cuda.syncthreads()       # every warp done with the previous pass's V
                _sts_rows(sm, QV_OFF, rows, c0, n_t, d_v - dv0, tid)
                cuda.syncthreads()
            if 32 * cg < d_v - dv0:
                for mi in range(2):
                    mt = rg if mi == 0 else 3 - rg
                    _products(sm, T_OFF, P_OFF, BET, QV_OFF, d_v - dv0, mt, cg, g8, t4, acc1, acc2)
                    for hf in range(2):
                        i = c0 + 16 * mt + g8 + 8 * hf
                        if i < n_t:
                            j0 = 2 * hf
                            for p in range(2):
                                d = dv0 + 32 * cg + 16 * p + 4 * t4
                                if d < d_v:
                                    st_v4_f32(ub, (h * n_t + i) * d_v + d, acc1[2 * p, j0], acc1[2 * p, j0 + 1],
                                              acc1[2 * p + 1, j0], acc1[2 * p + 1, j0 + 1])
                                    st_v4_f32(out, (i * n_hv + h) * d_v + d, acc2[2 * p, j0], acc2[2 * p, j0 + 1],
                                              acc2[2 * p + 1, j0], acc2[2 * p + 1, j0 + 1])
