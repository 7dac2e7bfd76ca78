"""The Gated DeltaNet mixer between its two projections, for decode-sized T, in one kernel:
causal conv1d + SiLU over [T, q | k | v], the gated delta rule (gates from the raw a, b), and
the gated RMS norm by z. Three launches and their gaps become one (ops.cpu.gdn_decode is the
reference; CudaOps.gdn_decode picks this kernel on cc >= 9.0).

`gdn_decode_kernel`: one 512-thread block per value head h, launched as thread-block clusters
of the Hv / Hk value heads that share key head h // (Hv / Hk).
* Threads 0 .. 2 Dk + Dv - 1 each own one conv channel of the head: q and k of its key head,
  v of its own rows. The q / k channels are computed by every block of the cluster (a few
  multiply-adds); only the cluster's first block writes their conv state back, after a cluster
  barrier that every block reaches once it has read the old state.
* Warp w owns state rows 8 w .. 8 w + 7 (Dv <= 128); lane j holds columns j, j + 32, .. of each
  (Dk <= 128, Dk % 32 == 0); warp-shuffle reductions, as gdn.gdr_recurrent_kernel.
* self_sync: the state rows, the conv state and the constant weights are read before the
  grid-dependency wait. The state and conv state were last written by this kernel one decode
  step earlier, and every kernel's entry waits before it lets its dependents start, so any
  launch two or more back is complete when a block starts (the down projection of moe.py relies
  on the same). The 64 KB per head thus load while the input projection still runs.
Knows nothing of the model's layout beyond the GDN's [q | k | v] channel order.
"""
from __future__ import annotations

import math

from numba import cuda, float32

from ninfer_nb.kernels.nbtypes import f32, f32_1, f32_2, f32_3, i32
from ninfer_nb.kernels.ptx import as_f32, cluster_arrive, cluster_wait, grid_dependency_sync, ldg_stream_v4_u32
from ninfer_nb.kernels.registry import kernel
from ninfer_nb.kernels.warp import warp_sum

WARPS = 16
THREADS = 32 * WARPS
ROWS = 8                        # state rows (v index) per warp: Dv <= WARPS * ROWS
KPL = 4                         # state columns (k index) per lane: Dk <= 32 * KPL
MAX_DK = 32 * KPL
MAX_DV = WARPS * ROWS
CONV_K = 4                      # the conv width this kernel takes (the Qwen3.5 family's)
MAX_CH = 2 * MAX_DK + MAX_DV    # conv channels per head: q, k of the key head, v


def supported(d_k: int, d_v: int, conv_k: int, ratio: int) -> bool:
    """Head shapes the kernel takes (else CudaOps composes conv, rule and norm); ratio = Hv / Hk
    is the cluster size (at most 8, the portable limit)."""
    return d_k % 32 == 0 and 0 < d_k <= MAX_DK and 0 < d_v <= MAX_DV and conv_k == CONV_K and 1 <= ratio <= 8


@kernel((f32_2, f32_2, f32_2, f32_2, f32_2, f32_2, f32_1, f32_1, f32_3, f32_1, f32_2, i32, f32),
        sim=False, launch_bounds=(THREADS, 2), self_sync=True)
