"""Token sampling on the device, plus the NumPy reference of its deterministic parts.

Kernels (one block per row of logits [B, V] fp32; per-row parameters read from device memory,
so one captured graph serves every request mix):
* `argmax_kernel`: greedy, ties -> lower id.
* `pick_feed_kernel`: the decode graph's next token from one row, over many blocks (a single
  block streaming 248K logits waits on ~240 dependent L2 round trips per thread): the argmax
  of x (temperature 0) or of x / T + Gumbel noise g_i = -log(-log(u_i)), u_i from
  Philox4x32-10(key = seed, counter = (offset, i)) (temperature T > 0: an exact sample from
  softmax(x / T), the Gumbel-max trick). The last block to finish reduces the blocks'
  partials and feeds the token back: ids[0] = token, pos[0] += 1, offset[0] += 1, so the next
  step can be replayed before the host has read this one's token.
* `penalties_kernel`: in place; for tokens with count c > 0: repetition (HF style: divide
  positive logits / multiply negative ones by `rep`), then `- freq * c - pres`.
  `count_tokens_kernel` adds the sampled token of each row to `counts` [B, V] int32.
* `sample_kernel`: temperature <= 0 -> greedy. Else p = exp((l - max) / T) (max prob = 1), then
  top-k (keep p >= k-th largest; ties at the threshold are all kept), top-p on the top-k mass
  (smallest threshold set whose mass >= top_p * mass), min-p (keep p >= min_p), each a
  threshold found by bisection on the fp32 bit pattern; then inverse-CDF sampling in token
  order with u = Philox4x32-10(key = seed[b], counter = (offset[b], b)); offset[b] += 1.
The NumPy functions `philox_uniform_ref`, `sample_filter_ref`, `sample_ref`, `pick_scores_ref`
mirror them.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int32, uint64

from ninfer_nb.kernels.common.bf16 import bits_f32, f32_bits
from ninfer_nb.kernels.common.nbtypes import f32_1, f32_2, i32_1, i32_2, i64_1
from ninfer_nb.kernels.common.ptx import shfl_xor
from ninfer_nb.kernels.common.registry import kernel

MAX_THREADS = 1024
M32 = np.uint64(0xFFFFFFFF)
SH32 = np.uint64(32)
SH8 = np.uint64(8)
PH_M0 = np.uint64(0xD2511F53)
PH_M1 = np.uint64(0xCD9E8D57)
PH_W0 = np.uint64(0x9E3779B9)
PH_W1 = np.uint64(0xBB67AE85)
ONE_BITS_PLUS = 0x3F800001   # bit pattern just above 1.0f
TWO_M24 = np.float32(2.0 ** -24)
NEG_BIG = np.float32(-3.0e38)


@cuda.jit(device=True)
def philox_uniform(seed, counter, row):
    """Philox4x32-10; key = seed (2 x 32 bits), counter = (counter lo, counter hi, row, 0).
    Returns the first output word as a float32 in [0, 1) with 24 random bits."""
    s = uint64(seed)
    n = uint64(counter)
    c0 = n & M32
    c1 = (n >> SH32) & M32
    c2 = uint64(row) & M32
    c3 = uint64(0)
    k0 = s & M32
    k1 = (s >> SH32) & M32
    for i in range(10):
        if i > 0:
            k0 = (k0 + PH_W0) & M32
            k1 = (k1 + PH_W1) & M32
        p0 = PH_M0 * c0
        p1 = PH_M1 * c2
        hi0 = p0 >> SH32
        lo0 = p0 & M32
        hi1 = p1 >> SH32
        lo1 = p1 & M32
        c0 = (hi1 ^ c1 ^ k0) & M32
        c1 = lo1
        c2 = (hi0 ^ c3 ^ k1) & M32
        c3 = lo0
    return float32(c0 >> SH8) * TWO_M24


@cuda.jit(device=True)
def _bsum(red, v):
    """Block sum (power-of-two block, <= 1024 threads); every thread gets the total."""
    tid = cuda.threadIdx.x
    red[tid] = v
    cuda.syncthreads()
    st = cuda.blockDim.x // 2
    while st > 0:
        if tid < st:
            red[tid] += red[tid + st]
        cuda.syncthreads()
        st //= 2
    total = red[0]
    cuda.syncthreads()
    return total


@cuda.jit(device=True)
def _bargmax(red, redi, v, i):
    """Block arg-max of (v, i) pairs, ties -> lower i; every thread gets (value, index)."""
    tid = cuda.threadIdx.x
    red[tid] = v
    redi[tid] = i
    cuda.syncthreads()
    st = cuda.blockDim.x // 2
    while st > 0:
        if tid < st:
            ov = red[tid + st]
            oi = redi[tid + st]
            if ov > red[tid] or (ov == red[tid] and oi < redi[tid]):
                red[tid] = ov
                redi[tid] = oi
        cuda.syncthreads()
        st //= 2
    bv = red[0]
    bi = redi[0]
    cuda.syncthreads()
    return bv, bi


@kernel((f32_2, i32_1))
def argmax_kernel(logits, out):
    """grid B, block power of two <= 1024."""
    red = cuda.shared.array(MAX_THREADS, float32)
    redi = cuda.shared.array(MAX_THREADS, int32)
    b = cuda.blockIdx.x
    n_voc = logits.shape[1]
    bv = NEG_BIG
    bi = int32(n_voc)
    for v in range(cuda.threadIdx.x, n_voc, cuda.blockDim.x):
        x = logits[b, v]
        if x > bv:
            bv = x
            bi = v
    bv, bi = _bargmax(red, redi, bv, bi)
    if cuda.threadIdx.x == 0:
        out[b] = bi


PICK_THREADS = 256
PICK_PER_THREAD = 8                          # logits per thread, all loads issued before the compares
PICK_SPAN = PICK_THREADS * PICK_PER_THREAD   # logits per block
PICK_MAX_BLOCKS = 1024                       # partials the last block reduces (4 per thread)
U_MID = np.float32(2.0 ** -25)               # u + U_MID is in (0, 1): log(-log(u)) stays finite


@cuda.jit(device=True, inline=True)
def gumbel(seed, offset, i):
    """-log(-log(u)) with u = Philox(seed, (offset, i)) in (0, 1), fp32."""
    u = philox_uniform(seed, offset, i) + U_MID
    return -math.log(-math.log(u))


@cuda.jit(device=True, inline=True)
def _better(ov, oi, v, i):
    """(ov, oi) beats (v, i): larger value, ties -> lower index."""
    return ov > v or (ov == v and oi < i)


@cuda.jit(device=True, inline=True)
def _warp_argmax(v, i):
    for off in (16, 8, 4, 2, 1):
        ov = shfl_xor(v, off)
        oi = shfl_xor(i, off)
        if _better(ov, oi, v, i):
            v = ov
            i = oi
    return v, i


@cuda.jit(device=True, inline=True)
def _block_argmax256(v, i, sv, si):
    """Arg-max of a 256-thread block's (v, i) pairs; the result is valid in warp 0."""
    tid = cuda.threadIdx.x
    v, i = _warp_argmax(v, i)
    if (tid & 31) == 0:
        sv[tid >> 5] = v
        si[tid >> 5] = i
    cuda.syncthreads()
    if tid < 32:
        v = sv[tid & 7]
        i = si[tid & 7]
        v, i = _warp_argmax(v, i)
    return v, i


