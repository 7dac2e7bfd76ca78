"""Mixture of experts: softmax top-k router and routed SwiGLU experts (bf16 expert weights).

* `moe_route_kernel`: one block per token; top-k by rank counting in shared memory, in two
  stages (within 32-expert tiles, then among the tiles' candidates; ties -> lower expert id),
  softmax weights over the chosen k (renormalised) or over all E. Simulator-safe.
  The decode router's RMSNorm, GEMV and the same selection in one launch, which also writes
  the normed row that the expert kernels read: `moe_router_cluster_kernel` (cc >= 9.0, E <=
  256: the router blocks are one thread-block cluster, the logits meet in block 0's shared
  memory by st.async on its mbarrier) or `moe_router_fused_kernel` (an arrival counter; the
  last block routes).
* `moe_gate_up_kernel`: h[t*k + s, j] = silu(gate_up[e, j] . x[t]) * (gate_up[e, I + j] . x[t]),
  one warp per (slot, j). `moe_down_kernel`: out[t, n] = sum_s w[t, s] * down[e_s, n] . h[t*k+s],
  one warp per (t, n), slots summed in order (deterministic, no atomics). Both stream weights
  with 16-byte loads when `vec` (H % 8 == 0 and I % 8 == 0), else scalar loads.
* Decode (T <= CudaOps' MOE_UNROLLED_MAX_T, H % 1024 == 0, I % 256 == 0): the same contracts
  with more 16-byte loads in flight (the plain kernels keep one or two per lane).
  `moe_gate_up_wide_kernel` (H % 2048 == 0) issues all 16 loads of a 2048-wide gate + up row
  pair before any math, `moe_gate_up_unrolled_kernel` 8 (4 chunks of both rows);
  `moe_down_wide_kernel` flattens (slot, chunk) items, issues 9 at a time, scales each lane's
  partial by its slot weight and reduces once (local arrays that ptxas keeps in registers:
  128, no spills).
Decode-oriented (each routed pair streams its expert's weights): CudaOps.moe_experts uses them for
one token (and for 2 .. GROUPED_MIN_T - 1 tokens whose shapes moe_rows.py does not take; it groups
them by expert); longer prefill chunks take the grouped-by-expert path (moe_grouped.py).
"""
from __future__ import annotations

import math

from numba import config, cuda, float32, int32, int64, uint32

from ninfer_nb.kernels.common.bf16 import widen
from ninfer_nb.kernels.common.nbtypes import (
    f32,
    f32_1,
    f32_2,
    i32,
    i32_1,
    i32_2,
    u16_2,
    u16_3,
)
from ninfer_nb.kernels.common.ptx import (
    cluster_arrive_relaxed,
    cluster_wait,
    fence_acq_rel_gpu,
    fence_mbarrier_init,
    grid_dependency_sync,
    ldg_stream_v4_u32,
    ldg_v4_f32,
    lds_v4_f32,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_try_wait,
    shfl_xor,
    smem_u32,
    st_async_cluster_f32,
    st_v4_f32,
)
from ninfer_nb.kernels.common.registry import kernel
from ninfer_nb.kernels.linear.linear import (
    _dot8,
    normed_pair_dots,
    pass_loads,
    warp_sum,
)

ROUTE_BLOCK = 256     # power of two
ROUTE_MAX_E = 1024    # experts per router row
MAX_TOPK = 32
ROUTE_MAX_CAND = ROUTE_MAX_E // 32 * MAX_TOPK    # top-k candidates: k per 32-expert tile
ROUTE_CAND_ROW = ROUTE_MAX_CAND + 4               # + padding to whole 16-byte loads
# 16-byte shared loads from the logits and candidate rows (the simulator takes no alignment)
ROW_ALIGN = None if config.ENABLE_CUDASIM else 16
ROUTE_CLUSTER_MAX = 16    # blocks in moe_router_cluster_kernel's cluster (Hopper's non-portable limit)
MOE_WARPS = 8


