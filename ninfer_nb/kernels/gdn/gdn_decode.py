"""The Gated DeltaNet mixer between its two projections, for decode-sized T, in one kernel:
causal conv1d + SiLU over [T, q | k | v], the gated delta rule (gates from the raw a, b), and
the gated RMS norm by z. Three launches and their gaps become one (ops.cpu.gdn_decode is the
reference; CudaOps.gdn_decode picks this kernel on cc >= 9.0).

`gdn_decode_kernel`: each value head's Dv state rows are split into S = ceil(Dv / 32) slices
of one 256-thread block (8 warps x 4 rows; lane j holds columns j, j + 32, .. of each row, Dk <=
128, warp-shuffle reductions, as gdn.gdr_recurrent_kernel). The blocks of the Hv / Hk value heads
that share a key head form one thread-block cluster of C = (Hv / Hk) * S blocks (8 for the 35B,
12 for the 27B: Hopper allows 16 as a non-portable size).
* Conv: every block computes the conv of its key head's q and k channels (a few multiply-adds
  each) and of its own rows' v channels. Only the cluster's first block writes the q / k conv
  state back, after the cluster barrier that every block reaches having read the old state.
* Gated norm: each block's sum of squares of its rows' outputs goes into the shared memory of
  its head's S blocks (st.shared::cluster); after one cluster barrier per token every block
  has the head's total.
* self_sync: the state rows, the conv state and the constant weights are read before the
  grid-dependency wait. The state and conv state were last written by this kernel one decode
  step earlier, and every kernel's entry waits before it lets its dependents start, so any
  launch two or more back is complete when a block starts (moe.py's down projection relies on
  the same). The state thus loads while the input projection still runs.
* The latency chain after the wait is short reductions: q / k norms (two warp sums) and a
  warp's 4 state rows (two warp sums each), now reduced together (`warp_sum2`, `warp_sum4`:
  15 dependent shuffles instead of 50 in SASS).
Knows nothing of the model's layout beyond the GDN's [q | k | v] channel order.
"""
from __future__ import annotations

import math
from typing import Any

from numba import cuda, float32

from ninfer_nb.kernels.common.nbtypes import f32, f32_1, f32_2, f32_3, f32_4, i32, i32_1
from ninfer_nb.kernels.common.ptx import (
    as_f32,
    cluster_arrive_relaxed,
    cluster_sync,
    cluster_wait,
    grid_dependency_sync,
    ldg_stream_v4_u32,
    smem_u32,
    st_cluster_f32,
)
from ninfer_nb.kernels.common.registry import KernelSpec, kernel
from ninfer_nb.kernels.common.warp import warp_sum, warp_sum2, warp_sum4

WARPS = 8
THREADS = 32 * WARPS
ROWS = 4                        # state rows (v index) per warp (delta_rule_rows4: exactly 4)
SLICE = WARPS * ROWS            # state rows per block
KPL = 4                         # state columns (k index) per lane: Dk <= 32 * KPL
MAX_DK = 32 * KPL
MAX_SLICES = 8                  # Dv <= MAX_SLICES * SLICE
CONV_K = 4                      # the conv width this kernel takes (the Qwen3.5 family's)
MAX_CH = 2 * MAX_DK + SLICE     # conv channels per block: q, k of the key head, its rows' v
CH_PER_THREAD = (MAX_CH + THREADS - 1) // THREADS
MAX_CLUSTER = 16                # Hopper's non-portable cluster size limit


def slices(d_v: int) -> int:
    return (d_v + SLICE - 1) // SLICE


def cluster_size(n_v_heads: int, n_k_heads: int, d_v: int) -> int:
    return n_v_heads // n_k_heads * slices(d_v)


def supported(n_v_heads: int, n_k_heads: int, d_k: int, d_v: int, conv_k: int) -> bool:
    """Head shapes the kernel takes (else CudaOps composes conv, rule and norm)."""
    return (d_k % 32 == 0 and 0 < d_k <= MAX_DK and 0 < d_v <= MAX_SLICES * SLICE and conv_k == CONV_K
            and n_k_heads > 0 and n_v_heads % n_k_heads == 0
            and cluster_size(n_v_heads, n_k_heads, d_v) <= MAX_CLUSTER)