@kernel((f32_2, f32_1, i64_1, i64_1, f32_1, i32_1, i32_1, i32_1, i32_1, i32_1))
def pick_feed_kernel(logits, temperature, seed, offset, part_v, part_i, counter, out, ids, pos):
    """logits [1, V]; grid ceil(V / PICK_SPAN) <= PICK_MAX_BLOCKS, block PICK_THREADS.
    temperature / seed / offset [1] (device memory: one captured graph serves greedy and
    sampled requests). part_v / part_i [grid] scratch; counter [1] int32, 0 on entry and left
    0 (persistent). out[0] = the token (ties -> lower id), ids[0] = the same, pos[0] += 1,
    offset[0] += 1."""
    sv = cuda.shared.array(8, float32)
    si = cuda.shared.array(8, int32)
    is_last = cuda.shared.array(1, int32)
    tid = cuda.threadIdx.x
    n = logits.shape[1]
    base = cuda.blockIdx.x * PICK_SPAN + tid
    xs = cuda.local.array(PICK_PER_THREAD, float32)
    for j in range(PICK_PER_THREAD):                # unrolled: eight independent loads in flight
        xs[j] = logits[0, min(base + j * PICK_THREADS, n - 1)]
    temp = temperature[0]
    if temp > float32(0.0):                         # Gumbel-max: argmax of x / T + g
        inv_t = float32(1.0) / temp
        sd = seed[0]
        off = offset[0]
        for j in range(PICK_PER_THREAD):
            xs[j] = xs[j] * inv_t + gumbel(sd, off, base + j * PICK_THREADS)
    bv = NEG_BIG
    bi = int32(n)
    for j in range(PICK_PER_THREAD):                # ascending ids: strict > keeps the lowest on ties
        v = base + j * PICK_THREADS
        if v < n and xs[j] > bv:
            bv = xs[j]
            bi = int32(v)
    bv, bi = _block_argmax256(bv, bi, sv, si)
    if tid == 0:
        part_v[cuda.blockIdx.x] = bv
        part_i[cuda.blockIdx.x] = bi
        cuda.threadfence()
        is_last[0] = int32(cuda.atomic.add(counter, 0, 1) == cuda.gridDim.x - 1)
    cuda.syncthreads()
    if is_last[0] == 0:
        return
    cuda.threadfence()
    bv = NEG_BIG
    bi = int32(n)
    for b in range(tid, cuda.gridDim.x, PICK_THREADS):   # block order = id order
        ov = part_v[b]
        oi = part_i[b]
        if _better(ov, oi, bv, bi):
            bv = ov
            bi = oi
    bv, bi = _block_argmax256(bv, bi, sv, si)
    if tid == 0:
        out[0] = bi
        ids[0] = bi
        pos[0] += 1
        offset[0] += 1
        counter[0] = 0