@kernel((f32_2, i32, i32, i32, i32_2, f32_2))
def moe_route_kernel(logits, top_k, renorm, shared, ids, weights):
    """grid T, block ROUTE_BLOCK. logits [T, E + shared] (E <= ROUTE_MAX_E) -> ids [T, k + shared]
    int32, weights [T, k + shared]. shared = 1: the last logit column is the shared expert's
    gate; slot k gets id E and weight sigmoid(gate). The selection is `_route_row`."""
    row = cuda.shared.array(ROUTE_MAX_E, float32, alignment=ROW_ALIGN)
    t = cuda.blockIdx.x
    n_exp = logits.shape[1] - shared
    for e in range(cuda.threadIdx.x, n_exp, cuda.blockDim.x):
        row[e] = logits[t, e]
    gate = logits[t, n_exp] if shared != 0 else float32(0.0)
    _route_row(row, n_exp, gate, top_k, renorm, shared, ids, weights, t)


@cuda.jit(device=True, inline=True)
def _beaten4(u, v, d):
    """How many of the 4 values u (of indices j, j + 1, j + 2, j + 3) beat v of index i, for
    d = i - j: larger, or equal with a lower index. Branch-free, float32 counts."""
    return (float32((u[0] > v) | ((u[0] == v) & (0 < d))) + float32((u[1] > v) | ((u[1] == v) & (1 < d)))
            + float32((u[2] > v) | ((u[2] == v) & (2 < d))) + float32((u[3] > v) | ((u[3] == v) & (3 < d))))


