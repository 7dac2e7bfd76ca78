"""Tensor-core state passing for the chunked gated delta rule (prefill): the sequential second
kernel of kernels/gdn/gdn_chunked.py with its per-chunk products on `mma.sync.m16n8k8` TF32
(fp32 accumulate). Same inputs and outputs as `gdn_chunked.gdc_state_kernel` (which stays for
key head dims the tensor-core tiling does not cover); knows nothing of the prepare kernel's
maths beyond its outputs W, Q', U, ks, ec.

Per V head and chunk of C = 64 tokens, with the state slice S [RT x Dk] of this block:
    X  = [W; Q'] S^T        [128 x RT], K = Dk      8 warps, one 16-row tile of X each
    V' = U - X[:C]          into shared memory, transposed, tf32-rounded
    out += X[C:]            (the prepare kernel wrote O_intra there)
    S  = ec S + V'^T K~     [RT x Dk], K = C        8 warps, 16 Dk columns each
K~ = k ks (raw k times |k|^-1 e^(gam_last - gam)). Grid (Hv, ceil(Dv / RT)), 256 threads.

Layout choices:
- The fp32 master S sits in shared memory [RT][MLD], each entry read and written only by the
  thread whose update accumulator holds it (rows 16 mt + g (+8), Dk columns 16 warp + 8 nt +
  2t (+1), the mma C layout; kept out of registers so the kernel fits 2 blocks per SM at 128
  registers). After each update a tf32-rounded copy goes to shared memory [RT][SLD] for the
  next chunk's X, whose B operand it is. The master is never rounded; only the product
  operands are (TF32: 10 mantissa bits, ~2^-11 relative).
- Inside each 16-wide k block the k order is permuted so that every lane's operands are four
  consecutive elements: lane t's elements 4t..4t+3 serve (step 0, col t), (step 0, col t+4),
  (step 1, col t), (step 1, col t+4) of A's rows and of B's column alike, which leaves the
  product unchanged. W / Q' rows then come straight from global memory as 16-byte loads into
  the A fragments (no shared staging: all 16 loads of a lane are issued before the first
  mma), and S and V'^T as 16-byte shared loads.
- Row strides SLD = Dk_max + 16 and VTLD = C + 16 (both = 16 mod 32 words): the 8 lanes of a
  16-byte shared-load phase (g in {0, 1}, t in 0..3) hit 32 distinct banks.
- Out-of-range rows (past T in the last chunk) and columns (past Dv, past Dk) load from a
  clamped in-range address and are replaced by zero, so every load is unconditional and the
  mma count is uniform; Dk < 128 wastes the zero k blocks (tiny test models only). Loads
  behind per-element branches were serialised (each waited before the next was issued).
- The A fragments of the next chunk are loaded during the update (half before it, half after:
  all of them before it spills at 128 registers); U / out after the X product and K~ after the
  first barrier (earlier spills too: 324-616 B, tried).
Two barriers per chunk. Limits: Dk % 16 == 0 and Dk <= 128 (`supported`); any Dv. ptxas
(sm_90a): 128 registers, 96 B of spill stores (the first chunk's A fragments), 46 KB of
static shared memory, 2 blocks per SM (MIN_BLOCKS; 1 block per SM at 214 registers was
slower). Output and state stay within ~6e-4 of the largest value of the fp32 recurrence.
Each chunk step still waits on global loads (U / out, K~, half the next A fragments) in
sequence; staging them with cp.async during the previous step (~94 KB of dynamic shared
memory) is the next step.
"""
from __future__ import annotations

from numba import cuda, float32

from ninfer_nb.kernels.common.nbtypes import f32_2, f32_3
from ninfer_nb.kernels.common.ptx import ldg_f32, ldg_v4_f32, lds_v4_f32, mma_tf32, tf32
from ninfer_nb.kernels.common.registry import kernel
from ninfer_nb.kernels.gdn.gdn_chunked import C