@cuda.jit(device=True, inline=True)
def delta_rule_rows4(s, kn, qn, decay, v0, v1, v2, v3, beta):
    """gdn.delta_rule_row for a warp's 4 state rows s[0..3, :] at once (same arithmetic per
    row), so their reductions run as 4 interleaved shuffle chains instead of 8 in a row:
    s_r *= decay; s_r += (v_r - s_r . k) beta k; returns the 4 rows' s_r . q."""
    k0 = float32(0.0)
    k1 = float32(0.0)
    k2 = float32(0.0)
    k3 = float32(0.0)
    for e in range(KPL):
        s[0, e] = s[0, e] * decay
        s[1, e] = s[1, e] * decay
        s[2, e] = s[2, e] * decay
        s[3, e] = s[3, e] * decay
        k0 += s[0, e] * kn[e]
        k1 += s[1, e] * kn[e]
        k2 += s[2, e] * kn[e]
        k3 += s[3, e] * kn[e]
    k0, k1, k2, k3 = warp_sum4(k0, k1, k2, k3)
    d0 = (v0 - k0) * beta
    d1 = (v1 - k1) * beta
    d2 = (v2 - k2) * beta
    d3 = (v3 - k3) * beta
    o0 = float32(0.0)
    o1 = float32(0.0)
    o2 = float32(0.0)
    o3 = float32(0.0)
    for e in range(KPL):
        s[0, e] = s[0, e] + d0 * kn[e]
        s[1, e] = s[1, e] + d1 * kn[e]
        s[2, e] = s[2, e] + d2 * kn[e]
        s[3, e] = s[3, e] + d3 * kn[e]
        o0 += s[0, e] * qn[e]
        o1 += s[1, e] * qn[e]
        o2 += s[2, e] * qn[e]
        o3 += s[3, e] * qn[e]
    return warp_sum4(o0, o1, o2, o3)


@cuda.jit(device=True, inline=True)
def _flat_tokens(mixed, slots):
    """(first token, tokens, slot) of the block's sequence: all of them, no slot."""
    return 0, mixed.shape[0], 0


@cuda.jit(device=True, inline=True)
def _pool_tokens(mixed, slots):
    """(first token, tokens, slot) of sequence blockIdx.y: T / B tokens on slots[blockIdx.y]."""
    n = mixed.shape[0] // cuda.gridDim.y
    return cuda.blockIdx.y * n, n, slots[cuda.blockIdx.y]


@cuda.jit(device=True, inline=True)
def _flat_view(pool, slot):
    """The one sequence's array itself."""
    return pool


@cuda.jit(device=True, inline=True)
def _pool_view(pool, slot):
    """Slot `slot` of a pool [S_, ...]: a view of one sequence's array."""
    return pool[slot]


