"""Mixture of experts: softmax top-k router and routed SwiGLU experts (bf16 expert weights).

* `moe_route_kernel`: one block per token; softmax over E logits, k rounds of block arg-max
  (ties -> lower expert id), optional renormalisation. Simulator-safe.
* `moe_gate_up_kernel`: h[t*k + s, j] = silu(gate_up[e, j] . x[t]) * (gate_up[e, I + j] . x[t]),
  one warp per (slot, j). `moe_down_kernel`: out[t, n] = sum_s w[t, s] * down[e_s, n] . h[t*k+s],
  one warp per (t, n), slots summed in order (deterministic, no atomics). Both stream weights
  with 16-byte loads when `vec` (H % 8 == 0 and I % 8 == 0), else scalar loads.
Decode-oriented: prefill re-reads each expert per token (no grouping by expert yet).
"""
from __future__ import annotations

import math

from numba import cuda, float32, int32

from ninfer_nb.kernels.bf16 import widen
from ninfer_nb.kernels.linear import _dot8, warp_sum
from ninfer_nb.kernels.nbtypes import f32_2, i32, i32_2, u16_3
from ninfer_nb.kernels.ptx import ldg_stream_v4_u32, ldg_v4_f32
from ninfer_nb.kernels.registry import kernel

ROUTE_BLOCK = 256
MAX_TOPK = 32
MOE_WARPS = 8


@kernel((f32_2, i32, i32, i32_2, f32_2))
def moe_route_kernel(logits, top_k, renorm, ids, weights):
    """grid T, block 256 (power of two). logits [T, E] -> ids [T, k] int32, weights [T, k]."""
    red_v = cuda.shared.array(ROUTE_BLOCK, float32)
    red_i = cuda.shared.array(ROUTE_BLOCK, int32)
    chosen = cuda.shared.array(MAX_TOPK, int32)
    chosen_p = cuda.shared.array(MAX_TOPK, float32)
    t = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nthr = cuda.blockDim.x
    n_exp = logits.shape[1]
    # max
    mx = float32(-3.0e38)
    for e in range(tid, n_exp, nthr):
        mx = max(mx, logits[t, e])
    red_v[tid] = mx
    cuda.syncthreads()
    st = nthr // 2
    while st > 0:
        if tid < st:
            red_v[tid] = max(red_v[tid], red_v[tid + st])
        cuda.syncthreads()
        st //= 2
    mx = red_v[0]
    cuda.syncthreads()
    # sum of exp
    sm = float32(0.0)
    for e in range(tid, n_exp, nthr):
        sm += math.exp(logits[t, e] - mx)
    red_v[tid] = sm
    cuda.syncthreads()
    st = nthr // 2
    while st > 0:
        if tid < st:
            red_v[tid] += red_v[tid + st]
        cuda.syncthreads()
        st //= 2
    total = red_v[0]
    cuda.syncthreads()
    # k rounds of arg-max over the not-yet-chosen experts
    for r in range(top_k):
        bv = float32(-1.0)
        bi = int32(n_exp)
        for e in range(tid, n_exp, nthr):
            taken = False
            for c in range(r):
                if chosen[c] == e:
                    taken = True
            if not taken:
                p = math.exp(logits[t, e] - mx) / total
                if p > bv:
                    bv = p
                    bi = e
        red_v[tid] = bv
        red_i[tid] = bi
        cuda.syncthreads()
        st = nthr // 2
        while st > 0:
            if tid < st:
                ov = red_v[tid + st]
                oi = red_i[tid + st]
                if ov > red_v[tid] or (ov == red_v[tid] and oi < red_i[tid]):
                    red_v[tid] = ov
                    red_i[tid] = oi
            cuda.syncthreads()
            st //= 2
        if tid == 0:
            chosen[r] = red_i[0]
            chosen_p[r] = red_v[0]
        cuda.syncthreads()
    if tid == 0:
        ws = float32(0.0)
        for r in range(top_k):
            ws += chosen_p[r]
        for r in range(top_k):
            ids[t, r] = chosen[r]
            weights[t, r] = chosen_p[r] / ws if renorm != 0 else chosen_p[r]


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
        h[ts, j] = (ag / (1.0 + math.exp(-ag))) * au


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