MAX_DK = 128
RT = 32                   # state rows (Dv) per block
WARPS = 8
THREADS = 32 * WARPS
MIN_BLOCKS = 2            # blocks per SM the register budget is sized for (launch bounds)
KB = MAX_DK // 16         # 16-wide Dk blocks of the X product
CB = C // 16              # 16-wide chunk-row blocks of the update product
SLD = MAX_DK + 16         # row stride of the tf32 state copy [RT][SLD]
VTLD = C + 16             # row stride of V'^T [RT][VTLD]
MLD = MAX_DK + 8          # row stride of the fp32 master state [RT][MLD]
S_WORDS = RT * SLD
VT_WORDS = RT * VTLD
M_WORDS = RT * MLD
assert WARPS * 16 == 2 * C and WARPS * 16 == MAX_DK and RT == 32


def supported(d_k: int, d_v: int) -> bool:
    return d_k % 16 == 0 and 0 < d_k <= MAX_DK and d_v > 0


def grid(n_v_heads: int, d_v: int) -> tuple[int, int]:
    return n_v_heads, (d_v + RT - 1) // RT


@cuda.jit(device=True, inline=True)
def _mma_k16(acc, alo, ahi, b):
    """acc += A[16 x 16] . B[16 x 8] as two k8 steps; alo / ahi: rows g / g+8 of A, b: column
    g of B, each 4 consecutive elements 4t..4t+3 of the k block (the permuted order above)."""
    acc = mma_tf32((alo[0], ahi[0], alo[1], ahi[1]), b[0], b[1], acc)
    return mma_tf32((alo[2], ahi[2], alo[3], ahi[3]), b[2], b[3], acc)


@cuda.jit(device=True, inline=True)
def _zero_unless(ok, v):
    z = float32(0.0)
    return (v[0] if ok else z, v[1] if ok else z, v[2] if ok else z, v[3] if ok else z)


@cuda.jit(device=True, inline=True)
def _tf32_4(v):
    return tf32(v[0]), tf32(v[1]), tf32(v[2]), tf32(v[3])


@cuda.jit(device=True, inline=True)
def _load_a(af, src, h, i_lo, n_t, d_k, t, kb0, kb1):
    """af[kb, 0 / 1, :] = src[h, i_lo / i_lo + 8, 16 kb + 4t .. + 3] for kb0 <= kb < kb1, raw
    (the A fragments of rows i_lo, i_lo + 8 in the permuted k order): unconditional 16-byte
    loads from clamped rows and k blocks. Nothing here uses the values, so a prefetch does not
    stall the warp; the X loop masks and rounds them."""
    b_lo = (h * n_t + min(i_lo, n_t - 1)) * d_k
    b_hi = (h * n_t + min(i_lo + 8, n_t - 1)) * d_k
    for kb in range(kb0, kb1):
        col = min(16 * kb, d_k - 16) + 4 * t
        lo = ldg_v4_f32(src, b_lo + col)
        hi = ldg_v4_f32(src, b_hi + col)
        for j in range(4):
            af[kb, 0, j] = lo[j]
            af[kb, 1, j] = hi[j]


