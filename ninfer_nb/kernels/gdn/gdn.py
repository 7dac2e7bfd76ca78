"""Gated DeltaNet: gates (g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b)) and the
recurrent gated delta rule with an fp32 state [Hv, Dv, Dk], updated in place.

`gdr_recurrent_kernel`: grid (Hv, ceil(Dv / 16)), 4 warps x 4 state rows each; lane j holds
columns j, j+32, ... of its rows (Dk <= 256, Dk % 32 == 0), warp-shuffle reductions. q and k are
l2-normalised in the kernel (q also scaled by 1/sqrt(Dk)); head hv reads q/k head hv // (Hv/Hk).
It loops over the tokens inside one launch, so it also serves the chunked (prefill) contract.
"""
from __future__ import annotations

import math

from numba import cuda, float32

from ninfer_nb.kernels.common.nbtypes import f32_1, f32_2, f32_3, i32
from ninfer_nb.kernels.common.registry import kernel
from ninfer_nb.kernels.common.warp import warp_sum as _warp_sum

GDR_WARPS = 4
GDR_ROWS = 4          # state rows (v index) per warp
GDR_ROWS_PER_BLOCK = GDR_WARPS * GDR_ROWS
MAX_KPL = 8           # Dk / 32 <= 8


@kernel((f32_2, f32_2, f32_1, f32_1, f32_2, f32_2))
def gdn_gates_kernel(a, b, a_log, dt_bias, g_out, beta_out):
    """a, b [T, Hv] -> g, beta [T, Hv]; grid-stride over T * Hv."""
    hv = a.shape[1]
    n = a.shape[0] * hv
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < n:
        t = i // hv
        h = i - t * hv
        x = a[t, h] + dt_bias[h]
        sp = x if x > float32(20.0) else math.log1p(math.exp(min(x, float32(20.0))))
        g_out[t, h] = -math.exp(a_log[h]) * sp
        beta_out[t, h] = float32(1.0) / (float32(1.0) + math.exp(-b[t, h]))
        i += stride


@cuda.jit(device=True, inline=True)
def _gates(a, b, a_log, dt_bias, t, h):
    """(g, beta) of token t, head h from the raw projections a, b [T, Hv] (as gdn_gates_kernel)."""
    x = a[t, h] + dt_bias[h]
    sp = x if x > float32(20.0) else math.log1p(math.exp(min(x, float32(20.0))))
    return -math.exp(a_log[h]) * sp, float32(1.0) / (float32(1.0) + math.exp(-b[t, h]))


@cuda.jit(device=True, inline=True)
def delta_rule_row(s, r, kn, qn, decay, v, beta):
    """One state row's gated delta rule step for one token, the row spread over a warp (lane:
    columns lane, lane + 32, .. in s[r, :] and in the normalised kn, qn): s_r *= decay;
    s_r += (v - s_r . k) beta k; returns s_r . q (every lane gets it)."""
    kvm = float32(0.0)
    for e in range(kn.shape[0]):
        s[r, e] = s[r, e] * decay
        kvm += s[r, e] * kn[e]
    delta = (v - _warp_sum(kvm)) * beta
    o = float32(0.0)
    for e in range(kn.shape[0]):
        s[r, e] = s[r, e] + delta * kn[e]
        o += s[r, e] * qn[e]
    return _warp_sum(o)


@kernel((f32_3, f32_3, f32_3, f32_2, f32_2, f32_1, f32_1, i32, f32_3, f32_3), sim=False, launch_bounds=(128, 4))
def gdr_recurrent_kernel(q, k, v, g, beta, a_log, dt_bias, raw_gates, state, out):
    """q, k [T, Hk, Dk]; v [T, Hv, Dv]; g, beta [T, Hv]; state [Hv, Dv, Dk]; out [T, Hv, Dv].
    raw_gates = 1: g, beta hold the raw projections a, b and the gates are computed here from
    a_log, dt_bias [Hv] (gdn_gates fused in: one launch less per GDN layer and decode step);
    else a_log / dt_bias are unused."""
    s = cuda.local.array((GDR_ROWS, MAX_KPL), float32)
    kn = cuda.local.array(MAX_KPL, float32)
    qn = cuda.local.array(MAX_KPL, float32)
    h = cuda.blockIdx.x
    lane = cuda.threadIdx.x & 31
    warp = cuda.threadIdx.x >> 5
    d_k = k.shape[2]
    d_v = v.shape[2]
    kpl = d_k // 32
    hk = h // (v.shape[1] // k.shape[1])
    r0 = cuda.blockIdx.y * GDR_ROWS_PER_BLOCK + warp * GDR_ROWS
    q_scale = float32(1.0) / math.sqrt(float32(d_k))
    for r in range(GDR_ROWS):
        for e in range(MAX_KPL):
            s[r, e] = float32(0.0)
            if e < kpl and r0 + r < d_v:
                s[r, e] = state[h, r0 + r, lane + 32 * e]
    for t in range(v.shape[0]):
        sk = float32(0.0)
        sq = float32(0.0)
        for e in range(MAX_KPL):
            kv_ = float32(0.0)
            qv_ = float32(0.0)
            if e < kpl:
                kv_ = k[t, hk, lane + 32 * e]
                qv_ = q[t, hk, lane + 32 * e]
            kn[e] = kv_
            qn[e] = qv_
            sk += kv_ * kv_
            sq += qv_ * qv_
        sk = _warp_sum(sk)
        sq = _warp_sum(sq)
        inv_k = float32(1.0) / math.sqrt(sk + float32(1e-6))
        inv_q = float32(1.0) / math.sqrt(sq + float32(1e-6))
        for e in range(MAX_KPL):
            kn[e] = kn[e] * inv_k
            qn[e] = (qn[e] * inv_q) * q_scale
        if raw_gates != 0:
            gt, bt = _gates(g, beta, a_log, dt_bias, t, h)
        else:
            gt = g[t, h]
            bt = beta[t, h]
        decay = math.exp(gt)
        for r in range(GDR_ROWS):
            row = r0 + r
            vv = v[t, h, row] if row < d_v else float32(0.0)
            o = delta_rule_row(s, r, kn, qn, decay, vv, bt)
            if lane == 0 and row < d_v:
                out[t, h, row] = o
    for r in range(GDR_ROWS):
        for e in range(MAX_KPL):
            if e < kpl and r0 + r < d_v:
                state[h, r0 + r, lane + 32 * e] = s[r, e]
