"""KV-cache store and causal GQA attention (fp32 math; caches fp32, bf16-as-uint16, or int8
codes with one fp32 scale per 64 values, see kvquant.py).

Layouts: q [T, Hq, D]; caches [S, Hkv, D]; positions [T] int32 in device memory; query i sees
keys 0..positions[i]; q-head h reads kv-head h // (Hq / Hkv). D <= 256.
* decode: `attn_split_kernel` (grid: splits x Hq x T, 4 warps, online softmax per warp over
  two keys per pass, warp shuffles) writes per-split (acc, max, sum); `attn_combine_kernel`
  merges the splits. The split count is fixed per launch (CudaOps sizes it to fill the GPU:
  `decode_splits`), and each split's length follows the query's position on the device:
  ceil((pos + 1) / n_split) keys, at least MIN_SPLIT_KEYS. So one graph covers every position
  and every block does a few passes at any context.
  bf16 caches (the CUDA default) take attention_decode_mma.py's tensor-core split kernel,
  with the same outputs (a block per kv head) and this combine kernel, where the shape allows.
* prefill (T > 4): `attn_prefill_kernel`, a SIMT flash-attention kernel (fp32 FMA on CUDA cores,
  no tensor cores, no inline PTX, so it runs in the simulator; ptxas: 128 registers, no spills,
  46,848 B static shared memory). CudaOps uses it for prefill_attention="simt", for head dims
  that are not a multiple of 64, and for chunks of 5..16 tokens; longer chunks take the flash
  kernel (attention_flash.py) or the GEMM path (attention_gemm.py).

Prefill design (block = 256 threads, grid (ceil(T * G / 64), Hkv), G = Hq / Hkv):
* GQA packing: a block owns 64 query rows of one kv head, row = t * G + g (q-head hk * G + g),
  so every K/V tile staged in shared memory serves all G q heads (Qwen3.6-27B: G = 6, ~11
  tokens per block). Row tiles run heaviest (latest positions) first.
* Per 32-key tile (tiles past the block's largest position are skipped; the mask is applied
  per element, so chunks may start at any position):
  1. S = Q K^T (64 x 32) over D in 32-wide slices: the Q and K slices are staged [d][row] and
     [d][key] into two alternating buffers, the next slice's global loads are issued before the
     current slice's FMAs, one barrier per slice. Each half of the block takes 16 dims of a
     slice; a thread accumulates a 4 x 4 micro-tile (8 shared loads per 16 FMA).
  2. Half 1 hands its partial sums to half 0, which scales, masks and runs the online softmax:
     row max over the 8 key groups through shared memory, P = exp(S - m) into shared memory,
     the correction exp(m_old - m) per row; running sums are kept per (key group, row) and
     added once at the end. Meanwhile all threads stage the V tile [32 keys][D] as fp32.
  3. O = O * corr + P V: a thread owns 4 rows x 16 dims of O in registers (20 shared loads per
     64 FMA); 64-dim column blocks past D are skipped.
  Barriers per key tile: ceil(D / 32) + 4 (12 at D = 256).
* Sizes: the O accumulator (64 rows x 256 dims / 256 threads = 64 registers per thread) and
  launch_bounds(256, 2) (two blocks, 16 warps per SM) fix 64 rows per block; the V tile as
  full-D rows (32 x 256 x 4 B = 32 KB) lets the P.V loop address its accumulators statically and
  fixes 32 keys per tile under the 48 KB static shared-memory limit. Q for 64 rows x 256 dims
  (64 KB) cannot stay resident, so it is re-staged per key tile, slice by slice (from L2), in
  the buffers that hold the V tile during P.V. Shared: 32 KB (V tile / two 12.25 KB Q+K
  staging buffers) + 8.5 KB P (also the half-sum exchange) + 2 x 2.1 KB max/sum + row data.
* Arithmetic intensity per block and 32-key tile at D = 256: 2.1 MFLOP (Q K^T and P V) against
  64 KB of Q plus 2 x 32 KB of K/V (fp32 cache; 2 x 16 KB bf16, 2 x 8 KB int8) read from L2/HBM,
  ~16-22 FLOP per byte; each K/V row is read once per 64 query rows, not once per q head.
  Shared memory averages ~2.2 FMA per 32-bit shared access (the 4 x 4 S micro-tile is the
  weak part), so the expected ceiling is about half the fp32 FMA peak; the old kernel (16 x 16
  tiles, one q head per block) did 0.5 FMA per shared load on a serial 256-FMA chain per score.
* Any D <= 256 works (partial slices are zero-filled). Indices are masked with NNEG where numba
  cannot prove them non-negative, which removes its negative-index wraparound code.
"""
from __future__ import annotations

