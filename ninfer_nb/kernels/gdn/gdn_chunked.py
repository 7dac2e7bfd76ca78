"""Chunked (WY / UT-transform) gated delta rule for prefill: same contract as the recurrent
`gdn.gdr_recurrent_kernel` (q, k raw [T, Hk, Dk], l2-normalised here, q also scaled by
1/sqrt(Dk); v [T, Hv, Dv]; g = per-token log decay, beta in (0, 1), [T, Hv]; state [Hv, Dv, Dk]
fp32 updated in place; V head h reads q/k head h // (Hv/Hk)). Plain fp32 SIMT FMAs and shared
memory only (no tensor cores, no inline PTX, no warp shuffles), so both kernels run in the CUDA
simulator.

Math (per V head, chunk of C = 64 tokens, NInfer state layout S [Dv, Dk]; see
ops/cpu.gated_delta_rule_chunked and the model doc section 7.1). With k^, q^ the normalised
rows (q^ includes 1/sqrt(Dk)), gam_i = sum_{s<=i} g_s inside the chunk, D_ij = exp(gam_i - gam_j)
for i >= j (else 0):
    A  = strict_lower(beta_i k^_i.k^_j D_ij)         T = (I + A)^-1      (unit lower triangular)
    P  = lower(q^_i.k^_j D_ij)  (incl. diagonal)     M = P T
    Xk = beta e^gam k^,  Xv = beta v                 W = T Xk,  U = T Xv
    Q' = e^gam q^ - M Xk                              O_intra = M Xv  (= P U)
    V' = U - W S^T          O = O_intra + Q' S^T     (= e^gam q^ S^T + P V')
    S  <- e^gam_last S + V'^T (k^ e^(gam_last - gam))
Folding P into Q' and O_intra (both independent of S) leaves the sequential kernel with three
[C x Dk] x [Dk x Dv]-sized products per chunk and no C x C term.

Kernels:
1. `gdc_prepare_kernel`, grid (ceil(T/C), Hk), 256 threads: everything that does not depend on
   the state, for all chunks in parallel. One block per (chunk, K head) computes the raw Gram
   matrices K K^T and Q K^T once (16-column Dk tiles in shared memory, 4x4 register tiles, only
   the lower 10 of 16 sub-tiles) and then loops over the Hv/Hk V heads sharing that K head:
   A and P from the Grams, T = (I + A)^-1 by 16x16 blocks (diagonal blocks by column-wise
   forward substitution, off-diagonal block rows by two small products each), M = P T, then
   W, Q', U, O_intra in 32-column tiles (each thread: 4 consecutive rows x 2 columns, inner loop
   only up to its last row since T and M are lower triangular). Writes W, Q' [Hv, T, Dk],
   U [Hv, T, Dv], O_intra straight into out [T, Hv, Dv], ks [Hv, T] = |k|^-1 e^(gam_last-gam)
   and ec [Hv, ceil(T/C)] = e^gam_last. Shared: A/T and P/M [64][65] + a 2176-float tile /
   inversion-scratch buffer + 5 x 64 gate/norm vectors = 43.3 KB (static, < 48 KB).
2. `gdc_state_kernel`, grid (Hv, ceil(Dv/16)), 128 threads: sequential over chunks, parallel
   over V heads and 16-row slices of the state (state rows are independent given W, Q', U, K).
   The block keeps its S slice [16][Dk] in shared memory; per chunk: X = [W; Q'] S^T (a
   [128 x 16] product, Dk in 32-column tiles, 4x4 register tile per thread), V' = U - X[:C] into
   shared memory, out += X[C:], then S = ec S + V'^T (k^ e^(gam_last-gam)) (K chunk [64][129] in
   shared memory, 4x4 register tile). Shared: 64x129 + 16x129 + 64x17 floats = 45.6 KB.
The last chunk may be partial (rows past T are zero: beta = g = 0, k = q = v = 0, which leaves
every product exact and gam_last = the last real token's). Limits: Dk <= 128 (the state slice
and the K chunk live in shared memory); any Dv; T <= 16 (decode, speculative verify) and Dk > 128
use the recurrent kernel (ops/cuda/gdn.py decides).

Expected cost (27B shape, Hk=16, Hv=48, Dk=Dv=128, one GDN layer, C=64), a model, not a
measurement: kernel 1 ~1.5 M FMA per (chunk, V head) (Gram ~0.22 M after sharing over the 3 V
heads, M = P T ~0.16 M, W/Q'/U/O_intra ~1.1 M), ~9 GFMA at T=8192 in 2048 independent blocks;
kernel 2 does 3 Dv Dk FMA per token and head, the same count as the recurrent walk (~19 GFMA at
T=8192), but as T/C = 128 dependent steps of tile products instead of 8192 dependent token
steps each with a chain of warp-shuffle reductions. Its 384 blocks of 4 warps give ~3 blocks
per SM on an H200. The inner loops issue about one shared load per two FMAs (PTX: 16 FMA / 8
LDS in kernel 2, 20/12, 10/8 and 32/20 in kernel 1), so shared-memory bandwidth, not FMA
throughput, is the expected limit: on the order of 1-2 ms per layer at T=8192 for the pair.
Shared-memory indices are `masked base & NN + constant` (no numba wraparound code; the constant
folds into the load), and the tile-load loops start at a runtime offset so they are not
unrolled: ptxas (sm_90) then reports 80 registers for kernel 1 and 125 for kernel 2, no spills.
Scratch: W, Q', U = T Hv (2 Dk + Dv) fp32 (~75 MB at T=1024), handed back after the call.
Kernel 2 issues LOAD_BATCH = 8 tile loads before storing them (a load-then-store loop, which
the compiler does not unroll, keeps one global load in flight per thread; ptxas: 87 registers,
no spills). Kernel 1 keeps its loops: batching them there spills at its 80-register budget.
CudaOps runs the state pass on TF32 tensor cores (gdn_chunked_mma.py) and the prepare on
gdn_prepare_mma.py where they apply; these kernels serve the other head dims and
`gdn_state="simt"` / `gdn_prepare="simt"`.
test_gated_delta_rule_chunked_vs_recurrent_timing (-s) prints the prepare kernel alone and
both state passes.
"""
from __future__ import annotations