@kernel((f32_2, i32_2, f32_1, f32_1, f32_1))
def penalties_kernel(logits, counts, rep, freq, pres):
    """grid (ceil(V / 256), B), block 256; logits updated in place."""
    b = cuda.blockIdx.y
    v = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if v >= logits.shape[1]:
        return
    c = counts[b, v]
    if c > 0:
        x = logits[b, v]
        r = rep[b]
        if r != 1.0:
            x = x / r if x > 0.0 else x * r
        logits[b, v] = x - freq[b] * float32(c) - pres[b]


@kernel((i32_2, i32_1))
def count_tokens_kernel(counts, tokens):
    """grid 1, block >= B: counts[b, tokens[b]] += 1."""
    b = cuda.grid(1)
    if b < tokens.shape[0]:
        counts[b, tokens[b]] += 1


@kernel((f32_2, f32_1, i32_1, f32_1, f32_1, i64_1, i64_1, f32_2, i32_1))
def sample_kernel(logits, temperature, top_k, top_p, min_p, seeds, offsets, probs, out):
    """grid B, block power of two <= 1024. probs [B, V] fp32 scratch."""
    red = cuda.shared.array(MAX_THREADS, float32)
    redi = cuda.shared.array(MAX_THREADS, int32)
    info = cuda.shared.array(2, float32)
    owner_s = cuda.shared.array(1, int32)
    b = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nthr = cuda.blockDim.x
    n_voc = logits.shape[1]
    bv = NEG_BIG
    bi = int32(n_voc)
    for v in range(tid, n_voc, nthr):
        x = logits[b, v]
        if x > bv:
            bv = x
            bi = v
    lmax, amax = _bargmax(red, redi, bv, bi)
    temp = temperature[b]
    if temp <= 0.0:
        if tid == 0:
            out[b] = amax
            offsets[b] += 1
        return
    inv_t = float32(1.0) / temp
    chunk = (n_voc + nthr - 1) // nthr
    beg = min(tid * chunk, n_voc)
    end = min(beg + chunk, n_voc)
    for v in range(beg, end):
        probs[b, v] = math.exp((logits[b, v] - lmax) * inv_t)
    # top-k threshold
    thr = float32(0.0)
    k = top_k[b]
    if k > 0 and k < n_voc:
        lo = 0
        hi = ONE_BITS_PLUS
        while hi - lo > 1:
            mid = (lo + hi) // 2
            midf = bits_f32(mid)
            c = float32(0.0)
            for v in range(beg, end):
                if probs[b, v] >= midf:
                    c += float32(1.0)
            if _bsum(red, c) >= float32(k):
                lo = mid
            else:
                hi = mid
        thr = bits_f32(lo)
    # top-p threshold over the top-k set
    tp = top_p[b]
    if tp < 1.0:
        z = float32(0.0)
        for v in range(beg, end):
            pv = probs[b, v]
            if pv >= thr:
                z += pv
        target = tp * _bsum(red, z)
        lo = f32_bits(thr)
        hi = ONE_BITS_PLUS
        while hi - lo > 1:
            mid = (lo + hi) // 2
            midf = bits_f32(mid)
            m = float32(0.0)
            for v in range(beg, end):
                pv = probs[b, v]
                if pv >= midf:
                    m += pv
            if _bsum(red, m) >= target:
                lo = mid
            else:
                hi = mid
        thr = max(thr, bits_f32(lo))
    thr = max(thr, min_p[b])
    # inverse CDF in token order over the kept set
    mine = float32(0.0)
    for v in range(beg, end):
        pv = probs[b, v]
        if pv >= thr:
            mine += pv
    red[tid] = mine
    cuda.syncthreads()
    if tid == 0:
        run = float32(0.0)
        last_nz = 0
        for i in range(nthr):
            if red[i] > 0.0:
                last_nz = i
            run += red[i]
            red[i] = run
        u = philox_uniform(seeds[b], offsets[b], b)
        offsets[b] += 1
        tgt = u * run
        own = last_nz
        for i in range(nthr):
            if red[i] > tgt:
                own = i
                break
        owner_s[0] = own
        info[0] = tgt
    cuda.syncthreads()
    if tid == owner_s[0]:
        tgt = info[0]
        acc = red[tid - 1] if tid > 0 else float32(0.0)
        pick = -1
        last = -1
        for v in range(beg, end):
            pv = probs[b, v]
            if pv >= thr:
                last = v
                acc += pv
                if acc > tgt:
                    pick = v
                    break
        out[b] = pick if pick >= 0 else last