@kernel((f32_3, f32_3, f32_3, f32_3, f32_2, f32_2, f32_3, f32_3), launch_bounds=(THREADS, MIN_BLOCKS))
def gdc_state_mma_kernel(k, wb, qb, ub, ks, ec, state, out):
    """k [T, Hk, Dk] raw; wb, qb [Hv, T, Dk]; ub [Hv, T, Dv]; ks [Hv, T]; ec [Hv, ceil(T/C)];
    state [Hv, Dv, Dk] (in place); out [T, Hv, Dv] (+= Q' S^T). Grid `grid(Hv, Dv)`, THREADS
    threads; sequential over the chunks. 16-byte aligned rows (Dk % 16 == 0)."""
    s_sm = cuda.shared.array(S_WORDS, float32)       # tf32 copy of S      [RT][SLD]
    vt_sm = cuda.shared.array(VT_WORDS, float32)     # V'^T, tf32          [RT][VTLD]
    af = cuda.local.array((KB, 2, 4), float32)        # this warp's X rows g / g+8, per k block
    uo = cuda.local.array((4, 2, 2), float32)         # U (W warps) or out (Q' warps) at X's slots
    kf = cuda.local.array((CB, 2, 4), float32)        # K~ column slots per chunk-row block
    ksv = cuda.local.array((CB, 4), float32)          # ks at those rows
    s_master = cuda.shared.array(M_WORDS, float32)    # fp32 S [RT][MLD]; each thread its own

    h = cuda.blockIdx.x
    r0 = cuda.blockIdx.y * RT
    warp = cuda.threadIdx.x >> 5
    lane = cuda.threadIdx.x & 31
    g = lane >> 2
    t = lane & 3
    n_t = wb.shape[1]
    d_k = wb.shape[2]
    d_v = ub.shape[2]
    hv = ub.shape[0]
    n_hk = k.shape[1]
    hk = h // (hv // n_hk)
    kcol0 = min(16 * warp + g, d_k - 1)    # this warp's two K~ columns (update B operand)
    kcol1 = min(16 * warp + 8 + g, d_k - 1)
    kok0 = 16 * warp + g < d_k
    kok1 = 16 * warp + 8 + g < d_k
    nc = (n_t + C - 1) // C
    n_kb = d_k // 16

    # --- S slice into the accumulators and its tf32 copy into shared memory --------------------
    for mt in range(2):
        for nt in range(2):
            for j in range(4):
                r = 16 * mt + g + 8 * (j >> 1)
                d = 16 * warp + 8 * nt + 2 * t + (j & 1)
                x = float32(0.0)
                if r0 + r < d_v and d < d_k:
                    x = state[h, r0 + r, d]
                s_master[r * MLD + d] = x
                s_sm[r * SLD + d] = tf32(x)
    cuda.syncthreads()

    is_w = warp < 4                        # X rows 16 warp..: W rows (V') or Q' rows (out)
    src = wb if is_w else qb
    m0 = 16 * (warp & 3)                   # chunk row of this warp's X tile
    _load_a(af, src, h, m0 + g, n_t, d_k, t, 0, KB)      # chunk 0's A fragments
    for c in range(nc):
        c0 = c * C
        i_lo = c0 + m0 + g                 # this lane's X rows (chunk tokens)
        i_hi = i_lo + 8
        ok_lo = i_lo < n_t
        ok_hi = i_hi < n_t

        # --- X = [W; Q'] S^T: this warp's 16 rows x RT columns, K = Dk -------------------------
        z = float32(0.0)
        x0 = (z, z, z, z)
        x1 = (z, z, z, z)
        x2 = (z, z, z, z)
        x3 = (z, z, z, z)
        for kb in range(KB):
            alo = _tf32_4(_zero_unless(ok_lo and kb < n_kb, (af[kb, 0, 0], af[kb, 0, 1], af[kb, 0, 2], af[kb, 0, 3])))
            ahi = _tf32_4(_zero_unless(ok_hi and kb < n_kb, (af[kb, 1, 0], af[kb, 1, 1], af[kb, 1, 2], af[kb, 1, 3])))
            sb = g * SLD + 16 * kb + 4 * t
            x0 = _mma_k16(x0, alo, ahi, lds_v4_f32(s_sm, sb))
            x1 = _mma_k16(x1, alo, ahi, lds_v4_f32(s_sm, sb + 8 * SLD))
            x2 = _mma_k16(x2, alo, ahi, lds_v4_f32(s_sm, sb + 16 * SLD))
            x3 = _mma_k16(x3, alo, ahi, lds_v4_f32(s_sm, sb + 24 * SLD))

        # --- V' = U - X[:C] (tf32, transposed, shared) or out += X[C:] --------------------------
        # every load unconditional (clamped address) and in one basic block, so all 16 are in
        # flight together; masking happens on the values
        ic_lo = min(i_lo, n_t - 1)
        ic_hi = min(i_hi, n_t - 1)
        if is_w:
            base_lo = (h * n_t + ic_lo) * d_v
            base_hi = (h * n_t + ic_hi) * d_v
            for nt in range(4):
                for j in range(4):
                    rc = min(r0 + 8 * nt + 2 * t + (j & 1), d_v - 1)
                    uo[nt, j >> 1, j & 1] = ldg_f32(ub, (base_hi if j >= 2 else base_lo) + rc)
        else:
            base_lo = (ic_lo * hv + h) * d_v
            base_hi = (ic_hi * hv + h) * d_v
            for nt in range(4):
                for j in range(4):
                    rc = min(r0 + 8 * nt + 2 * t + (j & 1), d_v - 1)
                    uo[nt, j >> 1, j & 1] = ldg_f32(out, (base_hi if j >= 2 else base_lo) + rc)
        if is_w:
            for nt in range(4):
                xv = x0 if nt == 0 else (x1 if nt == 1 else (x2 if nt == 2 else x3))
                for j in range(4):
                    rl = 8 * nt + 2 * t + (j & 1)
                    ok = (ok_hi if j >= 2 else ok_lo) and r0 + rl < d_v
                    v = tf32(uo[nt, j >> 1, j & 1] - xv[j])
                    vt_sm[rl * VTLD + m0 + g + 8 * (j >> 1)] = v if ok else float32(0.0)
        else:
            for nt in range(4):
                xv = x0 if nt == 0 else (x1 if nt == 1 else (x2 if nt == 2 else x3))
                for j in range(4):
                    rl = 8 * nt + 2 * t + (j & 1)
                    if (ok_hi if j >= 2 else ok_lo) and r0 + rl < d_v:
                        out[i_hi if j >= 2 else i_lo, h, r0 + rl] = uo[nt, j >> 1, j & 1] + xv[j]

        cuda.syncthreads()                 # V'^T complete; every warp is done reading s_sm

        # --- K~ column slots for the update (rows 16 cb + 4t + j, columns of this warp), loaded
        # after the barrier so they do not compete with the A fragments for registers; again
        # all loads first (clamped), then the masks ---------------------------------------------
        for cb in range(CB):
            for j in range(4):
                ic = min(c0 + 16 * cb + 4 * t + j, n_t - 1)
                ksv[cb, j] = ldg_f32(ks, h * n_t + ic)
                kf[cb, 0, j] = ldg_f32(k, (ic * n_hk + hk) * d_k + kcol0)
                kf[cb, 1, j] = ldg_f32(k, (ic * n_hk + hk) * d_k + kcol1)
        for cb in range(CB):
            for j in range(4):
                sc = ksv[cb, j] if c0 + 16 * cb + 4 * t + j < n_t else float32(0.0)
                kf[cb, 0, j] = tf32(kf[cb, 0, j] * sc) if kok0 else float32(0.0)
                kf[cb, 1, j] = tf32(kf[cb, 1, j] * sc) if kok1 else float32(0.0)

        if c + 1 < nc:                     # half the next chunk's A fragments, in flight during the update
            _load_a(af, src, h, c0 + C + m0 + g, n_t, d_k, t, 0, KB // 2)

        # --- S = ec S + V'^T K~ ---------------------------------------------------------------
        e_c = ec[h, c]
        for mt in range(2):
            for nt in range(2):
                mb = (16 * mt + g) * MLD + 16 * warp + 8 * nt + 2 * t
                acc = (e_c * s_master[mb], e_c * s_master[mb + 1],
                       e_c * s_master[mb + 8 * MLD], e_c * s_master[mb + 8 * MLD + 1])
                for cb in range(CB):
                    vb = (16 * mt + g) * VTLD + 16 * cb + 4 * t
                    bk = (kf[cb, nt, 0], kf[cb, nt, 1], kf[cb, nt, 2], kf[cb, nt, 3])
                    acc = _mma_k16(acc, lds_v4_f32(vt_sm, vb), lds_v4_f32(vt_sm, vb + 8 * VTLD), bk)
                for j in range(4):
                    s_master[mb + 8 * MLD * (j >> 1) + (j & 1)] = acc[j]
                    r = 16 * mt + g + 8 * (j >> 1)
                    s_sm[r * SLD + 16 * warp + 8 * nt + 2 * t + (j & 1)] = tf32(acc[j])
        if c + 1 < nc:                     # the other half (registers: the update holds K~)
            _load_a(af, src, h, c0 + C + m0 + g, n_t, d_k, t, KB // 2, KB)
        cuda.syncthreads()                 # the new S copy is complete; V'^T may be overwritten

    for mt in range(2):
        for nt in range(2):
            for j in range(4):
                r = 16 * mt + g + 8 * (j >> 1)
                d = 16 * warp + 8 * nt + 2 * t + (j & 1)
                if r0 + r < d_v and d < d_k:
                    state[h, r0 + r, d] = s_master[r * MLD + d]