import math

from numba import cuda, float32

from ninfer_nb.kernels.common.nbtypes import f32_2, f32_3
from ninfer_nb.kernels.common.registry import kernel

C = 64                    # chunk length (tokens)
MAX_DK = 128              # key head dim limit of the chunked path
RECURRENT_MAX_T = 16      # T <= this: the recurrent kernel is used instead

# kernel 1 (prepare)
PREP_THREADS = 256
LD = C + 1                # row stride of the [C][C] matrices A/T and P/M
GT = 16                   # Dk tile of the Gram phase
GLD = GT + 1              # row stride of the Gram tiles
NT = 32                   # column tile of the W/Q'/U/O phase
NLD = NT + 1
BS = 16                   # block size of the blocked inversion
BLD = BS + 1
BSZ = BS * BLD            # one 16x16 block in the inversion scratch
TD_OFF = 0                # inverted diagonal blocks [4][16][17]
Y_OFF = (C // BS) * BSZ   # block-row products [3][16][17]
BUF1 = 2 * C * GLD        # 2176 floats: max(K+Q Gram tiles, [64][33] tile, 1904 inversion scratch)
MAT = C * LD              # one [C][LD] matrix

# kernel 2 (state passing)
STATE_THREADS = 128
R = 16                    # state rows (Dv) per block
SLD = MAX_DK + 1          # row stride of the state slice and of the K chunk
XT = 32                   # Dk tile of the X = [W; Q'] S^T product
XLD = XT + 1
VLD = R + 1
NN = 0x7FFFFFFF           # index & NN is provably >= 0: numba drops its negative-index wraparound code
BUF2 = C * SLD            # 8256 floats: max([2C][33] X tile, [C][129] K chunk)
SBUF = R * SLD            # state slice [R][SLD]
VBUF = C * VLD            # V' [C][VLD]
LOAD_BATCH = 8            # global loads a thread issues before storing them to shared memory
X_ROWS_PER_THREAD = 2 * C // (STATE_THREADS // XT)   # rows of the [2C][XT] tile per thread (32)
K_ROWS_PER_THREAD = C // (STATE_THREADS // MAX_DK)   # rows of the [C][Dk] K chunk per thread (64)
assert X_ROWS_PER_THREAD % LOAD_BATCH == 0 and K_ROWS_PER_THREAD % LOAD_BATCH == 0


@cuda.jit(device=True, inline=True)
def invert_unit_lower(tm, t_off, ld, buf, td_off, y_off, tid, n_threads):
    """T = (I + A)^-1 in place, for the strictly lower triangular C x C matrix A at
    tm[t_off + i ld + j] (its diagonal and upper part are ignored and overwritten: T is unit
    lower triangular). By 16x16 blocks: the diagonal blocks by column-wise forward substitution
    (thread tid < C owns column tid), then each off-diagonal block row as two small products,
    T_ab = -T_aa sum_{c=b}^{a-1} A_ac T_cb. Scratch in buf: the inverted diagonal blocks
    [4][16][17] at td_off, the block-row products [3][16][17] at y_off. The whole block
    (n_threads >= C, a multiple of C; BS x BS = 256 threads take part in the block rows) calls
    it; it ends on a barrier. Shared by gdc_prepare_kernel and gdn_prepare_mma."""
    # diagonal blocks: thread tid owns column tid, forward substitution inside its block
    if tid < C:
        blk = tid // BS
        jj = tid % BS
        base = blk * BS
        tdo = td_off + blk * BSZ
        for ii in range(BS):
            val = float32(0.0)
            if ii == jj:
                val = float32(1.0)
            elif ii > jj:
                s = -tm[(t_off + (base + ii) * ld + base + jj) & NN]
                for m in range(jj + 1, ii):
                    s -= tm[(t_off + (base + ii) * ld + base + m) & NN] * buf[(tdo + m * BLD + jj) & NN]
                val = s
            buf[(tdo + ii * BLD + jj) & NN] = val
    cuda.syncthreads()
    # off-diagonal block rows: T_ab = -T_aa sum_{c=b}^{a-1} A_ac T_cb, written over A_ab
    ii = tid // BS
    jj = tid % BS
    for ab in range(1, C // BS):
        for b in range(ab):
            s = float32(0.0)
            for cb in range(b, ab):
                for m in range(BS):
                    av = tm[(t_off + (ab * BS + ii) * ld + cb * BS + m) & NN]
                    if cb == b:
                        tv = buf[(td_off + b * BSZ + m * BLD + jj) & NN]
                    else:
                        tv = tm[(t_off + (cb * BS + m) * ld + b * BS + jj) & NN]
                    s += av * tv
            buf[(y_off + b * BSZ + ii * BLD + jj) & NN] = s
        cuda.syncthreads()
        for b in range(ab):
            s = float32(0.0)
            for m in range(ii + 1):
                s += buf[(td_off + ab * BSZ + ii * BLD + m) & NN] * buf[(y_off + b * BSZ + m * BLD + jj) & NN]
            tm[(t_off + (ab * BS + ii) * ld + b * BS + jj) & NN] = -s
        cuda.syncthreads()
    # diagonal blocks into T, zeros above them
    j = tid % C
    for i in range(tid // C, C, n_threads // C):
        bi = i // BS
        bj = j // BS
        if bj > bi:
            tm[(t_off + i * ld + j) & NN] = float32(0.0)
        elif bj == bi:
            tm[(t_off + i * ld + j) & NN] = buf[(td_off + bi * BSZ + (i % BS) * BLD + (j % BS)) & NN]
    cuda.syncthreads()


def supported(d_k: int, d_v: int) -> bool:
    return 0 < d_k <= MAX_DK and d_v > 0


@kernel((f32_3, f32_3, f32_3, f32_2, f32_2, f32_3, f32_3, f32_3, f32_2, f32_2, f32_3),
        launch_bounds=(PREP_THREADS, 3))
def gdc_prepare_kernel(q, k, v, g, beta, wb, qb, ub, ks, ec, out):
    """q, k [T, Hk, Dk]; v [T, Hv, Dv]; g, beta [T, Hv] -> wb, qb [Hv, T, Dk]; ub [Hv, T, Dv];
    ks [Hv, T]; ec [Hv, ceil(T/C)]; out [T, Hv, Dv] (the intra-chunk part O_intra).
    Grid (ceil(T/C), Hk), PREP_THREADS threads."""
    tm = cuda.shared.array(MAT, float32)     # A, then T = (I + A)^-1        [C][LD]
    pm = cuda.shared.array(MAT, float32)     # P, then M = P T               [C][LD]
    buf = cuda.shared.array(BUF1, float32)      # Gram tiles / inversion scratch / column tiles
    gam = cuda.shared.array(C, float32)         # cumulative log decay
    eg = cuda.shared.array(C, float32)          # exp(gam)
    bet = cuda.shared.array(C, float32)
    nk = cuda.shared.array(C, float32)          # 1 / |k|
    nq = cuda.shared.array(C, float32)          # 1 / (|q| sqrt(Dk))
    kk = cuda.local.array((4, 4), float32)      # raw K K^T, rows ty + 16a, cols tx + 16b (b <= a)
    qk = cuda.local.array((4, 4), float32)      # raw Q K^T
    acc1 = cuda.local.array((4, 4), float32)
    acc2 = cuda.local.array((4, 2), float32)
    xr = cuda.local.array(4, float32)
    xq = cuda.local.array(4, float32)
    xc = cuda.local.array(4, float32)

    c = cuda.blockIdx.x & NN
    hk = cuda.blockIdx.y & NN
    tid = cuda.threadIdx.x & 1023
    n_t = v.shape[0]
    d_k = k.shape[2]
    d_v = v.shape[2]
    rep = (v.shape[1] // k.shape[1]) & NN
    c0 = c * C
    ty = tid // 16
    tx = tid % 16
    q_scale = float32(1.0) / math.sqrt(float32(d_k))

    # --- raw Gram matrices K K^T, Q K^T and the row norms (shared by the rep V heads) -------
    for a in range(4):
        for b in range(4):
            kk[a, b] = float32(0.0)
            qk[a, b] = float32(0.0)
    ssq = float32(0.0)
    for d0 in range(0, d_k, GT):
        # tile loads: runtime-start strided loops are not unrolled, so the compiler does not hoist
        # (and keep live across the tile loop) one address per unrolled iteration
        col = tid % GT
        for row in range(tid // GT, C, PREP_THREADS // GT):
            i = c0 + row
            kv_ = float32(0.0)
            qv_ = float32(0.0)
            if i < n_t and d0 + col < d_k:
                kv_ = k[i & NN, hk, (d0 + col) & NN]
                qv_ = q[i & NN, hk, (d0 + col) & NN]
            buf[(row * GLD + col) & NN] = kv_
            buf[(C * GLD + row * GLD + col) & NN] = qv_
        cuda.syncthreads()
        if tid < 2 * C:                          # threads 0..63: |k_row|^2, 64..127: |q_row|^2
            for col in range(GT):
                x = buf[(tid * GLD + col) & NN]
                ssq += x * x
        for dd in range(GT):
            br = (ty * GLD + dd) & NN            # masked bases + constant offsets: no wraparound
            bc = (tx * GLD + dd) & NN            # code, and the offsets fold into the loads
            for a in range(4):
                xr[a] = buf[br + 16 * GLD * a]
                xq[a] = buf[br + C * GLD + 16 * GLD * a]
                xc[a] = buf[bc + 16 * GLD * a]
            for a in range(4):
                for b in range(4):
                    if b <= a:
                        kk[a, b] += xr[a] * xc[b]
                        qk[a, b] += xq[a] * xc[b]
        cuda.syncthreads()
    if tid < C:
        nk[tid] = float32(1.0) / math.sqrt(ssq + float32(1e-6))
    elif tid < 2 * C:
        nq[(tid - C) & NN] = q_scale / math.sqrt(ssq + float32(1e-6))

    for hr in range(rep):
        h = (hk * rep + hr) & NN
        # --- gates: beta, cumulative log decay (rows past T: g = beta = 0) ------------------
        if tid < C:
            i = c0 + tid
            gv = float32(0.0)
            bv = float32(0.0)
            if i < n_t:
                gv = g[i & NN, h]
                bv = beta[i & NN, h]
            gam[tid] = gv
            bet[tid] = bv
        cuda.syncthreads()
        if tid == 0:
            run = float32(0.0)
            for i in range(C):
                run += gam[i]
                gam[i] = run
        cuda.syncthreads()
        if tid < C:
            eg[tid] = math.exp(gam[tid])
            i = c0 + tid
            if i < n_t:
                ks[h, i & NN] = nk[tid] * math.exp(gam[C - 1] - gam[tid])
            if tid == 0:
                ec[h, c] = math.exp(gam[C - 1])

        # --- A (strict lower) and P (lower incl. diagonal), full [C][C] with zeros ----------
        for a in range(4):
            i = ty + 16 * a
            for b in range(4):
                j = tx + 16 * b
                av = float32(0.0)
                pv = float32(0.0)
                if b <= a and i >= j:            # b > a: i < j always (ty, tx < 16)
                    dec = math.exp(gam[i & NN] - gam[j & NN])
                    pv = qk[a, b] * dec * nq[i & NN] * nk[j & NN]
                    if i > j:
                        av = kk[a, b] * dec * bet[i & NN] * nk[i & NN] * nk[j & NN]
                tm[(i * LD + j) & NN] = av
                pm[(i * LD + j) & NN] = pv
        cuda.syncthreads()

        # --- T = (I + A)^-1 by 16x16 blocks ---------------------------------------------------
        invert_unit_lower(tm, 0, LD, buf, TD_OFF, Y_OFF, tid, PREP_THREADS)

        # --- M = P T (lower triangular; entries above the diagonal come out exactly 0) --------
        for a in range(4):
            for b in range(4):
                acc1[a, b] = float32(0.0)
        for m in range(C):
            br = (ty * LD + m) & NN
            bc = (m * LD + tx) & NN
            for a in range(4):
                xr[a] = pm[br + 16 * LD * a]
                xc[a] = tm[bc + 16 * a]
            for a in range(4):
                for b in range(4):
                    if b <= a:
                        acc1[a, b] += xr[a] * xc[b]
        cuda.syncthreads()
        for a in range(4):
            for b in range(4):
                mv = float32(0.0)
                if b <= a:
                    mv = acc1[a, b]
                pm[((ty + 16 * a) * LD + tx + 16 * b) & NN] = mv
        cuda.syncthreads()

        # --- W = T Xk, Q' = e^gam q^ - M Xk  (Xk = beta e^gam k^), 32-column tiles -----------
        r0 = 4 * ty                              # this thread's rows r0..r0+3, cols tx, tx + 16
        for d0 in range(0, d_k, NT):
            col = tid % NT
            for row in range(tid // NT, C, PREP_THREADS // NT):
                i = c0 + row
                x = float32(0.0)
                if i < n_t and d0 + col < d_k:
                    x = k[i & NN, hk, (d0 + col) & NN] * (bet[row] * eg[row] * nk[row])
                buf[(row * NLD + col) & NN] = x
            cuda.syncthreads()
            for a in range(4):
                for b in range(2):
                    acc1[a, b] = float32(0.0)
                    acc2[a, b] = float32(0.0)
            for m in range(r0 + 4):
                bx = (m * NLD + tx) & NN
                bt = (r0 * LD + m) & NN
                x0 = buf[bx]
                x1 = buf[bx + 16]
                for a in range(4):
                    tv = tm[bt + LD * a]
                    mv = pm[bt + LD * a]
                    acc1[a, 0] += tv * x0
                    acc1[a, 1] += tv * x1
                    acc2[a, 0] += mv * x0
                    acc2[a, 1] += mv * x1
            for a in range(4):
                i = c0 + r0 + a
                if i < n_t:
                    qs = eg[(r0 + a) & NN] * nq[(r0 + a) & NN]
                    for b in range(2):
                        col = d0 + tx + 16 * b
                        if col < d_k:
                            wb[h, i & NN, col & NN] = acc1[a, b]
                            qb[h, i & NN, col & NN] = q[i & NN, hk, col & NN] * qs - acc2[a, b]
            cuda.syncthreads()

        # --- U = T Xv, O_intra = M Xv  (Xv = beta v) -----------------------------------------
        for d0 in range(0, d_v, NT):
            col = tid % NT
            for row in range(tid // NT, C, PREP_THREADS // NT):
                i = c0 + row
                x = float32(0.0)
                if i < n_t and d0 + col < d_v:
                    x = v[i & NN, h, (d0 + col) & NN] * bet[row]
                buf[(row * NLD + col) & NN] = x
            cuda.syncthreads()
            for a in range(4):
                for b in range(2):
                    acc1[a, b] = float32(0.0)
                    acc2[a, b] = float32(0.0)
            for m in range(r0 + 4):
                bx = (m * NLD + tx) & NN
                bt = (r0 * LD + m) & NN
                x0 = buf[bx]
                x1 = buf[bx + 16]
                for a in range(4):
                    tv = tm[bt + LD * a]
                    mv = pm[bt + LD * a]
                    acc1[a, 0] += tv * x0
                    acc1[a, 1] += tv * x1
                    acc2[a, 0] += mv * x0
                    acc2[a, 1] += mv * x1
            for a in range(4):
                i = c0 + r0 + a
                if i < n_t:
                    for b in range(2):
                        col = d0 + tx + 16 * b
                        if col < d_v:
                            ub[h, i & NN, col & NN] = acc1[a, b]
                            out[i & NN, h, col & NN] = acc2[a, b]
            cuda.syncthreads()


@kernel((f32_3, f32_3, f32_3, f32_3, f32_2, f32_2, f32_3, f32_3), launch_bounds=(STATE_THREADS, 4))
def gdc_state_kernel(k, wb, qb, ub, ks, ec, state, out):
    """k [T, Hk, Dk] raw; wb, qb [Hv, T, Dk]; ub [Hv, T, Dv]; ks [Hv, T]; ec [Hv, ceil(T/C)];
    state [Hv, Dv, Dk] (in place); out [T, Hv, Dv] (+= Q' S^T). Grid (Hv, ceil(Dv/R)),
    STATE_THREADS threads; sequential over the chunks."""
    buf = cuda.shared.array(BUF2, float32)      # [2C][XLD] X tile, then [C][SLD] K chunk
    s = cuda.shared.array(SBUF, float32)     # state rows r0..r0+R-1         [R][SLD]
    vp = cuda.shared.array(VBUF, float32)    # V' = U - W S^T                [C][VLD]
    acc = cuda.local.array((4, 4), float32)
    xa = cuda.local.array(4, float32)
    xb = cuda.local.array(4, float32)
    tmp = cuda.local.array(LOAD_BATCH, float32)

    h = cuda.blockIdx.x & NN
    r0 = (cuda.blockIdx.y * R) & NN
    tid = cuda.threadIdx.x & 1023
    n_t = wb.shape[1]
    d_k = wb.shape[2]
    d_v = ub.shape[2]
    hk = (h // (ub.shape[0] // k.shape[1])) & NN
    nc = (n_t + C - 1) // C
    rb = tid // 4                                # step a: X rows rb + 32a, state rows cb + 4b
    cb = tid % 4
    dg = tid // 4                                # step b: state entries (cb + 4b, dg + 32a)

    d = tid % MAX_DK                             # runtime-start strided loops (see kernel 1)
    for r in range(tid // MAX_DK, R, STATE_THREADS // MAX_DK):
        x = float32(0.0)
        if d < d_k and r0 + r < d_v:
            x = state[h, (r0 + r) & NN, d]
        s[(r * SLD + d) & NN] = x
    cuda.syncthreads()

    for c in range(nc):
        c0 = c * C
        # --- step a: X = [W; Q'] S^T  ([2C x R]) ----------------------------------------------
        for a in range(4):
            for b in range(4):
                acc[a, b] = float32(0.0)
        for d0 in range(0, d_k, XT):
            col = tid % XT
            # LOAD_BATCH independent global loads into registers, then their shared stores: a
            # load-then-store loop keeps one load in flight, and this tile is 32 loads a thread
            for jb in range(0, X_ROWS_PER_THREAD, LOAD_BATCH):
                for u in range(LOAD_BATCH):
                    row = tid // XT + (jb + u) * (STATE_THREADS // XT)
                    i = c0 + row % C
                    x = float32(0.0)
                    if i < n_t and d0 + col < d_k:
                        if row < C:
                            x = wb[h, i & NN, (d0 + col) & NN]
                        else:
                            x = qb[h, i & NN, (d0 + col) & NN]
                    tmp[u] = x
                for u in range(LOAD_BATCH):
                    row = tid // XT + (jb + u) * (STATE_THREADS // XT)
                    buf[(row * XLD + col) & NN] = tmp[u]
            cuda.syncthreads()
            for dd in range(XT):
                bx = (rb * XLD + dd) & NN
                bs = (cb * SLD + d0 + dd) & NN
                for a in range(4):
                    xa[a] = buf[bx + 32 * XLD * a]
                    xb[a] = s[bs + 4 * SLD * a]
                for a in range(4):
                    for b in range(4):
                        acc[a, b] += xa[a] * xb[b]
            cuda.syncthreads()
        # V' = U - W S^T (shared), out += Q' S^T
        for a in range(2):
            row = rb + 32 * a
            i = c0 + row
            for b in range(4):
                r = cb + 4 * b
                x = float32(0.0)
                if i < n_t and r0 + r < d_v:
                    x = ub[h, i & NN, (r0 + r) & NN] - acc[a, b]
                    out[i & NN, h, (r0 + r) & NN] += acc[a + 2, b]
                vp[(row * VLD + r) & NN] = x
        # --- step b: S = ec S + V'^T K~  (K~ = k^ e^(gam_last - gam) = k ks) ------------------
        d = tid % MAX_DK
        for jb in range(0, K_ROWS_PER_THREAD, LOAD_BATCH):   # batched as in step a (64 rows)
            for u in range(LOAD_BATCH):
                row = tid // MAX_DK + (jb + u) * (STATE_THREADS // MAX_DK)
                i = c0 + row
                x = float32(0.0)
                if i < n_t and d < d_k:
                    x = k[i & NN, hk, d] * ks[h, i & NN]
                tmp[u] = x
            for u in range(LOAD_BATCH):
                row = tid // MAX_DK + (jb + u) * (STATE_THREADS // MAX_DK)
                buf[(row * SLD + d) & NN] = tmp[u]
        cuda.syncthreads()
        e_c = ec[h, c & NN]
        for b in range(4):
            for a in range(4):
                acc[b, a] = e_c * s[((cb + 4 * b) * SLD + dg + 32 * a) & NN]
        for i in range(C):
            bv = (i * VLD + cb) & NN
            bk = (i * SLD + dg) & NN
            for a in range(4):
                xa[a] = vp[bv + 4 * a]
                xb[a] = buf[bk + 32 * a]
            for b in range(4):
                for a in range(4):
                    acc[b, a] += xa[b] * xb[a]
        for b in range(4):
            for a in range(4):
                s[((cb + 4 * b) * SLD + dg + 32 * a) & NN] = acc[b, a]
        cuda.syncthreads()

    d = tid % MAX_DK
    for r in range(tid // MAX_DK, R, STATE_THREADS // MAX_DK):
        if d < d_k and r0 + r < d_v:
            state[h, (r0 + r) & NN, d] = s[(r * SLD + d) & NN]