# --- NumPy reference -----------------------------------------------------------------------

def philox_uniform_ref(seed: int, counter: int, row: int) -> np.float32:
    """Bit-exact mirror of `philox_uniform`."""
    m = 0xFFFFFFFF
    s = int(seed) & 0xFFFFFFFFFFFFFFFF
    n = int(counter) & 0xFFFFFFFFFFFFFFFF
    c0, c1, c2, c3 = n & m, (n >> 32) & m, int(row) & m, 0
    k0, k1 = s & m, (s >> 32) & m
    for i in range(10):
        if i > 0:
            k0 = (k0 + 0x9E3779B9) & m
            k1 = (k1 + 0xBB67AE85) & m
        p0 = 0xD2511F53 * c0
        p1 = 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & m, p1 & m, ((p0 >> 32) ^ c3 ^ k1) & m, p0 & m
    return np.float32(c0 >> 8) * TWO_M24


def philox_uniform_rows_ref(seed: int, counter: int, rows: np.ndarray) -> np.ndarray:
    """`philox_uniform_ref` for many rows at once (uint64 NumPy arithmetic), fp32."""
    m = np.uint64(0xFFFFFFFF)
    s = int(seed) & 0xFFFFFFFFFFFFFFFF
    n = int(counter) & 0xFFFFFFFFFFFFFFFF
    c2 = np.asarray(rows, dtype=np.int64).astype(np.uint64) & m
    c0 = np.full_like(c2, n & 0xFFFFFFFF)
    c1 = np.full_like(c2, (n >> 32) & 0xFFFFFFFF)
    c3 = np.zeros_like(c2)
    k0, k1 = s & 0xFFFFFFFF, (s >> 32) & 0xFFFFFFFF
    for i in range(10):
        if i > 0:
            k0 = (k0 + 0x9E3779B9) & 0xFFFFFFFF
            k1 = (k1 + 0xBB67AE85) & 0xFFFFFFFF
        p0 = PH_M0 * c0
        p1 = PH_M1 * c2
        c0, c1, c2, c3 = ((p1 >> SH32) ^ c1 ^ np.uint64(k0)) & m, p1 & m, ((p0 >> SH32) ^ c3 ^ np.uint64(k1)) & m, p0 & m
    return (c0 >> SH8).astype(np.float32) * TWO_M24