@cuda.jit(device=True)
def _route_row(row, n_exp, gate, top_k, renorm, shared, ids, weights, t):
    """Top-k of the logits row [E] staged in shared memory (row has ROUTE_MAX_E entries,
    16-byte aligned; the staging stores are made visible by the first barrier here), softmax
    weights, the shared slot from its gate logit; the whole block (a power of two <=
    ROUTE_BLOCK threads) takes part. Ties rank the lower expert id first.

    Two stages of rank counting (no k rounds of arg-max): (1) each warp ranks the 32 experts
    of a tile among themselves and the tile's top k go to the candidate list at slot
    tile * k + rank; (2) every candidate is ranked among the n_tiles * k candidates (4 lanes
    per candidate, each a quarter of the list, partial counts summed by shuffles), and rank
    r < k puts it in slot r. Every expert beaten by fewer than k others is in its tile's top
    k, and so is everything that beats it: a candidate's rank among the candidates is its
    rank among all E. Equal logits keep id order in the slot order (within a tile by rank,
    across tiles by tile), so stage 2 breaks ties by slot. The tile's padding (experts >= E)
    is -inf with ids after every real one: it ranks after them and fills the slots of a tile
    with fewer than k experts, so every candidate slot is written.
    The compares read 4 values per 16-byte broadcast load and count in float32 without
    branches (`_beaten4`), so a lane's loads are all in flight at once."""
    top_p = cuda.shared.array(MAX_TOPK, float32)
    red = cuda.shared.array(ROUTE_BLOCK, float32)
    cand_v = cuda.shared.array(ROUTE_CAND_ROW, float32, alignment=ROW_ALIGN)
    cand_e = cuda.shared.array(ROUTE_MAX_CAND, int32)
    tid = cuda.threadIdx.x
    nthr = cuda.blockDim.x
    lane = tid & 31
    n_tiles = (n_exp + 31) >> 5
    e = n_exp + tid
    while e < n_tiles * 32:
        row[e] = float32(-math.inf)
        e += nthr
    if tid < top_k:                              # NaN logits rank unpredictably: keep ids valid
        ids[t, tid] = 0
        top_p[tid] = float32(0.0)
    cuda.syncthreads()
    tile = tid >> 5
    while tile < n_tiles:
        base = tile * 32
        v = row[base + lane]
        rank = float32(0.0)
        for q in range(8):
            rank += _beaten4(lds_v4_f32(row, base + 4 * q), v, lane - 4 * q)
        if rank < float32(top_k):
            slot = tile * top_k + int32(rank)
            cand_v[slot] = v
            cand_e[slot] = base + lane
        tile += nthr >> 5
    n_cand = n_tiles * top_k
    if tid < 4:                                  # pad to whole 16-byte loads: -inf never beats
        cand_v[n_cand + tid] = float32(-math.inf)
    cuda.syncthreads()
    per = ((n_cand + 3) // 4 + 3) // 4 * 4       # candidates per lane: a multiple of 4
    q0 = (tid & 3) * per
    g0 = 0
    while g0 < n_cand:                           # block-uniform: every lane shuffles below
        i = g0 + (tid >> 2)
        v = cand_v[i] if i < n_cand else float32(-math.inf)
        rank = float32(0.0)
        j = q0
        while j < min(q0 + per, n_cand):
            rank += _beaten4(lds_v4_f32(cand_v, j), v, i - j)
            j += 4
        rank += shfl_xor(rank, 1)
        rank += shfl_xor(rank, 2)
        if (tid & 3) == 0 and i < n_cand and rank < float32(top_k):
            e = cand_e[i]
            if 0 <= e < n_exp:
                r = int32(rank)
                ids[t, r] = e
                top_p[r] = v
        g0 += nthr >> 2
    cuda.syncthreads()
    mx = top_p[0]
    total = float32(0.0)
    if renorm != 0:                              # weights over the chosen k only (every warp)
        total = warp_sum(math.exp(top_p[lane] - mx) if lane < top_k else float32(0.0))
    else:                                        # full softmax denominator
        acc = float32(0.0)
        for e in range(tid, n_exp, nthr):
            acc += math.exp(row[e] - mx)
        red[tid] = acc
        cuda.syncthreads()
        st = nthr // 2
        while st > 0:
            if tid < st:
                red[tid] += red[tid + st]
            cuda.syncthreads()
            st //= 2
        total = red[0]
    if tid < top_k:
        weights[t, tid] = math.exp(top_p[tid] - mx) / total
    if shared != 0 and tid == 0:
        ids[t, top_k] = n_exp
        weights[t, top_k] = float32(1.0) / (float32(1.0) + math.exp(-gate))


@cuda.jit(device=True, inline=True)
def _store_normed_row(x, nw, inv, xn, lane, k_dim):
    """One warp: xn[0] = x[0] * inv * nw (the normed row the expert kernels read), 16 bytes per
    lane per step."""
    for i in range(lane * 4, k_dim, 128):
        xa = ldg_v4_f32(x, i)
        na = ldg_v4_f32(nw, i)
        st_v4_f32(xn, i, xa[0] * inv * na[0], xa[1] * inv * na[1], xa[2] * inv * na[2], xa[3] * inv * na[3])


@kernel((f32_2, f32_1, f32, u16_2, f32_2, f32_1, i32_1, i32, i32, i32, i32_2, f32_2, u16_3, f32_2),
        sim=False, fastmath=True, launch_bounds=(ROUTE_BLOCK, 2), self_sync=True)
def moe_router_fused_kernel(x, nw, eps, w, xn, logits, counter, top_k, renorm, shared, ids, weights,
                            gate_up, h):
    """Decode router in one launch, its RMSNorm fused in: logits = w [E + shared, H] @
    rms_norm(x[0], nw, eps) (bf16 weights, one token, H % 8 == 0, 16-byte aligned; the norm as
    in linear.gemv_one_token "normed"), then the top-k of `_route_row`, in the block that
    finishes last. grid ceil((E + shared) / 16), block ROUTE_BLOCK (8 warps, 2 rows each).
    Warp 0 of block 0 also writes the normed row xn [1, H] for the expert kernels that follow
    (which then need no norm of their own: the wide gate_up kernel keeps its registers).
    Each block writes its rows' logits, fences, and bumps `counter` [1] (device memory, 0
    between launches); the router block that arrives last routes over all logits and sets the
    counter back to 0, so a captured graph replays it. Replaces the norm + router GEMV +
    moe_route triple.

    Launched with ceil(I / 8) more blocks after the router's ceil((E + 1) / 16) (shared = 1),
    they compute the shared expert's SwiGLU row h[k] [I] (expert E of gate_up [E + 1, 2I, H], one
    warp per (gate, up) row pair of the normed x), on SMs the router leaves idle while its
    chain of fence, arrival and routing runs; the gate_up kernel then covers the k routed
    slots only (the 35B's 512 blocks fit in two waves of 264 where 576 took a third)."""
    row = cuda.shared.array(ROUTE_MAX_E, float32, alignment=ROW_ALIGN)
    last = cuda.shared.array(1, int32)
    lane = cuda.threadIdx.x & 31
    warp = cuda.threadIdx.x >> 5
    tid = cuda.threadIdx.x
    n_rows = w.shape[0]
    k_dim = w.shape[1]
    rows_per_block = ROUTE_BLOCK // 32 * 2
    router_blocks = (n_rows + rows_per_block - 1) // rows_per_block
    if cuda.blockIdx.x >= router_blocks:         # the shared expert's gate_up rows
        inter = h.shape[1]
        j = (cuda.blockIdx.x - router_blocks) * (ROUTE_BLOCK // 32) + warp
        if j < inter:
            rg = ((n_rows - 1) * 2 * inter + j) * k_dim          # expert E = n_rows - 1
            g, u, _ = normed_pair_dots(x, nw, eps, gate_up, rg, rg + inter * k_dim, lane, k_dim)
            if lane == 0:
                h[top_k, j] = g / (float32(1.0) + math.exp(-g)) * u
        return
    n0 = (cuda.blockIdx.x * (ROUTE_BLOCK // 32) + warp) * 2
    if n0 < n_rows:
        has1 = n0 + 1 < n_rows
        n1 = n0 + 1 if has1 else n0
        a0, a1, inv = normed_pair_dots(x, nw, eps, w, n0 * k_dim, n1 * k_dim, lane, k_dim)
        if lane == 0:
            logits[n0] = a0
            if has1:
                logits[n1] = a1
        if cuda.blockIdx.x == 0 and warp == 0:
            _store_normed_row(x, nw, inv, xn, lane, k_dim)
    grid_dependency_sync()                       # (the GEMV's warps have: self_sync) all threads
    fence_acq_rel_gpu()                          # this block's logits (and xn) before its arrival
    cuda.syncthreads()
    if tid == 0:
        last[0] = 1 if cuda.atomic.add(counter, 0, 1) == router_blocks - 1 else 0
    cuda.syncthreads()
    if last[0] == 0:
        return
    fence_acq_rel_gpu()                          # every block's logits after the last arrival
    n_exp = n_rows - shared
    for e in range(tid, n_exp, cuda.blockDim.x):
        row[e] = logits[e]
    gate = logits[n_exp] if shared != 0 else float32(0.0)
    if tid == 0:
        counter[0] = 0
    _route_row(row, n_exp, gate, top_k, renorm, shared, ids, weights, 0)


@kernel((f32_2, f32_1, f32, u16_2, f32_2, i32, i32, i32, i32, i32_2, f32_2, u16_3, f32_2),
        sim=False, fastmath=True, launch_bounds=(ROUTE_BLOCK, 2), self_sync=True)
def moe_router_cluster_kernel(x, nw, eps, w, xn, top_k, renorm, shared, n_h, ids, weights, gate_up, h):
    """moe_router_fused_kernel's contract (cc >= 9.0, E <= ROUTE_CLUSTER_MAX * 16 routed experts)
    with the logits gathered through distributed shared memory instead of global memory, a
    fence and an arrival counter: the first C = ceil(E / 16) blocks are one thread-block
    cluster (launched with cluster size C; the grid a multiple of C); each warp stores its two
    logits straight into block 0's shared row (mapa + st.shared::cluster), one cluster barrier
    (release / acquire), block 0 routes: no fence, atomic and reload of the logits.

    The blocks after the cluster do the shared expert's work items: j < n_h: the SwiGLU row
    h[k, j] (expert E of gate_up [E + 1, 2 n_h, H], as the fused kernel's extra blocks);
    j == n_h (shared = 1): the shared expert's gate logit (router row E), which sets the
    shared slot: ids[0, k] = E, weights[0, k] = sigmoid(logit). n_h = 0: no h rows (gate_up and
    h are placeholders).

    The logits travel by st.async into block 0's row, each completing 4 transaction bytes on
    block 0's mbarrier, which block 0 alone waits for; the other blocks exit after their
    stores. So there is no cluster barrier at the end and no release fence (ptx.py's mbarrier
    notes)."""
    row = cuda.shared.array(ROUTE_MAX_E, float32, alignment=ROW_ALIGN)
    mbar = cuda.shared.array(1, int64)
    lane = cuda.threadIdx.x & 31
    warp = cuda.threadIdx.x >> 5
    n_rows = w.shape[0]
    k_dim = w.shape[1]
    n_exp = n_rows - shared
    warps = ROUTE_BLOCK // 32
    router_blocks = (n_exp + 2 * warps - 1) // (2 * warps)
    b = cuda.blockIdx.x
    if b >= router_blocks:                       # the shared expert's h rows and gate
        j = (b - router_blocks) * warps + warp
        if j < n_h:
            rg = (n_exp * 2 * n_h + j) * k_dim
            g, u, _ = normed_pair_dots(x, nw, eps, gate_up, rg, rg + n_h * k_dim, lane, k_dim)
            if lane == 0:
                h[top_k, j] = g / (float32(1.0) + math.exp(-g)) * u
        elif j == n_h and shared != 0:
            r = n_exp * k_dim
            a, _, _ = normed_pair_dots(x, nw, eps, w, r, r, lane, k_dim)
            if lane == 0:
                ids[0, top_k] = n_exp
                weights[0, top_k] = float32(1.0) / (float32(1.0) + math.exp(-a))
        return
    bar = smem_u32(mbar)
    if b == 0 and cuda.threadIdx.x == 0:
        mbarrier_init(bar, 1)                    # block 0's thread 0 arrives once (with the bytes)
        fence_mbarrier_init()                    # visible to the cluster before the arrive below
    cluster_arrive_relaxed()
    n0 = (b * warps + warp) * 2
    a0 = float32(0.0)
    a1 = float32(0.0)
    inv = float32(0.0)
    if n0 < n_exp:
        n1 = n0 + 1 if n0 + 1 < n_exp else n0
        a0, a1, inv = normed_pair_dots(x, nw, eps, w, n0 * k_dim, n1 * k_dim, lane, k_dim)
    else:
        grid_dependency_sync()
    cluster_wait()                               # every block of the cluster has started
    if lane == 0 and n0 < n_exp:
        base = smem_u32(row)
        st_async_cluster_f32(base + 4 * n0, 0, a0, bar)
        if n0 + 1 < n_exp:
            st_async_cluster_f32(base + 4 * (n0 + 1), 0, a1, bar)
    if b == 0 and warp == 0:
        _store_normed_row(x, nw, inv, xn, lane, k_dim)
    if b != 0:
        return
    if cuda.threadIdx.x == 0:
        mbarrier_arrive_expect_tx(bar, 4 * n_exp)
    while mbarrier_try_wait(bar, 0) == 0:        # every logit is in block 0's row
        pass
    _route_row(row, n_exp, float32(0.0), top_k, renorm, 0, ids, weights, 0)


@cuda.jit(device=True, inline=True)
def _gate_up_rows(ids, ts, j, inter, hid):
    """Flat offsets (gate row, up row, x row) for pair ts = t * k + s and column j: expert
    ids[t, s]'s rows j and I + j of gate_up [E, 2I, H], and token t's row of x [T, H]."""
    top_k = ids.shape[1]
    t = ts // top_k
    rg = (ids[t, ts - t * top_k] * 2 * inter + j) * hid
    return rg, rg + inter * hid, t * hid


@kernel((f32_2, i32_2, u16_3, f32_2, i32), sim=False, fastmath=True, launch_bounds=(256, 2))
def moe_gate_up_kernel(x, ids, gate_up, h, vec):
    """grid (ceil(I / 8), T * k), block 256. x [T, H]; gate_up [E, 2I, H]; h [T*k, I]."""
    lane = cuda.threadIdx.x & 31
    warp = cuda.threadIdx.x >> 5
    inter = h.shape[1]
    hid = x.shape[1]
    ts = cuda.blockIdx.y
    top_k = ids.shape[1]
    t = ts // top_k
    j = cuda.blockIdx.x * MOE_WARPS + warp
    if j >= inter:
        return
    e = ids[t, ts - t * top_k]
    rg = (e * 2 * inter + j) * hid
    ru = rg + inter * hid
    xr = t * hid
    ag = float32(0.0)
    au = float32(0.0)
    if vec != 0:
        for kk in range(lane * 8, hid, 256):
            wg = ldg_stream_v4_u32(gate_up, rg + kk)
            wu = ldg_stream_v4_u32(gate_up, ru + kk)
            xa = ldg_v4_f32(x, xr + kk)
            xb = ldg_v4_f32(x, xr + kk + 4)
            ag += _dot8(wg, xa, xb)
            au += _dot8(wu, xa, xb)
    else:
        for kk in range(lane, hid, 32):
            xv = x[t, kk]
            ag += widen(gate_up[e, j, kk]) * xv
            au += widen(gate_up[e, inter + j, kk]) * xv
    ag = warp_sum(ag)
    au = warp_sum(au)
    if lane == 0:
        h[ts, j] = (ag / (float32(1.0) + math.exp(-ag))) * au


@kernel((f32_2, i32_2, f32_2, u16_3, f32_2, i32), sim=False, fastmath=True, launch_bounds=(256, 2))
def moe_down_kernel(h, ids, weights, down, out, vec):
    """grid (ceil(H / 8), T), block 256. h [T*k, I]; down [E, H, I]; out [T, H]."""
    lane = cuda.threadIdx.x & 31
    warp = cuda.threadIdx.x >> 5
    hid = out.shape[1]
    inter = h.shape[1]
    t = cuda.blockIdx.y
    n = cuda.blockIdx.x * MOE_WARPS + warp
    if n >= hid:
        return
    top_k = ids.shape[1]
    total = float32(0.0)
    for s in range(top_k):
        e = ids[t, s]
        ts = t * top_k + s
        rw = (e * hid + n) * inter
        hr = ts * inter
        a = float32(0.0)
        if vec != 0:
            for kk in range(lane * 8, inter, 256):
                wv = ldg_stream_v4_u32(down, rw + kk)
                xa = ldg_v4_f32(h, hr + kk)
                xb = ldg_v4_f32(h, hr + kk + 4)
                a += _dot8(wv, xa, xb)
        else:
            for kk in range(lane, inter, 32):
                a += widen(down[e, n, kk]) * h[ts, kk]
        a = warp_sum(a)
        total += weights[t, s] * a
    if lane == 0:
        out[t, n] = total


MOE_UNROLL = 4          # chunks of 256 columns (8 bf16 per lane) per pass in the unrolled kernels


@kernel((f32_2, i32_2, u16_3, f32_2), sim=False, fastmath=True, launch_bounds=(256, 2))
def moe_gate_up_unrolled_kernel(x, ids, gate_up, h):
    """moe_gate_up_kernel's contract, vectorised path only, H % (256 MOE_UNROLL) == 0."""
    lane = cuda.threadIdx.x & 31
    warp = cuda.threadIdx.x >> 5
    inter = h.shape[1]
    hid = x.shape[1]
    ts = cuda.blockIdx.y
    j = cuda.blockIdx.x * MOE_WARPS + warp
    if j >= inter:
        return
    rg, ru, xr = _gate_up_rows(ids, ts, j, inter, hid)
    ag = float32(0.0)
    au = float32(0.0)
    for kk in range(lane * 8, hid, 256 * MOE_UNROLL):
        g0, u0, g1, u1, g2, u2, g3, u3 = pass_loads(gate_up, rg, ru, kk)
        xa = ldg_v4_f32(x, xr + kk)
        xb = ldg_v4_f32(x, xr + kk + 4)
        ag += _dot8(g0, xa, xb)
        au += _dot8(u0, xa, xb)
        xa = ldg_v4_f32(x, xr + kk + 256)
        xb = ldg_v4_f32(x, xr + kk + 260)
        ag += _dot8(g1, xa, xb)
        au += _dot8(u1, xa, xb)
        xa = ldg_v4_f32(x, xr + kk + 512)
        xb = ldg_v4_f32(x, xr + kk + 516)
        ag += _dot8(g2, xa, xb)
        au += _dot8(u2, xa, xb)
        xa = ldg_v4_f32(x, xr + kk + 768)
        xb = ldg_v4_f32(x, xr + kk + 772)
        ag += _dot8(g3, xa, xb)
        au += _dot8(u3, xa, xb)
    ag = warp_sum(ag)
    au = warp_sum(au)
    if lane == 0:
        h[ts, j] = (ag / (float32(1.0) + math.exp(-ag))) * au


MOE_WIDE_GU = 8    # 256-column chunks of both rows per pass in moe_gate_up_wide: 16 loads in flight
MOE_WIDE_DN = 9    # (slot, chunk) items per pass in moe_down_wide: 9 loads in flight


@kernel((f32_2, i32_2, u16_3, f32_2), sim=False, fastmath=True, launch_bounds=(256, 2))
def moe_gate_up_wide_kernel(x, ids, gate_up, h):
    """moe_gate_up_kernel's contract, H % (256 MOE_WIDE_GU) == 0: each lane issues the loads
    of MOE_WIDE_GU chunks of both rows (16 x 16 bytes; all of a 2048-wide row pair) before any
    math, so a warp's row pair costs one memory round trip instead of two."""
    lane = cuda.threadIdx.x & 31
    warp = cuda.threadIdx.x >> 5
    inter = h.shape[1]
    hid = x.shape[1]
    ts = cuda.blockIdx.y
    j = cuda.blockIdx.x * MOE_WARPS + warp
    if j >= inter:
        return
    rg, ru, xr = _gate_up_rows(ids, ts, j, inter, hid)
    g = cuda.local.array((MOE_WIDE_GU, 4), uint32)      # [chunk, word] gate row words
    u = cuda.local.array((MOE_WIDE_GU, 4), uint32)      # [chunk, word] up row words
    ag = float32(0.0)
    au = float32(0.0)
    for kk in range(lane * 8, hid, 256 * MOE_WIDE_GU):
        for c in range(MOE_WIDE_GU):
            g[c, 0], g[c, 1], g[c, 2], g[c, 3] = ldg_stream_v4_u32(gate_up, rg + kk + 256 * c)
            u[c, 0], u[c, 1], u[c, 2], u[c, 3] = ldg_stream_v4_u32(gate_up, ru + kk + 256 * c)
        for c in range(MOE_WIDE_GU):
            xa = ldg_v4_f32(x, xr + kk + 256 * c)
            xb = ldg_v4_f32(x, xr + kk + 256 * c + 4)
            ag += _dot8((g[c, 0], g[c, 1], g[c, 2], g[c, 3]), xa, xb)
            au += _dot8((u[c, 0], u[c, 1], u[c, 2], u[c, 3]), xa, xb)
    ag = warp_sum(ag)
    au = warp_sum(au)
    if lane == 0:
        h[ts, j] = (ag / (float32(1.0) + math.exp(-ag))) * au


@kernel((f32_2, i32_2, f32_2, u16_3, f32_2, i32), sim=False, fastmath=True, launch_bounds=(256, 2),
        self_sync=True)
def moe_down_wide_kernel(h, ids, weights, down, out, accumulate):
    """moe_down_kernel's contract, vectorised path only, I % 256 == 0, MOE_WIDE_DN (slot, chunk)
    items per pass: the 35B decode's 9 slots x 2 chunks of a 512-wide row take two memory round
    trips per warp (five with 4 items per pass). Items past the end repeat the last one and
    count 0; the sum over slots is folded into each lane's partial: one warp reduction.
    accumulate = 1: out += the result (out is the residual stream; the decoder's residual add).
    self_sync: the first pass's ids, slot weights and expert weights are read before
    grid_dependency_sync(), only h after it. ids and weights come from the router, two launches
    back: the gate_up kernel between waits for the router before it lets this kernel start
    (its entry runs wait, then launch_dependents), so they are complete when this one starts."""
    lane = cuda.threadIdx.x & 31
    warp = cuda.threadIdx.x >> 5
    hid = out.shape[1]
    inter = h.shape[1]
    t = cuda.blockIdx.y
    n = cuda.blockIdx.x * MOE_WARPS + warp
    if n >= hid:
        return
    nch = inter // 256
    n_slots = ids.shape[1]
    n_items = n_slots * nch
    wv = cuda.local.array((MOE_WIDE_DN, 4), uint32)     # [item, word] weight words
    hoff = cuda.local.array(MOE_WIDE_DN, int32)         # [item] flat index into h
    coef = cuda.local.array(MOE_WIDE_DN, float32)       # [item] slot weight (0 past the end)
    total = float32(0.0)
    s = 0                                               # slot and chunk of the next item
    ch = 0
    for i in range(0, n_items, MOE_WIDE_DN):
        for c in range(MOE_WIDE_DN):
            live = i + c < n_items                      # past the end: the last item, weight 0
            sl = s if live else n_slots - 1
            kk = (ch if live else nch - 1) * 256 + lane * 8
            wv[c, 0], wv[c, 1], wv[c, 2], wv[c, 3] = ldg_stream_v4_u32(down, (ids[t, sl] * hid + n) * inter + kk)
            hoff[c] = (t * n_slots + sl) * inter + kk
            coef[c] = weights[t, sl] if live else float32(0.0)
            ch += 1
            if ch == nch:
                ch = 0
                s += 1
        grid_dependency_sync()                      # h is the gate_up kernel's output
        for c in range(MOE_WIDE_DN):
            ho = hoff[c]
            total += coef[c] * _dot8((wv[c, 0], wv[c, 1], wv[c, 2], wv[c, 3]), ldg_v4_f32(h, ho), ldg_v4_f32(h, ho + 4))
    grid_dependency_sync()                          # (no items: still waits before the store)
    total = warp_sum(total)
    if lane == 0:
        out[t, n] = total + (out[t, n] if accumulate != 0 else float32(0.0))