def gdn_decode_kernel(mixed, z, a, b, conv_state, conv_w, a_log, dt_bias, state, norm_w, out, n_k_heads, eps):
    """mixed [T, 2 Hk Dk + Hv Dv] (q | k | v before the conv); z [T, Hv Dv]; a, b [T, Hv] (raw
    gate projections); conv_state [3, C] (oldest first), conv_w [C, 4]; a_log, dt_bias [Hv];
    state [Hv, Dv, Dk] fp32, updated in place; norm_w [Dv]; out [T, Hv Dv]. grid (Hv,), block
    THREADS, clusters of Hv / n_k_heads blocks."""
    s = cuda.local.array((ROWS, KPL), float32)
    kn = cuda.local.array(KPL, float32)
    qn = cuda.local.array(KPL, float32)
    qkv = cuda.shared.array(MAX_CH, float32)      # this token's conv outputs: q | k | v of the head
    o_row = cuda.shared.array(MAX_DV, float32)    # this token's rule output, before the norm
    h = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    lane = tid & 31
    warp = tid >> 5
    n_v_heads = a.shape[1]
    d_v = state.shape[1]
    d_k = state.shape[2]
    kpl = d_k // 32
    ratio = n_v_heads // n_k_heads
    hk = h // ratio
    qk_width = n_k_heads * d_k
    n_ch = 2 * d_k + d_v
    # this thread's conv channel in [q | k | v] (-1: none)
    c = -1
    if tid < d_k:
        c = hk * d_k + tid
    elif tid < 2 * d_k:
        c = qk_width + hk * d_k + (tid - d_k)
    elif tid < n_ch:
        c = 2 * qk_width + h * d_v + (tid - 2 * d_k)
    writes_conv_state = c >= 0 and (tid >= 2 * d_k or h % ratio == 0)

    # --- before the wait: constants, and state last written by this kernel a step ago -------
    w0 = w1 = w2 = w3 = float32(0.0)
    win0 = win1 = win2 = float32(0.0)
    if c >= 0:
        u0, u1, u2, u3 = ldg_stream_v4_u32(conv_w, c * CONV_K)
        w0, w1, w2, w3 = as_f32(u0), as_f32(u1), as_f32(u2), as_f32(u3)
        win0 = conv_state[0, c]
        win1 = conv_state[1, c]
        win2 = conv_state[2, c]
    r0 = warp * ROWS
    for r in range(ROWS):
        for e in range(KPL):
            s[r, e] = float32(0.0)
            if e < kpl and r0 + r < d_v:
                s[r, e] = state[h, r0 + r, lane + 32 * e]
    decay_scale = -math.exp(a_log[h])
    bias = dt_bias[h]
    nw = norm_w[tid] if tid < d_v else float32(0.0)
    q_scale = float32(1.0) / math.sqrt(float32(d_k))
    cluster_arrive()                              # release: this block's conv-state reads are done
    grid_dependency_sync()

    for t in range(mixed.shape[0]):
        if c >= 0:                                # conv + SiLU of this thread's channel
            x = mixed[t, c]
            y = win0 * w0 + win1 * w1 + win2 * w2 + x * w3
            win0, win1, win2 = win1, win2, x
            qkv[tid] = y / (float32(1.0) + math.exp(-y))
        cuda.syncthreads()
        sk = float32(0.0)                         # every warp l2-normalises q and k itself
        sq = float32(0.0)
        for e in range(KPL):
            kv_ = float32(0.0)
            qv_ = float32(0.0)
            if e < kpl:
                qv_ = qkv[lane + 32 * e]
                kv_ = qkv[d_k + lane + 32 * e]
            kn[e] = kv_
            qn[e] = qv_
            sk += kv_ * kv_
            sq += qv_ * qv_
        inv_k = float32(1.0) / math.sqrt(warp_sum(sk) + float32(1e-6))
        inv_q = q_scale / math.sqrt(warp_sum(sq) + float32(1e-6))
        for e in range(KPL):
            kn[e] = kn[e] * inv_k
            qn[e] = qn[e] * inv_q
        xg = a[t, h] + bias                       # the gates (gdn.gdn_gates_kernel)
        sp = xg if xg > float32(20.0) else math.log1p(math.exp(min(xg, float32(20.0))))
        decay = math.exp(decay_scale * sp)
        beta = float32(1.0) / (float32(1.0) + math.exp(-b[t, h]))
        for r in range(ROWS):
            row = r0 + r
            kvm = float32(0.0)
            for e in range(KPL):
                s[r, e] = s[r, e] * decay
                kvm += s[r, e] * kn[e]
            kvm = warp_sum(kvm)
            vv = qkv[2 * d_k + row] if row < d_v else float32(0.0)
            delta = (vv - kvm) * beta
            o = float32(0.0)
            for e in range(KPL):
                s[r, e] = s[r, e] + delta * kn[e]
                o += s[r, e] * qn[e]
            o = warp_sum(o)
            if lane == 0 and row < d_v:
                o_row[row] = o
        cuda.syncthreads()
        ss = float32(0.0)                         # gated RMS norm over the head's Dv outputs
        for e in range(MAX_DV // 32):             # (every warp sums them: no divergent shuffle)
            i = lane + 32 * e
            if i < d_v:
                ss += o_row[i] * o_row[i]
        inv = float32(1.0) / math.sqrt(warp_sum(ss) / float32(d_v) + eps)
        if tid < d_v:
            zz = z[t, h * d_v + tid]
            out[t, h * d_v + tid] = ((o_row[tid] * inv) * nw) * (zz / (float32(1.0) + math.exp(-zz)))
        cuda.syncthreads()                        # qkv and o_row are rewritten by the next token

    for r in range(ROWS):
        for e in range(KPL):
            if e < kpl and r0 + r < d_v:
                state[h, r0 + r, lane + 32 * e] = s[r, e]
    cluster_wait()                                # every block of the cluster has read the old conv state
    if writes_conv_state:
        conv_state[0, c] = win0
        conv_state[1, c] = win1
        conv_state[2, c] = win2
