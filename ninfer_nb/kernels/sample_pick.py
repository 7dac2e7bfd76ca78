"""The decode graph's sampler: the next token of each of B rows of logits, with the host
sampler's filters and penalties (engine/sampler.py is the reference), exactly.

Per row b, parameters in fixed device buffers (one captured graph serves any request mix):
fpar [B, NF] fp32 (temperature, top-p, min-p, repetition / frequency / presence penalties),
ipar [B, NI] int64 (top-k, seed, offset, logit-bias entries, counts row, masked), the sparse
logit bias bias_ids / bias_val [B, NBIAS], counts [R, V] int32 (a token's generated count in
the low 24 bits, PROMPT_BIT when it is in the prompt; row ipar[b, I_CROW], -1: no penalties)
and a grammar's token bitmask [B, ceil(V / 32)] int32 (read where ipar[b, I_MASK] != 0).

The semantics (the host sampler's): x = logit, -inf where the bitmask forbids; x += bias; for a token seen in the prompt or the
output, repetition r (x / r if x > 0 else x * r); for a generated token with count c,
x -= frequency * c + presence; z = x / T (T = 0: the argmax of x, lowest id on ties). The
candidates are ordered by (z descending, id ascending); e = exp(z - max z). Kept: the
eligible tokens (e >= min-p, ids < vocab), then the first top-k of them, then the shortest
prefix of those whose mass reaches top-p of theirs, masses in fixed point (e * 2^40 as
uint64, so every sum is exact and deterministic). The token: the Gumbel-max of z + g over the
kept set, g = -log(-log(u)), u = Philox(seed, (offset, id)) (kernels/sampling.py `gumbel`):
an exact sample from softmax(z) restricted to it, with the same noise as `pick_feed_kernel`.

Kernels (in this order, every one over all rows; a row skips the ones it does not need):
1. `pick_prep_kernel`, grid (G, B), G = ceil(vocab / (threads * PICK_PER)): z into zrow
   [B, vocab] and the row maximum (zmax, an order-preserving key); a row without filters
   (greedy, or temperature alone) takes its (Gumbel-)argmax here and writes no zrow.
2. `pick_hist_kernel` (rows with top-k or top-p): a histogram of the eligible tokens' count
   and mass over NB bins of d = zmax - z (the float bits of d: a bin is 1/32 of an octave).
3. `pick_gather_kernel`: from the histogram, the bins that surely hold the kept set (those up
   to where the count reaches top-k, or without top-k the mass reaches top-p); when they
   hold at most CAP tokens, their composites (z key << 32 | ~id) into cand [B, CAP].
4. `pick_select_kernel`, grid B: sorts the candidates (bitonic, shared memory), finds the kept
   prefix and its Gumbel-max token. More than CAP candidates (a flat row under top-p): the
   threshold composite by a radix select over the row (one block, slower, exact) instead.
5. `pick_full_kernel`, grid (G, B): the rows with min-p alone and the radix-selected ones:
   the Gumbel-max over the kept tokens.
6. `pick_finish_kernel`, one thread per row: out[b] = the token, fed back for the next replay (ids[b],
   pos[b] + 1, offset + 1), counted (counts[row, token] += 1), the row maximum reset.
`sample_pick_ref` (NumPy) computes the same kept set and token by a plain sort.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int32, int64, uint64

from ninfer_nb.kernels.common.bf16 import bits_f32, f32_bits
from ninfer_nb.kernels.common.nbtypes import f32_2, i32_1, i32_2
from ninfer_nb.kernels.common.registry import kernel
from ninfer_nb.kernels.sampling import U_MID, gumbel, philox_uniform_rows_ref

i64_2 = int64[:, ::1]
u64_1 = uint64[::1]
u64_2 = uint64[:, ::1]

PICK_THREADS = 256               # threads of the row-pass kernels (1, 2, 3, 5)
PICK_PER = 8                     # tokens per thread of a row-pass block
assert PICK_THREADS * PICK_PER == 2048
SELECT_THREADS = 1024            # threads of pick_select_kernel
MAX_THREADS = 1024
NB = 1024                        # histogram bins of d = zmax - z
NB2 = 2 * NB                     # count bins, then mass bins
TILE = 2048                      # PICK_THREADS * PICK_PER
CAP = 2048                       # candidates sorted in shared memory
PROMPT_BIT = 1 << 30             # counts: the token is in the prompt
COUNT_MASK = (1 << 24) - 1       # counts: how often it was generated
MAX_VOCAB = 1 << 24

# fpar columns (fp32) and ipar columns (int64)
F_TEMP, F_TOP_P, F_MIN_P, F_REP, F_FREQ, F_PRES = range(6)
NF = 8
I_TOP_K, I_SEED, I_OFFSET, I_NBIAS, I_CROW, I_MASK = range(6)
NI = 8
# sel [B, 2] uint64: how pick_select_kernel left the row, and the kept threshold composite
SEL_FULL, SEL_DONE = np.uint64(0), np.uint64(1)

DB0 = (127 - 24) << 5            # d below 2^-24 -> bin 0; d >= 2^8 -> bin NB - 1
FX = np.float32(2.0 ** 40)       # mass fixed point: w = uint64(e * 2^40)
U0 = np.uint64(0)
U1 = np.uint64(1)
SH32 = np.uint64(32)
M32 = np.uint64(0xFFFFFFFF)
NEG_INF = np.float32(-np.inf)
DIGIT = 11                       # radix select: 11-bit digits from bit 53 down (the last 9 bits)


@cuda.jit(device=True, inline=True)
def _exp(x):
    """exp of a float32, as float32 (the simulator's math.exp returns a double)."""
    return float32(math.exp(x))


@cuda.jit(device=True, inline=True)
def _key(z):
    """float32 -> int64 in [0, 2^32), order-preserving."""
    i = int64(f32_bits(z))
    if i >= 0:
        return i + int64(2147483648)
    return int64(-1) - i


@cuda.jit(device=True, inline=True)
def _unkey(k):
    """Inverse of _key."""
    if k >= int64(2147483648):
        return bits_f32(int32(k - int64(2147483648)))
    return bits_f32(int32(int64(-1) - k))


@cuda.jit(device=True, inline=True)
def _comp(z, i):
    """uint64 composite ordering (z descending, id ascending) as one descending integer."""
    return (uint64(_key(z)) << SH32) | (M32 - uint64(i))


@cuda.jit(device=True, inline=True)
def _comp_id(c):
    return int32(M32 - (c & M32))


@cuda.jit(device=True, inline=True)
def _comp_z(c):
    return _unkey(int64(c >> SH32))


@cuda.jit(device=True, inline=True)
def _dbin(d):
    q = (f32_bits(d) >> 18) - DB0
    return min(max(q, 0), NB - 1)


@cuda.jit(device=True, inline=True)
def _weight(e):
    return uint64(e * FX)


@cuda.jit(device=True, inline=True)
def _target(m, top_p):
    """The fixed-point mass top-p of m must reach (at least 1)."""
    t = uint64(float32(m) * top_p)
    return t if t > U0 else U1


@cuda.jit(device=True, inline=True)
def _filtered(temp, k, top_p, n_voc):
    """The row needs the histogram / select kernels (top-k or top-p on a sampled row)."""
    return temp > float32(0.0) and ((k > 0 and k < n_voc) or top_p < float32(1.0))


@cuda.jit(device=True)
def _bsum(part, v):
    """Block sum of uint64 v (power-of-two block); every thread gets it."""
    tid = cuda.threadIdx.x
    part[tid] = v
    cuda.syncthreads()
    st = cuda.blockDim.x // 2
    while st > 0:
        if tid < st:
            part[tid] += part[tid + st]
        cuda.syncthreads()
        st //= 2
    total = part[0]
    cuda.syncthreads()
    return total


@cuda.jit(device=True)
def _crossing(arr, n, target, part, flag):
    """(i, before): the first i < n whose inclusive prefix sum of arr (uint64, shared) reaches
    target (>= 1), and the sum before it; (n, total) if none does."""
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    per = (n + nt - 1) // nt
    lo = min(tid * per, n)
    hi = min(lo + per, n)
    s = U0
    for i in range(lo, hi):
        s += arr[i]
    part[tid] = s
    cuda.syncthreads()
    off = 1
    while off < nt:                                 # inclusive scan of the chunk sums
        v = part[tid - off] if tid >= off else U0
        cuda.syncthreads()
        part[tid] += v
        cuda.syncthreads()
        off *= 2
    incl = part[tid]
    before = part[tid - 1] if tid > 0 else U0
    if tid == 0:
        flag[0] = uint64(n)
        flag[1] = part[nt - 1]
    cuda.syncthreads()
    if before < target and incl >= target:          # one thread: its chunk holds the crossing
        run = before
        for i in range(lo, hi):
            if run + arr[i] >= target:
                flag[0] = uint64(i)
                flag[1] = run
                break
            run += arr[i]
    cuda.syncthreads()
    i_cross = int32(flag[0])
    bef = flag[1]
    cuda.syncthreads()
    return i_cross, bef


@cuda.jit(device=True)
def _plan(hist, b, k, top_p, sh, part, flag):
    """From the row's histogram: (done-able, jstar, candidates, eligible mass, top-k on).
    The kept set lies in bins 0..jstar; done-able: they hold <= CAP tokens."""
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    for i in range(tid, NB2, nt):
        sh[i] = hist[b, i]
    cuda.syncthreads()
    s_n = U0
    s_m = U0
    for i in range(tid, NB, nt):
        s_n += sh[i]
        s_m += sh[NB + i]
    n_e = _bsum(part, s_n)
    m_e = _bsum(part, s_m)
    topk_on = k > 0 and uint64(k) < n_e
    if topk_on:
        jstar, _ = _crossing(sh, NB, uint64(k), part, flag)
    elif top_p < float32(1.0):
        jstar, _ = _crossing(sh[NB:], NB, _target(m_e, top_p), part, flag)
    else:
        jstar = NB - 1
    jstar = min(jstar, NB - 1)
    s_c = U0
    for i in range(tid, jstar + 1, nt):
        s_c += sh[i]
    n_c = _bsum(part, s_c)
    return n_c <= uint64(CAP), jstar, int32(n_c), m_e, topk_on


@kernel((f32_2, int32, f32_2, i64_2, i32_2, f32_2, i32_2, i32_2, f32_2, u64_1, u64_2, u64_1))
def pick_prep_kernel(logits, n_voc, fpar, ipar, bias_ids, bias_val, mask, counts, zrow, zmax, hist, best):
    """grid (G, B), block PICK_THREADS (any power of two <= it). logits [B, >= n_voc]; mask
    [B, >= ceil(n_voc / 32)] int32 (bit v % 32 of word v // 32 allows v; rows with ipar[b, I_MASK]);
    zrow [B, n_voc] out; zmax / best [B] must be 0 on entry (pick_finish_kernel leaves them
    so). A row without filters (greedy, or temperature alone) takes its token here: best[b]
    = the max composite of z (+ Gumbel noise), and writes no zrow."""
    tile = cuda.shared.array(TILE, float32)
    smax = cuda.shared.array(1, uint64)
    b = cuda.blockIdx.y
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    span = nt * PICK_PER
    base = cuda.blockIdx.x * span
    for i in range(cuda.blockIdx.x * nt + tid, NB2, cuda.gridDim.x * nt):
        hist[b, i] = U0
    if tid == 0:
        smax[0] = U0
    masked = ipar[b, I_MASK] != 0
    for j in range(PICK_PER):
        v = base + j * nt + tid
        x = logits[b, v] if v < n_voc else NEG_INF
        if masked and v < n_voc and (mask[b, v >> 5] >> (v & 31)) & 1 == 0:
            x = NEG_INF
        tile[j * nt + tid] = x
    cuda.syncthreads()
    for t in range(tid, ipar[b, I_NBIAS], nt):          # the sparse logit bias (distinct ids)
        v = bias_ids[b, t]
        if v >= base and v < base + span and v < n_voc:
            tile[v - base] += bias_val[b, t]
    cuda.syncthreads()
    temp = fpar[b, F_TEMP]
    crow = ipar[b, I_CROW]
    rep = fpar[b, F_REP]
    freq = fpar[b, F_FREQ]
    pres = fpar[b, F_PRES]
    sampled = temp > float32(0.0)
    direct = not (_filtered(temp, ipar[b, I_TOP_K], fpar[b, F_TOP_P], n_voc) or (sampled and fpar[b, F_MIN_P] > 0.0))
    sd = ipar[b, I_SEED]
    off = ipar[b, I_OFFSET]
    bmax = U0
    for j in range(PICK_PER):
        v = base + j * nt + tid
        if v < n_voc:
            x = tile[j * nt + tid]
            if crow >= 0:
                c = counts[crow, v]
                if c != 0 and rep != float32(1.0):
                    x = x / rep if x > float32(0.0) else x * rep
                n = c & COUNT_MASK
                if n > 0:
                    x = x - (freq * float32(n) + pres)
            z = x / temp if sampled else x
            if direct:
                bmax = max(bmax, _comp(z + gumbel(sd, off, v) if sampled else z, v))
            else:
                zrow[b, v] = z
                bmax = max(bmax, uint64(_key(z)))
    cuda.atomic.max(smax, 0, bmax)
    cuda.syncthreads()
    if tid == 0:
        if direct:
            cuda.atomic.max(best, b, smax[0])
        else:
            cuda.atomic.max(zmax, b, smax[0])


@kernel((f32_2, int32, f32_2, i64_2, u64_1, u64_2, u64_2, i32_1))
def pick_hist_kernel(zrow, n_voc, fpar, ipar, zmax, hist, plan, arrived):
    """grid (G, B), block PICK_THREADS: hist [B, 2 NB] += the eligible tokens' count (first NB)
    and fixed-point mass (last NB) per bin of d = zmax - z; the row's last block to finish
    reads the whole histogram and writes plan [B, 4] (`_plan`: done-able, jstar, candidates,
    top-k on | eligible mass). arrived [B] int32: 0 on entry, left 0."""
    sh = cuda.shared.array(NB2, uint64)
    part = cuda.shared.array(PICK_THREADS, uint64)
    flag = cuda.shared.array(2, uint64)
    last = cuda.shared.array(1, int32)
    b = cuda.blockIdx.y
    k = ipar[b, I_TOP_K]
    top_p = fpar[b, F_TOP_P]
    if not _filtered(fpar[b, F_TEMP], k, top_p, n_voc):
        return
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    for i in range(tid, NB2, nt):
        sh[i] = U0
    cuda.syncthreads()
    zm = _unkey(int64(zmax[b]))
    min_p = fpar[b, F_MIN_P]
    base = cuda.blockIdx.x * nt * PICK_PER
    for j in range(PICK_PER):
        v = base + j * nt + tid
        if v < n_voc:
            z = zrow[b, v]
            e = _exp(z - zm)
            if e >= min_p:
                q = _dbin(zm - z)
                cuda.atomic.add(sh, q, U1)
                cuda.atomic.add(sh, NB + q, _weight(e))
    cuda.syncthreads()
    for i in range(tid, NB2, nt):
        w = sh[i]
        if w != U0:
            cuda.atomic.add(hist, (b, i), w)
    cuda.threadfence()
    cuda.syncthreads()
    if tid == 0:
        last[0] = int32(cuda.atomic.add(arrived, b, 1) == cuda.gridDim.x - 1)
    cuda.syncthreads()
    if last[0] == 0:
        return
    cuda.threadfence()
    ok, jstar, n_c, m_e, topk_on = _plan(hist, b, k, top_p, sh, part, flag)
    if tid == 0:
        plan[b, 0] = U1 if ok else U0
        plan[b, 1] = uint64(jstar)
        plan[b, 2] = uint64(n_c) | (U1 << SH32 if topk_on else U0)
        plan[b, 3] = m_e
        arrived[b] = 0


@kernel((f32_2, int32, f32_2, i64_2, u64_1, u64_2, u64_2, i32_1))
def pick_gather_kernel(zrow, n_voc, fpar, ipar, zmax, plan, cand, cand_n):
    """grid (G, B), block PICK_THREADS: the eligible tokens of bins 0..jstar into cand [B, CAP]
    (any order; cand_n [B] counts them) when they are at most CAP (plan[b])."""
    b = cuda.blockIdx.y
    if not _filtered(fpar[b, F_TEMP], ipar[b, I_TOP_K], fpar[b, F_TOP_P], n_voc) or plan[b, 0] == U0:
        return
    jstar = int32(plan[b, 1])
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    zm = _unkey(int64(zmax[b]))
    min_p = fpar[b, F_MIN_P]
    base = cuda.blockIdx.x * nt * PICK_PER
    for j in range(PICK_PER):
        v = base + j * nt + tid
        if v < n_voc:
            z = zrow[b, v]
            if _exp(z - zm) >= min_p and _dbin(zm - z) <= jstar:
                cand[b, cuda.atomic.add(cand_n, b, 1)] = _comp(z, v)


@cuda.jit(device=True)
def _radix_select(zrow, b, n_voc, zm, min_p, by_mass, target, floor, sh, part, flag):
    """The composite of the eligible token (composite >= floor) where the weight (1, or the
    fixed-point mass) summed from the top first reaches target; floor if it never does.
    One block, one pass over the row per 11-bit digit."""
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    prefix = U0
    pmask = U0
    above = U0
    for lv in range(6):
        shift = max(53 - DIGIT * lv, 0)
        nbin = 1 << (DIGIT if lv < 5 else 9)
        dmask = uint64(nbin - 1)
        ush = uint64(shift)
        for i in range(tid, nbin, nt):
            sh[i] = U0
        cuda.syncthreads()
        for v in range(tid, n_voc, nt):
            z = zrow[b, v]
            e = _exp(z - zm)
            if e >= min_p:
                c = _comp(z, v)
                if c >= floor and (c & pmask) == prefix:
                    w = _weight(e) if by_mass else U1
                    cuda.atomic.add(sh, int32(dmask - ((c >> ush) & dmask)), w)
        cuda.syncthreads()
        i_cross, before = _crossing(sh, nbin, target - above, part, flag)
        if i_cross >= nbin:
            return floor
        prefix |= (dmask - uint64(i_cross)) << ush
        pmask |= dmask << ush
        above += before
    return prefix


@kernel((f32_2, int32, f32_2, i64_2, u64_1, u64_2, u64_2, i32_1, u64_2, u64_1), launch_bounds=(SELECT_THREADS, 1))
def pick_select_kernel(zrow, n_voc, fpar, ipar, zmax, plan, cand, cand_n, sel, best):
    """grid B, block SELECT_THREADS (a power of two <= 1024): the kept prefix of the sorted
    candidates and its Gumbel-max token (best[b], sel[b] = (SEL_DONE, threshold)), or, over
    CAP candidates, the threshold by radix select (sel[b] = (SEL_FULL, threshold))."""
    sbuf = cuda.shared.array(CAP, uint64)
    sh = cuda.shared.array(NB2, uint64)
    part = cuda.shared.array(MAX_THREADS, uint64)
    flag = cuda.shared.array(2, uint64)
    sbest = cuda.shared.array(1, uint64)
    b = cuda.blockIdx.x
    k = ipar[b, I_TOP_K]
    top_p = fpar[b, F_TOP_P]
    if not _filtered(fpar[b, F_TEMP], k, top_p, n_voc):
        return
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    ok = plan[b, 0] != U0
    n = int32(plan[b, 2] & M32)
    topk_on = (plan[b, 2] >> SH32) != U0
    m_e = plan[b, 3]
    zm = _unkey(int64(zmax[b]))
    min_p = fpar[b, F_MIN_P]
    if not ok:                                       # a flat row: radix select over the row
        thr = U0
        m_pre = m_e
        if topk_on:
            thr = _radix_select(zrow, b, n_voc, zm, min_p, False, uint64(k), U0, sh, part, flag)
            s = U0
            for v in range(tid, n_voc, nt):
                z = zrow[b, v]
                e = _exp(z - zm)
                if e >= min_p and _comp(z, v) >= thr:
                    s += _weight(e)
            m_pre = _bsum(part, s)
        if top_p < float32(1.0):
            thr = _radix_select(zrow, b, n_voc, zm, min_p, True, _target(m_pre, top_p), thr, sh, part, flag)
        if tid == 0:
            sel[b, 0] = SEL_FULL
            sel[b, 1] = thr
        return
    p2 = 1
    while p2 < n:
        p2 *= 2
    for i in range(tid, p2, nt):
        sbuf[i] = cand[b, i] if i < n else U0
    if tid == 0:
        sbest[0] = U0
    cuda.syncthreads()
    size = 2                                         # bitonic sort, descending
    while size <= p2:
        stride = size // 2
        while stride > 0:
            for i in range(tid, p2, nt):
                o = i ^ stride
                if o > i:
                    x = sbuf[i]
                    y = sbuf[o]
                    if ((i & size) == 0) == (x < y):
                        sbuf[i] = y
                        sbuf[o] = x
            cuda.syncthreads()
            stride //= 2
        size *= 2
    n_pre = int32(k) if topk_on else n
    n_fin = n_pre
    if top_p < float32(1.0):
        for r in range(tid, n_pre, nt):
            sh[r] = _weight(_exp(_comp_z(sbuf[r]) - zm))
        cuda.syncthreads()
        m_pre = m_e
        if topk_on:
            s = U0
            for r in range(tid, n_pre, nt):
                s += sh[r]
            m_pre = _bsum(part, s)
        i_cross, _ = _crossing(sh, n_pre, _target(m_pre, top_p), part, flag)
        n_fin = min(i_cross + 1, n_pre)
    sd = ipar[b, I_SEED]
    off = ipar[b, I_OFFSET]
    mine = U0
    for r in range(tid, n_fin, nt):
        c = sbuf[r]
        v = _comp_id(c)
        mine = max(mine, _comp(_comp_z(c) + gumbel(sd, off, v), v))
    cuda.atomic.max(sbest, 0, mine)
    cuda.syncthreads()
    if tid == 0:
        best[b] = sbest[0]
        sel[b, 0] = SEL_DONE
        sel[b, 1] = sbuf[n_fin - 1]


@kernel((f32_2, int32, f32_2, i64_2, u64_1, u64_2, u64_1))
def pick_full_kernel(zrow, n_voc, fpar, ipar, zmax, sel, best):
    """grid (G, B), block PICK_THREADS: best[b] = max composite of z (+ Gumbel noise at T > 0)
    over the row's kept tokens (eligible, composite of z >= the selected threshold), for the
    rows pick_select_kernel did not finish."""
    sbest = cuda.shared.array(1, uint64)
    b = cuda.blockIdx.y
    temp = fpar[b, F_TEMP]
    thr = U0
    if _filtered(temp, ipar[b, I_TOP_K], fpar[b, F_TOP_P], n_voc):
        if sel[b, 0] == SEL_DONE:
            return
        thr = sel[b, 1]
    elif not (temp > float32(0.0) and fpar[b, F_MIN_P] > float32(0.0)):
        return                                       # pick_prep_kernel took the token
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    if tid == 0:
        sbest[0] = U0
    cuda.syncthreads()
    sampled = temp > float32(0.0)
    min_p = fpar[b, F_MIN_P] if sampled else float32(0.0)
    zm = _unkey(int64(zmax[b]))
    sd = ipar[b, I_SEED]
    off = ipar[b, I_OFFSET]
    base = cuda.blockIdx.x * nt * PICK_PER
    mine = U0
    for j in range(PICK_PER):
        v = base + j * nt + tid
        if v < n_voc:
            z = zrow[b, v]
            if (min_p <= float32(0.0) or _exp(z - zm) >= min_p) and _comp(z, v) >= thr:
                s = z + gumbel(sd, off, v) if sampled else z
                mine = max(mine, _comp(s, v))
    cuda.atomic.max(sbest, 0, mine)
    cuda.syncthreads()
    if tid == 0:
        cuda.atomic.max(best, b, sbest[0])


@kernel((u64_1, i64_2, i32_2, u64_1, i32_1, i32_1, i32_1, i32_1))
def pick_finish_kernel(best, ipar, counts, zmax, cand_n, out, ids, pos):
    """grid ceil(B / block): out[b] = ids[b] = the token, pos[b] += 1, offset += 1, counted;
    the row's best / zmax / cand_n zeroed for the next step."""
    b = cuda.grid(1)
    if b >= out.shape[0]:
        return
    tok = _comp_id(best[b])
    out[b] = tok
    ids[b] = tok
    pos[b] += 1
    ipar[b, I_OFFSET] += 1
    crow = ipar[b, I_CROW]
    if crow >= 0:
        counts[crow, tok] += 1
    zmax[b] = U0
    best[b] = U0
    cand_n[b] = 0


# --- NumPy reference -----------------------------------------------------------------------

def penalized_ref(logits: np.ndarray, temperature: float, rep: float, freq: float, pres: float,
                  counts: np.ndarray | None, bias: dict[int, float] | None = None,
                  mask: np.ndarray | None = None) -> np.ndarray:
    """z [V] fp32 of one row, as pick_prep_kernel computes it (bitmask, bias, penalties, / T)."""
    x = np.array(logits, dtype=np.float32)
    if mask is not None:
        words = np.ascontiguousarray(mask, dtype="<i4").view(np.uint8)
        allowed = np.unpackbits(words, bitorder="little")[: x.size].astype(bool)
        x = np.where(allowed, x, np.float32(-np.inf)).astype(np.float32)
    for v, val in (bias or {}).items():
        x[v] = np.float32(x[v] + np.float32(val))
    if counts is not None:
        seen = counts != 0
        r = np.float32(rep)
        if r != np.float32(1.0):
            x = np.where(seen, np.where(x > 0, x / r, x * r), x).astype(np.float32)
        n = (counts & COUNT_MASK).astype(np.float32)
        x = np.where(n > 0, x - (np.float32(freq) * n + np.float32(pres)), x).astype(np.float32)
    if temperature > 0.0:
        x = (x / np.float32(temperature)).astype(np.float32)
    return x


def kept_ref(z: np.ndarray, top_k: int, top_p: float, min_p: float) -> np.ndarray:
    """The kept ids of one row of z (sampled), in (z descending, id ascending) order."""
    z = np.asarray(z, dtype=np.float32)
    e = np.exp(z - z.max()).astype(np.float32)
    elig = np.flatnonzero(e >= np.float32(min_p))
    order = elig[np.lexsort((elig, -z[elig]))]
    n_pre = order.size
    topk_on = 0 < top_k < order.size
    if topk_on:
        n_pre = top_k
    n_fin = n_pre
    if top_p < 1.0:
        w = (e[order[:n_pre]] * FX).astype(np.uint64)
        m_pre = int(w.sum(dtype=np.uint64))
        target = max(int(np.float32(np.float32(m_pre) * np.float32(top_p))), 1)
        cum = np.cumsum(w, dtype=np.uint64)
        n_fin = min(int(np.searchsorted(cum, np.uint64(target), side="left")) + 1, n_pre)
    return order[:n_fin]


def gumbel_ref(n: int, seed: int, offset: int) -> np.ndarray:
    """The Gumbel noise of ids 0..n-1 at (seed, offset) (the device's logf may differ in the last bit)."""
    u = philox_uniform_rows_ref(seed, offset, np.arange(n)) + U_MID
    return (-np.log(-np.log(u))).astype(np.float32)


def sample_pick_ref(z: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float,
                    seed: int, offset: int) -> tuple[int, np.ndarray]:
    """(token, kept ids) of one row of z as the kernels pick it."""
    z = np.asarray(z, dtype=np.float32)
    if temperature <= 0.0:
        return int(np.argmax(z)), np.arange(z.size)
    kept = kept_ref(z, top_k, top_p, min_p)
    s = z[kept] + gumbel_ref(z.size, seed, offset)[kept]
    best = np.flatnonzero(s == s.max())
    return int(kept[best].min()), kept