def _make_gdn_decode(slotted: bool) -> KernelSpec:
    """gdn_decode_kernel (one sequence: conv_state [3, C], state [Hv, Dv, Dk]; grid (Hv * S,))
    or gdn_decode_slots_kernel (slot pools conv_state [S_, 3, C], state [S_, Hv, Dv, Dk], slots
    [B] int32 after them; grid (Hv * S, B): blocks (., b) run sequence b's T / B tokens on slot
    slots[b]). The slot is read before the grid-dependency wait: slots, like the state, are not
    written by the kernels of a step (the host fills them before it)."""
    tokens_of = _pool_tokens if slotted else _flat_tokens
    view = _pool_view if slotted else _flat_view

    @cuda.jit(device=True, inline=True)
    def decode(mixed, z, a, b, conv_pool, conv_w, a_log, dt_bias, state_pool, slots, norm_w, out, n_k_heads, eps):
        """mixed [T, 2 Hk Dk + Hv Dv] (q | k | v before the conv); z [T, Hv Dv]; a, b [T, Hv] (raw
        gate projections); conv_state [3, C] (oldest first; slotted: [S_, 3, C]), conv_w [C, 4];
        a_log, dt_bias [Hv]; state [Hv, Dv, Dk] fp32 (slotted: [S_, Hv, Dv, Dk]), updated in
        place; norm_w [Dv]; out [T, Hv Dv]. grid (Hv * S, B), block THREADS, clusters of
        (Hv / n_k_heads) * S blocks."""
        s = cuda.local.array((ROWS, KPL), float32)
        kn = cuda.local.array(KPL, float32)
        qn = cuda.local.array(KPL, float32)
        win = cuda.local.array((CH_PER_THREAD, CONV_K), float32)     # the last 3 inputs, then the current
        cw = cuda.local.array((CH_PER_THREAD, CONV_K), float32)
        chan = cuda.local.array(CH_PER_THREAD, i32)
        qkv = cuda.shared.array(MAX_CH, float32)          # this token's conv outputs: q | k | v rows
        o_rows = cuda.shared.array(SLICE, float32)        # this token's rule outputs, before the norm
        partial = cuda.shared.array((2, MAX_SLICES), float32)  # the head's blocks' sums of squares, by parity
        tid = cuda.threadIdx.x
        lane = tid & 31
        warp = tid >> 5
        n_v_heads = a.shape[1]
        t0, n_tok, slot = tokens_of(mixed, slots)         # slotted: sequence blockIdx.y's, on its slot
        conv_state = view(conv_pool, slot)                # [3, C]
        state = view(state_pool, slot)                    # [Hv, Dv, Dk]
        d_v = state.shape[1]
        d_k = state.shape[2]
        kpl = d_k // 32
        n_slices = (d_v + SLICE - 1) // SLICE
        ratio = n_v_heads // n_k_heads
        c_size = ratio * n_slices
        rank = cuda.blockIdx.x % c_size
        hk = cuda.blockIdx.x // c_size
        h = hk * ratio + rank // n_slices
        sl = rank - (rank // n_slices) * n_slices
        row0 = sl * SLICE                                 # this block's first state row
        n_rows = min(SLICE, d_v - row0)
        qk_width = n_k_heads * d_k
        n_ch = 2 * d_k + n_rows

        # --- before the wait: constants, and state last written by this kernel a step ago -------
        for j in range(CH_PER_THREAD):
            i = tid + j * THREADS                         # this block's channel i: q, k, then v rows
            c = -1
            if i < d_k:
                c = hk * d_k + i
            elif i < 2 * d_k:
                c = qk_width + hk * d_k + (i - d_k)
            elif i < n_ch:
                c = 2 * qk_width + h * d_v + row0 + (i - 2 * d_k)
            chan[j] = c
            for e in range(CONV_K):
                win[j, e] = float32(0.0)
                cw[j, e] = float32(0.0)
            if c >= 0:
                u0, u1, u2, u3 = ldg_stream_v4_u32(conv_w, c * CONV_K)
                cw[j, 0], cw[j, 1], cw[j, 2], cw[j, 3] = as_f32(u0), as_f32(u1), as_f32(u2), as_f32(u3)
                for e in range(CONV_K - 1):
                    win[j, e] = conv_state[e, c]
        r0 = row0 + warp * ROWS
        for r in range(ROWS):
            for e in range(KPL):
                s[r, e] = float32(0.0)
                if e < kpl and r0 + r < d_v:
                    s[r, e] = state[h, r0 + r, lane + 32 * e]
        decay_scale = -math.exp(a_log[h])
        bias = dt_bias[h]
        nw = norm_w[row0 + tid] if tid < n_rows else float32(0.0)
        q_scale = float32(1.0) / math.sqrt(float32(d_k))
        cluster_arrive_relaxed()
        grid_dependency_sync()

        for t in range(t0, t0 + n_tok):
            xg = a[t, h] + bias                           # the gates' inputs and z: loads in flight
            xb = b[t, h]
            zz = z[t, h * d_v + row0 + tid] if tid < n_rows else float32(0.0)
            for j in range(CH_PER_THREAD):                # conv + SiLU of this thread's channels
                if chan[j] >= 0:
                    win[j, CONV_K - 1] = mixed[t, chan[j]]
                    y = float32(0.0)
                    for e in range(CONV_K):
                        y += win[j, e] * cw[j, e]
                    for e in range(CONV_K - 1):
                        win[j, e] = win[j, e + 1]
                    qkv[tid + j * THREADS] = y / (float32(1.0) + math.exp(-y))
            cuda.syncthreads()
            sk = float32(0.0)                             # every warp l2-normalises q and k itself
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
            sk, sq = warp_sum2(sk, sq)
            inv_k = float32(1.0) / math.sqrt(sk + float32(1e-6))
            inv_q = q_scale / math.sqrt(sq + float32(1e-6))
            for e in range(KPL):
                kn[e] = kn[e] * inv_k
                qn[e] = qn[e] * inv_q
            sp = xg if xg > float32(20.0) else math.log1p(math.exp(min(xg, float32(20.0))))
            decay = math.exp(decay_scale * sp)            # the gates (gdn.gdn_gates_kernel)
            beta = float32(1.0) / (float32(1.0) + math.exp(-xb))
            vi = 2 * d_k + r0 - row0                      # this warp's rows' v in qkv
            v0 = qkv[vi] if r0 < d_v else float32(0.0)
            v1 = qkv[vi + 1] if r0 + 1 < d_v else float32(0.0)
            v2 = qkv[vi + 2] if r0 + 2 < d_v else float32(0.0)
            v3 = qkv[vi + 3] if r0 + 3 < d_v else float32(0.0)
            o0, o1, o2, o3 = delta_rule_rows4(s, kn, qn, decay, v0, v1, v2, v3, beta)
            if lane == 0:                                 # rows past Dv count 0 in the head's norm
                o_rows[warp * ROWS] = o0 if r0 < d_v else float32(0.0)
                o_rows[warp * ROWS + 1] = o1 if r0 + 1 < d_v else float32(0.0)
                o_rows[warp * ROWS + 2] = o2 if r0 + 2 < d_v else float32(0.0)
                o_rows[warp * ROWS + 3] = o3 if r0 + 3 < d_v else float32(0.0)
            cuda.syncthreads()
            if t == t0:
                cluster_wait()                            # every block of the cluster has started
            if warp == 0:                                 # this slice's sum of squares to the head's blocks
                ss = float32(0.0)
                for e in range(SLICE // 32):
                    ov = o_rows[lane + 32 * e]
                    ss += ov * ov
                ss = warp_sum(ss)
                if lane < n_slices:
                    st_cluster_f32(smem_u32(partial) + 4 * ((t & 1) * MAX_SLICES + sl),
                                   rank - sl + lane, ss)
            cluster_sync()                                # the head's partial sums are all here
            if tid < n_rows:                              # gated RMS norm over the head's Dv outputs
                tot = float32(0.0)
                for e in range(MAX_SLICES):
                    if e < n_slices:
                        tot += partial[t & 1, e]
                inv = float32(1.0) / math.sqrt(tot / float32(d_v) + eps)
                out[t, h * d_v + row0 + tid] = ((o_rows[tid] * inv) * nw) * (zz / (float32(1.0) + math.exp(-zz)))
            cuda.syncthreads()                            # qkv and o_rows are rewritten by the next token

        for r in range(ROWS):
            for e in range(KPL):
                if e < kpl and r0 + r < d_v:
                    state[h, r0 + r, lane + 32 * e] = s[r, e]
        # conv state: the v rows by their block, q / k by the cluster's first block; every block read
        # the old values before the last cluster_sync
        for j in range(CH_PER_THREAD):
            c = chan[j]
            if c >= 0 and (tid + j * THREADS >= 2 * d_k or rank == 0):
                for e in range(CONV_K - 1):
                    conv_state[e, c] = win[j, e]

    options: dict[str, Any] = {"sim": False, "launch_bounds": (THREADS, 2), "self_sync": True}
    if slotted:
        def gdn_decode_slots_kernel(mixed, z, a, b, conv_state, conv_w, a_log, dt_bias, state, slots, norm_w, out,
                                    n_k_heads, eps):
            decode(mixed, z, a, b, conv_state, conv_w, a_log, dt_bias, state, slots, norm_w, out, n_k_heads, eps)

        return kernel((f32_2, f32_2, f32_2, f32_2, f32_3, f32_2, f32_1, f32_1, f32_4, i32_1, f32_1, f32_2, i32, f32),
                      **options)(gdn_decode_slots_kernel)

    def gdn_decode_kernel(mixed, z, a, b, conv_state, conv_w, a_log, dt_bias, state, norm_w, out, n_k_heads, eps):
        decode(mixed, z, a, b, conv_state, conv_w, a_log, dt_bias, state, a_log, norm_w, out, n_k_heads, eps)

    return kernel((f32_2, f32_2, f32_2, f32_2, f32_2, f32_2, f32_1, f32_1, f32_3, f32_1, f32_2, i32, f32),
                  **options)(gdn_decode_kernel)


gdn_decode_kernel = _make_gdn_decode(False)
gdn_decode_slots_kernel = _make_gdn_decode(True)


@kernel((f32_2, i32_1, f32_2))
def slot_gather_kernel(pool, slots, out):
    """grid-stride, block 256: out[b, :] = pool[slots[b], :] (pools viewed [S_, N])."""
    n = out.shape[1]
    for i in range(cuda.grid(1), out.shape[0] * n, cuda.gridsize(1)):
        b = i // n
        out[b, i - b * n] = pool[slots[b], i - b * n]


@kernel((f32_2, i32_1, f32_2))
def slot_scatter_kernel(src, slots, pool):
    """grid-stride, block 256: pool[slots[b], :] = src[b, :]."""
    n = src.shape[1]
    for i in range(cuda.grid(1), src.shape[0] * n, cuda.gridsize(1)):
        b = i // n
        pool[slots[b], i - b * n] = src[b, i - b * n]


@kernel((f32_1, f32_1))
def copy_f32_kernel(src, dst):
    """grid-stride: dst[:] = src[:] (the slotted fallback's per-sequence outputs into place)."""
    for i in range(cuda.grid(1), src.shape[0], cuda.gridsize(1)):
        dst[i] = src[i]