import math

from numba import cuda, float32

from ninfer_nb.kernels.attention.kvquant import GROUP, kv_load
from ninfer_nb.kernels.attention.paging import flat_row, paged_row, seq_of
from ninfer_nb.kernels.common.bf16 import from_f32
from ninfer_nb.kernels.common.nbtypes import (
    f32,
    f32_2,
    f32_3,
    f32_4,
    i8_3,
    i32,
    i32_1,
    i32_2,
    u16_3,
)
from ninfer_nb.kernels.common.ptx import ldg_f32
from ninfer_nb.kernels.common.registry import KernelSpec, kernel
from ninfer_nb.kernels.common.warp import warp_max as _warp_max
from ninfer_nb.kernels.common.warp import warp_sum as _warp_sum

NEG = -1.0e30
MAX_D = 256
SPLIT_WARPS = 4
MIN_SPLIT_KEYS = 16   # decode: shortest split (two passes of the 4 warps)
SPLIT_WAVES = 1       # decode: splits x heads x tokens ~ this many waves of resident blocks
SPLIT_BLOCKS_PER_SM = 4   # attn_split_kernel's launch_bounds minimum
MAX_SPLITS = 1024     # decode splits the combine kernel merges


def decode_splits(cache_len: int, blocks_per_split: int, resident_blocks: int) -> int:
    """Decode split count: enough blocks (splits x `blocks_per_split`, the heads x tokens of one
    launch) for SPLIT_WAVES waves of `resident_blocks`, no more than a cache of `cache_len`
    keys can fill at MIN_SPLIT_KEYS each, and at most MAX_SPLITS (the combine's buffer)."""
    want = -(-SPLIT_WAVES * resident_blocks // max(blocks_per_split, 1))
    return max(1, min(want, -(-cache_len // MIN_SPLIT_KEYS), MAX_SPLITS))


@cuda.jit(device=True, inline=True)
def _split_range(pos, sp, n_split):
    """Keys [k0, k1) of split sp for a query at position pos (it sees keys 0..pos)."""
    n_keys = pos + 1
    split_len = max((n_keys + n_split - 1) // n_split, MIN_SPLIT_KEYS)
    k0 = sp * split_len
    return k0, min(k0 + split_len, n_keys)


@kernel((f32_3, f32_3, f32_3, f32_3, i32_1), (u16_3, u16_3, f32_3, f32_3, i32_1))
def kv_store_kernel(k_cache, v_cache, k, v, positions):
    """grid (Hkv, T), block 128: caches[positions[t], h, :] = k/v[t, h, :]."""
    h = cuda.blockIdx.x
    t = cuda.blockIdx.y
    p = positions[t]
    for d in range(cuda.threadIdx.x, k.shape[2], cuda.blockDim.x):
        k_cache[p, h, d] = from_f32(k_cache, k[t, h, d])
        v_cache[p, h, d] = from_f32(v_cache, v[t, h, d])


@kernel((i8_3, i8_3, f32_3, f32_3, f32_3, f32_3, i32_1))
def kv_store_int8_kernel(k_codes, v_codes, k_scale, v_scale, k, v, positions):
    """grid (Hkv, T), block 32: thread g quantises 64-value group g of row positions[t]."""
    h = cuda.blockIdx.x
    t = cuda.blockIdx.y
    p = positions[t]
    n_groups = k.shape[2] // GROUP
    for g in range(cuda.threadIdx.x, 2 * n_groups, cuda.blockDim.x):
        src = k if g < n_groups else v
        codes = k_codes if g < n_groups else v_codes
        scales = k_scale if g < n_groups else v_scale
        gg = g if g < n_groups else g - n_groups
        amax = float32(0.0)
        for i in range(GROUP):
            amax = max(amax, abs(src[t, h, gg * GROUP + i]))
        sc = amax / float32(127.0)
        scales[p, h, gg] = sc
        inv = float32(1.0) / sc if sc > float32(0.0) else float32(0.0)
        for i in range(GROUP):
            c = round(src[t, h, gg * GROUP + i] * inv)          # round half to even, like np.rint
            codes[p, h, gg * GROUP + i] = max(-127, min(127, c))


_SPLIT_SIGS = [(f32_3, c, c, f32_3, f32_3, i32_1, f32, f32_4, f32_4) for c in (f32_3, u16_3, i8_3)]
_SPLIT_PAGED_SIGS = [(f32_3, c, c, f32_3, f32_3, i32_1, i32_2, f32, f32_4, f32_4) for c in (f32_3, u16_3, i8_3)]


KEYS_PER_PASS = 4     # decode: keys a warp loads (K and V rows) before any math


@cuda.jit(device=True, inline=True)
def _pass_softmax(qv, kk, vv, sc, acc, m, l, j, k1):
    """One pass of a decode warp: the scores of its KEYS_PER_PASS loaded keys (K rows kk, V rows
    vv [KEYS_PER_PASS, 8], this lane's 8 dims; key u is j + u SPLIT_WARPS, counted only below
    k1), one online-softmax update of (acc, m, l). Returns (m, l); acc is updated in place."""
    m_new = m
    for u in range(KEYS_PER_PASS):
        s_ = float32(0.0)
        for e in range(8):
            s_ += qv[e] * kk[u, e]
        s_ = _warp_sum(s_)
        if j + u * SPLIT_WARPS < k1:
            m_new = max(m_new, s_)
        sc[u] = s_
    corr = math.exp(m - m_new)
    l = l * corr
    for e in range(8):
        acc[e] = acc[e] * corr
    for u in range(KEYS_PER_PASS):
        p = math.exp(sc[u] - m_new) if j + u * SPLIT_WARPS < k1 else float32(0.0)
        l += p
        for e in range(8):
            acc[e] += p * vv[u, e]
    return m_new, l


def _make_split(paged: bool) -> KernelSpec:
    """attn_split_kernel (one sequence, key j at cache row j) or attn_split_paged_kernel (the
    same, with page_table [B, P] after positions: token t's keys through its sequence's row;
    paging.py)."""
    key_row = paged_row if paged else flat_row

    @cuda.jit(device=True, inline=True)
    def split(q, k_cache, v_cache, k_scale, v_scale, positions, page_table, scale, part_o, part_ml):
        """grid (n_split, Hq, T), block 128. part_o [T, Hq, n_split, D] (unnormalised),
        part_ml [T, Hq, n_split, 2] = (running max, running sum); a split past the query's keys
        writes (NEG, 0).

        Warp w walks keys j = k0 + w, + 4, ... KEYS_PER_PASS at a time: it issues the K and the V
        loads of all of them (lane: dims lane + 32 e) before any math, so one pass waits for one
        memory round trip, then runs the independent dot products and shuffle reductions side
        by side, and one online-softmax update for the group. (Two keys per pass with the V loads
        after the softmax waited two round trips per two keys.) Keys past k1 load key k0 + w
        again and get p = 0."""
        sm_m = cuda.shared.array(SPLIT_WARPS, float32)
        sm_l = cuda.shared.array(SPLIT_WARPS, float32)
        sm_acc = cuda.shared.array((SPLIT_WARPS, MAX_D), float32)
        qv = cuda.local.array(8, float32)
        acc = cuda.local.array(8, float32)
        kk = cuda.local.array((KEYS_PER_PASS, 8), float32)
        vv = cuda.local.array((KEYS_PER_PASS, 8), float32)
        sc = cuda.local.array(KEYS_PER_PASS, float32)
        sp = cuda.blockIdx.x
        h = cuda.blockIdx.y
        t = cuda.blockIdx.z
        lane = cuda.threadIdx.x & 31
        warp = cuda.threadIdx.x >> 5
        d_head = q.shape[2]
        hk = h // (q.shape[1] // k_cache.shape[1])
        b = seq_of(t, positions.shape[0], page_table.shape[0])
        k0, k1 = _split_range(positions[t], sp, part_o.shape[2])
        for e in range(8):
            d = lane + 32 * e
            qv[e] = q[t, h, d] * scale if d < d_head else float32(0.0)
            acc[e] = float32(0.0)
        m = float32(NEG)
        l = float32(0.0)
        j = k0 + warp
        while j < k1:
            for u in range(KEYS_PER_PASS):
                ju = j + u * SPLIT_WARPS
                ju = key_row(page_table, b, ju if ju < k1 else j)
                for e in range(8):
                    d = lane + 32 * e
                    ok = d < d_head
                    kk[u, e] = kv_load(k_cache, k_scale, ju, hk, d) if ok else float32(0.0)
                    vv[u, e] = kv_load(v_cache, v_scale, ju, hk, d) if ok else float32(0.0)
            m, l = _pass_softmax(qv, kk, vv, sc, acc, m, l, j, k1)
            j += KEYS_PER_PASS * SPLIT_WARPS
        if lane == 0:
            sm_m[warp] = m
            sm_l[warp] = l
        for e in range(8):
            d = lane + 32 * e
            if d < d_head:
                sm_acc[warp, d] = acc[e]
        _merge_split_warps(sm_m, sm_l, sm_acc, d_head, part_o, part_ml, t, h, sp)

    if paged:
        def attn_split_paged_kernel(q, k_cache, v_cache, k_scale, v_scale, positions, page_table, scale, part_o,
                                    part_ml):
            split(q, k_cache, v_cache, k_scale, v_scale, positions, page_table, scale, part_o, part_ml)

        return kernel(*_SPLIT_PAGED_SIGS, sim=False, launch_bounds=(128, 4))(attn_split_paged_kernel)

    def attn_split_kernel(q, k_cache, v_cache, k_scale, v_scale, positions, scale, part_o, part_ml):
        split(q, k_cache, v_cache, k_scale, v_scale, positions, positions, scale, part_o, part_ml)

    return kernel(*_SPLIT_SIGS, sim=False, launch_bounds=(128, 4))(attn_split_kernel)


@cuda.jit(device=True, inline=True)
def _merge_split_warps(sm_m, sm_l, sm_acc, d_head, part_o, part_ml, t, h, sp):
    """The split's partial from its SPLIT_WARPS warps' (max, sum, acc) in shared memory (each
    warp has stored its own; the barrier here makes them visible): part_o[t, h, sp, :],
    part_ml[t, h, sp] = (max, sum)."""
    cuda.syncthreads()
    mm = float32(NEG)
    for w_ in range(SPLIT_WARPS):
        mm = max(mm, sm_m[w_])
    for d in range(cuda.threadIdx.x, d_head, cuda.blockDim.x):
        o = float32(0.0)
        for w_ in range(SPLIT_WARPS):
            o += sm_acc[w_, d] * math.exp(sm_m[w_] - mm)
        part_o[t, h, sp, d] = o
    if cuda.threadIdx.x == 0:
        ll = float32(0.0)
        for w_ in range(SPLIT_WARPS):
            ll += sm_l[w_] * math.exp(sm_m[w_] - mm)
        part_ml[t, h, sp, 0] = mm
        part_ml[t, h, sp, 1] = ll


attn_split_kernel = _make_split(False)
attn_split_paged_kernel = _make_split(True)


COMBINE_THREADS = 256   # = MAX_D: thread d owns output dim d
COMBINE_UNROLL = 16
COMBINE_WARPS = COMBINE_THREADS // 32


@cuda.jit(device=True, inline=True)
def _block_max(v, red, lane, warp):
    """Max of v over the block's COMBINE_WARPS warps (every thread gets it): warp shuffles, the
    warps' maxima through red [COMBINE_WARPS], one barrier."""
    v = _warp_max(v)
    if lane == 0:
        red[warp] = v
    cuda.syncthreads()
    m = red[0]
    for i in range(1, COMBINE_WARPS):
        m = max(m, red[i])
    return m


@cuda.jit(device=True, inline=True)
def _block_sum(v, red, lane, warp):
    """_block_max's sum (red must not be the buffer a _block_max before it used)."""
    v = _warp_sum(v)
    if lane == 0:
        red[warp] = v
    cuda.syncthreads()
    m = red[0]
    for i in range(1, COMBINE_WARPS):
        m += red[i]
    return m


@kernel((f32_4, f32_4, i32_1, f32_2, i32, i32, f32_3), launch_bounds=(COMBINE_THREADS, 1))
def attn_combine_kernel(part_o, part_ml, positions, gate, has_gate, min_split, out):
    """grid (Hq, T), block COMBINE_THREADS: out[t, h, :] = merge of the splits that hold keys
    (split length max(ceil(n_keys / n_split), min_split), as the split kernel that wrote them),
    times sigmoid(gate[t, h * D + d]) when has_gate (the gated attention's output gate: one
    launch less per attention layer and decode step; else gate is an unused dummy).
    Thread d owns dim d (D <= COMBINE_THREADS). Its first COMBINE_UNROLL split partials and
    its gate value are loaded before anything waits: their round trip overlaps the split
    weights exp(m_s - max) (one split per thread, block max / sum by warp shuffles and one
    barrier each); then the partials COMBINE_UNROLL at a time, loads predicated, not looped
    (the old loop over the remainder waited one round trip per split: with fewer than 16
    splits every split; 8 for the tensor-core split kernel at 512 keys)."""
    wts = cuda.shared.array(MAX_SPLITS, float32)
    red = cuda.shared.array((2, COMBINE_WARPS), float32)
    ob = cuda.local.array(COMBINE_UNROLL, float32)
    h = cuda.blockIdx.x
    t = cuda.blockIdx.y
    tid = cuda.threadIdx.x
    lane = tid & 31
    warp = tid >> 5
    d_head = out.shape[2]
    d = min(tid, d_head - 1)            # threads past D duplicate the last dim's loads, store nothing
    n_split = part_o.shape[2]
    n_keys = positions[t] + 1
    split_len = max((n_keys + n_split - 1) // n_split, min_split)
    n_split = min(n_split, (n_keys + split_len - 1) // split_len)
    pbase = (t * part_o.shape[1] + h) * part_o.shape[2] * d_head + d     # part_o[t, h, 0, d], flat
    for u in range(COMBINE_UNROLL):
        ob[u] = ldg_f32(part_o, pbase + u * d_head) if u < n_split else float32(0.0)
    gv = gate[t, h * d_head + d] if has_gate != 0 else float32(0.0)
    mx = float32(NEG)
    for s_ in range(tid, n_split, COMBINE_THREADS):
        mx = max(mx, part_ml[t, h, s_, 0])
    mm = _block_max(mx, red[0], lane, warp)
    ll = float32(0.0)
    for s_ in range(tid, n_split, COMBINE_THREADS):
        w_ = math.exp(part_ml[t, h, s_, 0] - mm)
        wts[s_] = w_
        ll += part_ml[t, h, s_, 1] * w_
    inv = float32(1.0) / _block_sum(ll, red[1], lane, warp)      # its barrier also publishes wts
    o = float32(0.0)
    s0 = 0
    while s0 < n_split:
        if s0 > 0:
            for u in range(COMBINE_UNROLL):
                ob[u] = ldg_f32(part_o, pbase + (s0 + u) * d_head) if s0 + u < n_split else float32(0.0)
        for u in range(COMBINE_UNROLL):
            o += ob[u] * (wts[s0 + u] if s0 + u < n_split else float32(0.0))
        s0 += COMBINE_UNROLL
    if has_gate != 0:
        o = o / (float32(1.0) + math.exp(-gv))
    if tid < d_head:
        out[t, h, tid] = o * inv


PRE_THREADS = 256
PRE_BM = 64           # query rows per block: (token, q-head-in-group) pairs of one kv head
PRE_BN = 32           # keys per tile
PRE_DS = 32           # head-dim slice of the Q.K^T phase (each half-block takes 16 of it)
QP = PRE_BM + 1       # pitch of the staged Q slice, stored [d][row] (conflict-free stores)
KP = PRE_BN + 1       # pitch of the staged K slice, stored [d][key]
K_OFF = PRE_DS * QP   # K slice offset inside one staging buffer
BUF = K_OFF + PRE_DS * KP
A_SIZE = PRE_BN * MAX_D                 # region A: V tile [key][d], or two staging buffers
PP = PRE_BM + 4       # pitch of P, stored [key][row] (also holds the Q.K^T half-sums)
P_SIZE = PRE_BN * PP
RP = PRE_BM + 4       # pitch of the per-(key-group, row) max / sum exchange
R_SIZE = 8 * RP
NNEG = 0x7FFFFFFF     # index & NNEG: provably >= 0, so numba drops its wraparound code
N_PF = 12             # staging values per thread per slice: 8 of Q, 4 of K
assert 2 * BUF <= A_SIZE and 16 * 128 <= P_SIZE and MAX_D <= COMBINE_THREADS


_PRE_SIGS = [(f32_2, c, c, f32_3, f32_3, i32_1, f32, f32_2) for c in (f32_3, u16_3, i8_3)]
_PRE_PAGED_SIGS = [(f32_2, c, c, f32_3, f32_3, i32_1, i32_2, f32, f32_2) for c in (f32_3, u16_3, i8_3)]


def _make_prefill(paged: bool) -> KernelSpec:
    """attn_prefill_kernel, or attn_prefill_paged_kernel: the same with page_table [1, P] after
    positions (one sequence; key j at row paging.paged_row(page_table, 0, j))."""
    key_row = paged_row if paged else flat_row

    @cuda.jit(device=True)
    def qk_elem(q, k_cache, k_scale, page_table, qrow_s, hk, j0, kmax, d, d_head, lrow, l):
        """Staging element l (< 8: Q row lrow + 8l; else K key j0 + lrow + 8(l - 8)) at dim d."""
        if d >= d_head:
            return float32(0.0)
        if l < 8:
            rb = qrow_s[lrow + 8 * l]
            return q[rb, d] if rb >= 0 else float32(0.0)
        j = j0 + lrow + 8 * (l - 8)
        return kv_load(k_cache, k_scale, key_row(page_table, 0, j), hk, d) if j <= kmax else float32(0.0)

    @cuda.jit(device=True, inline=True)
    def prefill(q, k_cache, v_cache, k_scale, v_scale, positions, page_table, scale, out):
        """q, out [T * Hq, D] (row t * Hq + h); grid (ceil(T * G / 64), Hkv), block 256, G = Hq / Hkv.
        Block rows r = (t * G + g) - r0 for q-head hk * G + g; see the module docstring."""
        sa = cuda.shared.array(A_SIZE, float32)
        sp = cuda.shared.array(P_SIZE, float32)
        sr = cuda.shared.array(R_SIZE, float32)
        ls_s = cuda.shared.array(R_SIZE, float32)   # running sums, per (key group, row)
        m_s = cuda.shared.array(PRE_BM, float32)    # running row max
        corr_s = cuda.shared.array(PRE_BM, float32)
        rpos_s = cuda.shared.array(PRE_BM, i32)
        qrow_s = cuda.shared.array(PRE_BM, i32)
        acc = cuda.local.array((4, 16), float32)    # O rows ty + 16i, dims tx + 16c
        sc = cuda.local.array((4, 4), float32)      # S rows ry + 16i, keys kx + 8j
        mo = cuda.local.array(4, float32)           # row max before this tile (half 0)
        pf = cuda.local.array(N_PF, float32)        # next staging slice, in flight
        tid = cuda.threadIdx.x & 1023       # the masks make indices provably >= 0 (see NNEG)
        hk = cuda.blockIdx.y & 0xFFFF
        n_tok = positions.shape[0]
        hq = q.shape[0] // n_tok
        d_head = q.shape[1]
        grp = hq // k_cache.shape[1]
        r0 = (cuda.gridDim.x - 1 - cuda.blockIdx.x) * PRE_BM     # longest rows first
        if tid < PRE_BM:
            rr = r0 + tid
            if rr < n_tok * grp:
                t = rr // grp
                qrow_s[tid] = t * hq + hk * grp + (rr - t * grp)
                rpos_s[tid] = positions[t]
            else:
                qrow_s[tid] = -1
                rpos_s[tid] = -1
            m_s[tid] = float32(NEG)
        for r in range(tid, R_SIZE, PRE_THREADS):
            ls_s[r] = float32(0.0)
        for i in range(4):
            for c in range(16):
                acc[i, c] = float32(0.0)
        cuda.syncthreads()
        kmax = -1
        for r in range(PRE_BM):
            kmax = max(kmax, rpos_s[r])
        half = tid >> 7                 # Q.K^T: which 16 dims of each 32-dim slice
        tig = tid & 127
        ry = tig >> 3
        kx = tig & 7
        ty = tid >> 4                   # P.V: rows ty + 16i, dims tx + 16c
        tx = tid & 15
        lrow = tid >> 5                 # staging: rows / keys lrow + 8l, dim lcol of the slice
        lcol = tid & 31
        n_sl = (d_head + PRE_DS - 1) // PRE_DS
        ncb = (d_head + 63) // 64
        for l in range(N_PF):
            pf[l] = qk_elem(q, k_cache, k_scale, page_table, qrow_s, hk, 0, kmax, lcol, d_head, lrow, l)
        for j0 in range(0, kmax + 1, PRE_BN):
            j0 = j0 & NNEG
            # ---- S = Q K^T over D slices: double-buffered, one barrier per slice
            for i in range(4):
                for j in range(4):
                    sc[i, j] = float32(0.0)
            for s in range(n_sl):
                b = (s & 1) * BUF
                for l in range(8):
                    sa[b + lcol * QP + lrow + 8 * l] = pf[l]
                for l in range(4):
                    sa[b + K_OFF + lcol * KP + lrow + 8 * l] = pf[8 + l]
                cuda.syncthreads()
                if s + 1 < n_sl:
                    for l in range(N_PF):
                        pf[l] = qk_elem(q, k_cache, k_scale, page_table, qrow_s, hk, j0, kmax, (((s + 1) * PRE_DS) & NNEG) + lcol,
                                         d_head, lrow, l)
                qb = b + half * (PRE_DS // 2) * QP + ry
                kb = b + K_OFF + half * (PRE_DS // 2) * KP + kx
                for dd in range(PRE_DS // 2):
                    qi = (qb + dd * QP) & NNEG
                    ki = (kb + dd * KP) & NNEG
                    q0 = sa[qi]
                    q1 = sa[qi + 16]
                    q2 = sa[qi + 32]
                    q3 = sa[qi + 48]
                    for j in range(4):
                        kv = sa[ki + 8 * j]
                        sc[0, j] += q0 * kv
                        sc[1, j] += q1 * kv
                        sc[2, j] += q2 * kv
                        sc[3, j] += q3 * kv
            # ---- half 1 hands its partial sums to half 0; everyone stages the V tile
            if half == 1:
                for i in range(4):
                    for j in range(4):
                        sp[(i * 4 + j) * 128 + tig] = sc[i, j]
            cuda.syncthreads()
            if tid < d_head:
                for l in range(PRE_BN):
                    j = j0 + l
                    sa[l * MAX_D + tid] = (kv_load(v_cache, v_scale, key_row(page_table, 0, j), hk, tid)
                                                 if j <= kmax else float32(0.0))
            if half == 0:
                for i in range(4):
                    rp = rpos_s[ry + 16 * i]
                    mx = float32(NEG)
                    for j in range(4):
                        v = (sc[i, j] + sp[(i * 4 + j) * 128 + tig]) * scale
                        if j0 + kx + 8 * j > rp:
                            v = float32(NEG)
                        sc[i, j] = v
                        mx = max(mx, v)
                    sr[kx * RP + ry + 16 * i] = mx
                    mo[i] = m_s[ry + 16 * i]
            cuda.syncthreads()
            # ---- online softmax (half 0): row max over the 8 key groups, P to shared memory
            if half == 0:
                for i in range(4):
                    row = ry + 16 * i
                    mt = mo[i]
                    for g in range(8):
                        mt = max(mt, sr[g * RP + row])
                    corr = math.exp(mo[i] - mt)
                    ls = float32(0.0)
                    for j in range(4):
                        v = sc[i, j]
                        p = math.exp(v - mt) if v > float32(NEG) else float32(0.0)
                        sp[(kx + 8 * j) * PP + row] = p
                        ls += p
                    ls_s[kx * RP + row] = ls_s[kx * RP + row] * corr + ls
                    if kx == 0:
                        corr_s[row] = corr
                        m_s[row] = mt
            cuda.syncthreads()
            if j0 + PRE_BN <= kmax:     # next tile's first Q/K slice, in flight during P.V
                for l in range(N_PF):
                    pf[l] = qk_elem(q, k_cache, k_scale, page_table, qrow_s, hk, j0 + PRE_BN, kmax, lcol, d_head, lrow, l)
            # ---- O = O * corr + P V: 4 rows x 16 dims per thread
            for i in range(4):
                corr = corr_s[ty + 16 * i]
                for c in range(16):
                    acc[i, c] *= corr
            for kk in range(PRE_BN):
                pb = (kk * PP + ty) & NNEG
                p0 = sp[pb]
                p1 = sp[pb + 16]
                p2 = sp[pb + 32]
                p3 = sp[pb + 48]
                vb = (kk * MAX_D + tx) & NNEG
                for c in range(4):
                    vv = sa[vb + 16 * c]
                    acc[0, c] += p0 * vv
                    acc[1, c] += p1 * vv
                    acc[2, c] += p2 * vv
                    acc[3, c] += p3 * vv
                if ncb > 1:
                    for c in range(4, 8):
                        vv = sa[vb + 16 * c]
                        acc[0, c] += p0 * vv
                        acc[1, c] += p1 * vv
                        acc[2, c] += p2 * vv
                        acc[3, c] += p3 * vv
                if ncb > 2:
                    for c in range(8, 12):
                        vv = sa[vb + 16 * c]
                        acc[0, c] += p0 * vv
                        acc[1, c] += p1 * vv
                        acc[2, c] += p2 * vv
                        acc[3, c] += p3 * vv
                if ncb > 3:
                    for c in range(12, 16):
                        vv = sa[vb + 16 * c]
                        acc[0, c] += p0 * vv
                        acc[1, c] += p1 * vv
                        acc[2, c] += p2 * vv
                        acc[3, c] += p3 * vv
            cuda.syncthreads()
        for i in range(4):
            row = ty + 16 * i
            rb = qrow_s[row]
            if rb >= 0:
                lsum = float32(0.0)
                for g in range(8):
                    lsum += ls_s[g * RP + row]
                inv = float32(1.0) / lsum
                for c in range(16):
                    d = tx + 16 * c
                    if d < d_head:
                        out[rb, d] = acc[i, c] * inv

    if paged:
        def attn_prefill_paged_kernel(q, k_cache, v_cache, k_scale, v_scale, positions, page_table, scale, out):
            prefill(q, k_cache, v_cache, k_scale, v_scale, positions, page_table, scale, out)

        return kernel(*_PRE_PAGED_SIGS, launch_bounds=(PRE_THREADS, 2))(attn_prefill_paged_kernel)

    def attn_prefill_kernel(q, k_cache, v_cache, k_scale, v_scale, positions, scale, out):
        prefill(q, k_cache, v_cache, k_scale, v_scale, positions, positions, scale, out)

    return kernel(*_PRE_SIGS, launch_bounds=(PRE_THREADS, 2))(attn_prefill_kernel)


attn_prefill_kernel = _make_prefill(False)
attn_prefill_paged_kernel = _make_prefill(True)