def pick_scores_ref(logits: np.ndarray, temperature: float, seed: int, offset: int) -> np.ndarray:
    """The scores `pick_feed_kernel` takes the argmax of, for one row [V] (fp32; the device's
    logf may differ in the last bit)."""
    x = np.asarray(logits, dtype=np.float32).reshape(-1)
    if temperature <= 0.0:
        return x
    u = philox_uniform_rows_ref(seed, offset, np.arange(x.size)) + U_MID
    g = -np.log(-np.log(u))
    return (x * (np.float32(1.0) / np.float32(temperature)) + g).astype(np.float32)


def sample_filter_ref(logits: np.ndarray, temperature: float, top_k: int, top_p: float,
                      min_p: float) -> tuple[np.ndarray, np.ndarray]:
    """One row: (p [V] fp32 with max 1, kept [V] bool), same thresholds as `sample_kernel`."""
    x = np.asarray(logits, dtype=np.float32)
    inv_t = np.float32(1.0) / np.float32(temperature)
    p = np.exp((x - x.max()) * inv_t).astype(np.float32)
    v = p.size
    thr = np.float32(0.0)
    if 0 < top_k < v:
        thr = np.sort(p)[::-1][top_k - 1]
    if top_p < 1.0:
        cand = np.sort(p[p >= thr])[::-1].astype(np.float64)
        target = np.float64(np.float32(top_p)) * cand.sum()
        idx = int(np.searchsorted(np.cumsum(cand), target, side="left"))
        thr = max(thr, np.float32(cand[min(idx, cand.size - 1)]))
    thr = max(thr, np.float32(min_p))
    return p, p >= thr


def sample_ref(logits: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float,
               seed: int, offset: int, row: int) -> tuple[int, np.ndarray, float]:
    """One row: (token, kept mask, u * kept mass). temperature <= 0 -> arg-max."""
    if temperature <= 0.0:
        return int(np.argmax(logits)), np.ones(np.asarray(logits).size, dtype=bool), 0.0
    p, kept = sample_filter_ref(logits, temperature, top_k, top_p, min_p)
    q = np.where(kept, p, 0.0).astype(np.float64)
    cdf = np.cumsum(q)
    tgt = float(philox_uniform_ref(seed, offset, row)) * cdf[-1]
    tok = int(np.searchsorted(cdf, tgt, side="right"))
    return min(tok, int(np.nonzero(kept)[0][-1])), kept, tgt


def penalties_ref(logits: np.ndarray, counts: np.ndarray, rep: np.ndarray, freq: np.ndarray,
                  pres: np.ndarray) -> np.ndarray:
    """Mirror of `penalties_kernel` on [B, V] (returns a new array)."""
    out = np.array(logits, dtype=np.float32)
    seen = counts > 0
    r = rep[:, None].astype(np.float32)
    rep_applied = np.where(out > 0, out / r, out * r)
    out = np.where(seen & (r != 1.0), rep_applied, out)
    return np.where(seen, out - freq[:, None] * counts.astype(np.float32) - pres[:, None], out).astype(np.float32)
