"""Log-probabilities on the device: each row's chosen token's logprob and its top-N (N <= 20)
alternatives under the raw logits (the model's own distribution, as engine/logprobs.py
token_logprobs computes on the host), into a small buffer, so a request that wants logprobs
needs no logits row on the host.

`logprob_partial_kernel`, grid (G, B), G = ceil(vocab / (threads * LP_PER)): per block of ids,
its maximum, the sum of exp(x - maximum), and its N largest (x, id) composites (x descending,
id ascending; kernels/sample_pick.py's ordering) by N rounds of a block max. Then
`logprob_final_kernel`, grid B: lse = M + log(sum over blocks s_b * exp(m_b - M)); out[b, 0] =
x[token] - lse, out[b, 1 + j] = the j-th largest x - lse, ids[b, j] its id.
`token_logprobs_ref` is the NumPy mirror.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int32, uint64

from ninfer_nb.kernels.common.nbtypes import f32_2, i32_1, i32_2
from ninfer_nb.kernels.common.registry import kernel
from ninfer_nb.kernels.sample_pick import U0, _comp, _comp_id, _comp_z
from ninfer_nb.kernels.sampling import _bsum

LP_THREADS = 256
LP_PER = 8                         # ids per thread of a partial block
MAX_TOP = 20
MAX_BLOCKS = 128                   # partial blocks a row may have (vocab <= 128 * 2048)
CAND = MAX_BLOCKS * MAX_TOP
NEG_INF = np.float32(-np.inf)

u64_2 = uint64[:, ::1]


@cuda.jit(device=True)
def _bmax_f32(red, v):
    tid = cuda.threadIdx.x
    red[tid] = v
    cuda.syncthreads()
    st = cuda.blockDim.x // 2
    while st > 0:
        if tid < st:
            red[tid] = max(red[tid], red[tid + st])
        cuda.syncthreads()
        st //= 2
    out = red[0]
    cuda.syncthreads()
    return out


@cuda.jit(device=True)
def _round_max(sbest, mine):
    """Block max of uint64 `mine` (one round; every thread gets it)."""
    if cuda.threadIdx.x == 0:
        sbest[0] = U0
    cuda.syncthreads()
    cuda.atomic.max(sbest, 0, mine)
    cuda.syncthreads()
    out = sbest[0]
    cuda.syncthreads()
    return out


@kernel((f32_2, int32, int32, f32_2, u64_2))
def logprob_partial_kernel(logits, n_voc, n_top, part, cand):
    """grid (G, B), block LP_THREADS (a power of two <= it). part [B, 2 G] (block max, sum of
    exp(x - max)); cand [B, G * MAX_TOP] (the block's n_top largest composites, in order)."""
    red = cuda.shared.array(LP_THREADS, float32)
    sbest = cuda.shared.array(1, uint64)
    cs = cuda.local.array(LP_PER, uint64)
    b = cuda.blockIdx.y
    blk = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    base = blk * nt * LP_PER
    m = NEG_INF
    for j in range(LP_PER):
        v = base + j * nt + tid
        x = logits[b, v] if v < n_voc else NEG_INF
        cs[j] = _comp(x, v) if v < n_voc else U0
        m = max(m, x)
    m = _bmax_f32(red, m)
    s = float32(0.0)
    for j in range(LP_PER):
        v = base + j * nt + tid
        if v < n_voc:
            s += float32(math.exp(logits[b, v] - m))
    s = _bsum(red, s)
    if tid == 0:
        part[b, 2 * blk] = m
        part[b, 2 * blk + 1] = s
    for r in range(n_top):
        mine = U0
        for j in range(LP_PER):
            mine = max(mine, cs[j])
        top = _round_max(sbest, mine)
        for j in range(LP_PER):
            if cs[j] == top:
                cs[j] = U0
        if tid == 0:
            cand[b, blk * MAX_TOP + r] = top


@kernel((f32_2, int32, i32_1, int32, int32, f32_2, u64_2, f32_2, i32_2))
def logprob_final_kernel(logits, n_voc, tokens, n_top, n_blocks, part, cand, out, ids):
    """grid B, block LP_THREADS: out [B, 1 + n_top] (the token's logprob, then the top ones'),
    ids [B, n_top] (most likely first; x descending, id ascending)."""
    red = cuda.shared.array(LP_THREADS, float32)
    sbest = cuda.shared.array(1, uint64)
    sc = cuda.shared.array(CAND, uint64)
    b = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    m = NEG_INF
    for i in range(tid, n_blocks, nt):
        m = max(m, part[b, 2 * i])
    m = _bmax_f32(red, m)
    s = float32(0.0)
    for i in range(tid, n_blocks, nt):
        s += part[b, 2 * i + 1] * float32(math.exp(part[b, 2 * i] - m))
    lse = m + float32(math.log(_bsum(red, s)))
    n_c = n_blocks * n_top
    for i in range(tid, n_c, nt):
        sc[i] = cand[b, (i // n_top) * MAX_TOP + i % n_top]
    if tid == 0:
        t = tokens[b]
        out[b, 0] = logits[b, t] - lse if t >= 0 and t < n_voc else NEG_INF
    cuda.syncthreads()
    for r in range(n_top):
        mine = U0
        for i in range(tid, n_c, nt):
            mine = max(mine, sc[i])
        top = _round_max(sbest, mine)
        for i in range(tid, n_c, nt):
            if sc[i] == top:
                sc[i] = U0
        if tid == 0:
            ids[b, r] = _comp_id(top)
            out[b, 1 + r] = _comp_z(top) - lse


# --- NumPy reference -----------------------------------------------------------------------

def token_logprobs_ref(logits: np.ndarray, vocab: int, tokens: np.ndarray, n_top: int) -> tuple[np.ndarray, np.ndarray]:
    """(out [B, 1 + n_top] float64, ids [B, n_top]) as the kernels compute them (float64 here)."""
    x = np.asarray(logits, dtype=np.float32)[:, :vocab].astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    lse = (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))[:, 0]
    out = np.empty((x.shape[0], 1 + n_top))
    ids = np.empty((x.shape[0], n_top), np.int64)
    for b in range(x.shape[0]):
        order = np.lexsort((np.arange(vocab), -x[b]))[:n_top]
        ids[b] = order
        out[b, 0] = x[b, tokens[b]] - lse[b]
        out[b, 1:] = x[b, order] - lse[b]
    return out, ids
