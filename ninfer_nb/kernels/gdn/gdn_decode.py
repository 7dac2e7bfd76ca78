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

from numba import config, cuda, float32

from ninfer_nb.kernels.common.nbtypes import f32, f32_1, f32_2, f32_3, f32_4, i32, i32_1
from ninfer_nb.kernels.common.ptx import (
    as_f32,
    cluster_arrive_relaxed,
    cluster_sync,
    cluster_wait,
    grid_dependency_sync,
    ldg_stream_v4_u32,
    lds_v4_f32,
    shfl_xor,
    smem_u32,
    st_cluster_f32,
    st_v4_f32,
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


# --- a value head of a sequence per block, or per cluster of S = 2 / 4 blocks -----------------
HEAD_THREADS = 512              # block size for Dv = 128 (4 S threads per state row, Dv / S rows)
HEAD_MAX_THREADS = 512
HEAD_MAX_DV = 128
HEAD_MAX_N4 = 4                 # float4s of a state row per thread: Dk / (16 S) <= 4 (Dk = 128: S >= 2)
HEAD_COLS = 4 * HEAD_MAX_N4     # state columns a thread holds
HEAD_MAX_DK = 128
HEAD_MAX_CH = 2 * HEAD_MAX_DK + HEAD_MAX_DV   # q | k | v conv channels of a block
HEAD_GROUPS = HEAD_MAX_DV // 32  # the norm's 32-row groups of a head
HEAD_ALIGN = None if config.ENABLE_CUDASIM else 16   # float4 reads of the conv outputs
HEAD_SPLITS = (1, 2, 4)


def head_threads(d_k: int, d_v: int, split: int = 1) -> int:
    """Block size of gdn_decode_head_slots_kernel: 4 S threads per row, >= one per conv channel."""
    return 32 * -(-max(4 * d_v, 2 * d_k + d_v // split) // 32)


def head_supported(n_v_heads: int, n_k_heads: int, d_k: int, d_v: int, conv_k: int, split: int = 1) -> bool:
    """Shapes the head kernel takes with S = split blocks per head: Dk a power of two in 16..128
    with 1..4 float4s of a row per thread (Dk / (16 S)), Dv <= 128 (S > 1: a multiple of 32 S)."""
    return (split in HEAD_SPLITS and d_k in (16, 32, 64, 128) and 1 <= d_k // (16 * split) <= HEAD_MAX_N4
            and 0 < d_v <= HEAD_MAX_DV and (split == 1 or d_v % (32 * split) == 0) and conv_k == CONV_K
            and n_k_heads > 0 and n_v_heads % n_k_heads == 0 and head_threads(d_k, d_v, split) <= HEAD_MAX_THREADS)


@cuda.jit(device=True, inline=True)
def _row_part(s, qkv, koff, base_col, tpr, j, n4):
    """(s . k, s . q) over the float4 j of this thread's row piece (0 past n4)."""
    pk = float32(0.0)
    pq = float32(0.0)
    if j < n4:
        col = base_col + 4 * tpr * j
        q0, q1, q2, q3 = lds_v4_f32(qkv, col)
        k0, k1, k2, k3 = lds_v4_f32(qkv, koff + col)
        pk = s[4 * j] * k0 + s[4 * j + 1] * k1 + s[4 * j + 2] * k2 + s[4 * j + 3] * k3
        pq = s[4 * j] * q0 + s[4 * j + 1] * q1 + s[4 * j + 2] * q2 + s[4 * j + 3] * q3
    return pk, pq


@cuda.jit(device=True, inline=True)
def _decode_head(mixed, z, a, b, conv_pool, conv_w, a_log, dt_bias, state_pool, slots, snaps, norm_w, out,
                 arrivals, n_k_heads, n_split, eps):
    """gdn_decode_head_slots_kernel: the contract of gdn_decode_slots_kernel (one sequence: a
    pool of one slot, slots [1] = 0), grid (Hv * S, B) for S = n_split, block
    head_threads(Dk, Dv, S), clusters of S blocks when S > 1, plus arrivals [B * Hk] int32 (0
    between launches) and snaps [>= 1] int32: where snaps[t] >= 0 (t < its length, t the
    token's row in mixed) the state and conv state after token t are also written to slot
    snaps[t] (a speculative verify's per-position states).
    The S blocks of a (sequence, value head) hold Dv / S state rows each, 4 S threads per row
    with Dk / (4 S) columns as float4s (16-byte loads and stores). Every sum is taken in one
    order whatever S is (float4 partials folded by the highest index bit first, in registers
    then across the row's lanes; the norm over 32-row groups in order): S never changes a bit
    of the result. The q / k / v conv of the block's channels
    runs one channel per thread; the key head's q / k conv state, read by (Hv / Hk) S blocks,
    is written by the last of them to arrive (an atomic count per (sequence, key head), reset
    by that block). State and conv state load before the grid-dependency wait, as in
    gdn_decode_kernel."""
    s = cuda.local.array(HEAD_COLS, float32)
    win = cuda.local.array(CONV_K, float32)
    qkv = cuda.shared.array(HEAD_MAX_CH, float32, alignment=HEAD_ALIGN)    # this token's conv outputs
    o_rows = cuda.shared.array(HEAD_MAX_DV, float32)              # this token's rule outputs, before the norm
    partial = cuda.shared.array((2, HEAD_GROUPS), float32)        # the head's group sums of squares, by parity
    last = cuda.shared.array(1, i32)                              # this block writes q / k conv state
    tid = cuda.threadIdx.x
    lane = tid & 31
    warp = tid >> 5
    tpr = 4 * n_split                                             # threads per state row
    row_l = tid // tpr                                            # this thread's row in the block
    q_l = tid - row_l * tpr                                       # its place in the row
    sl = cuda.blockIdx.x % n_split                                # the block's slice (cluster rank)
    h = cuda.blockIdx.x // n_split
    n_v_heads = a.shape[1]
    ratio = n_v_heads // n_k_heads
    hk = h // ratio
    t0, n_tok, slot = _pool_tokens(mixed, slots)
    conv_state = conv_pool[slot]                                  # [3, C]
    state = state_pool[slot]                                      # [Hv, Dv, Dk]
    d_v = state.shape[1]
    d_k = state.shape[2]
    n4 = d_k // (16 * n_split)                                    # float4s per thread
    rows = d_v // n_split if n_split > 1 else d_v                 # state rows of the block
    row = sl * rows + row_l
    on_row = row_l < rows
    qk_width = n_k_heads * d_k
    n_ch = 2 * d_k + rows
    n_groups = (d_v + 31) // 32

    # --- before the wait: constants, and state this kernel wrote a step ago -------------------
    c = -1                                                        # this thread's conv channel: q, k, v rows
    if tid < d_k:
        c = hk * d_k + tid
    elif tid < 2 * d_k:
        c = qk_width + hk * d_k + (tid - d_k)
    elif tid < n_ch:
        c = 2 * qk_width + h * d_v + sl * rows + (tid - 2 * d_k)
    for e in range(CONV_K):
        win[e] = float32(0.0)
    if c >= 0:
        for e in range(CONV_K - 1):
            win[e] = conv_state[e, c]
    base = (h * d_v + row) * d_k + 4 * q_l                        # flat index of the thread's first column
    for j in range(HEAD_MAX_N4):
        for e in range(4):
            s[4 * j + e] = float32(0.0)
        if j < n4 and on_row:
            u0, u1, u2, u3 = ldg_stream_v4_u32(state, base + 4 * tpr * j)
            s[4 * j], s[4 * j + 1], s[4 * j + 2], s[4 * j + 3] = as_f32(u0), as_f32(u1), as_f32(u2), as_f32(u3)
    decay_scale = -math.exp(a_log[h])
    bias = dt_bias[h]
    nw = norm_w[row] if on_row else float32(0.0)
    q_scale = float32(1.0) / math.sqrt(float32(d_k))
    arrived = 0
    if n_split > 1:
        cluster_arrive_relaxed()
    grid_dependency_sync()

    for t in range(t0, t0 + n_tok):
        xg = a[t, h] + bias
        xb = b[t, h]
        zz = z[t, h * d_v + row] if on_row else float32(0.0)
        into = snaps[t] if t < snaps.shape[0] else -1             # loads in flight with the conv's
        if c >= 0:                                                # conv + SiLU of this thread's channel
            u0, u1, u2, u3 = ldg_stream_v4_u32(conv_w, c * CONV_K)   # with x: one latency
            win[CONV_K - 1] = mixed[t, c]
            y = win[0] * as_f32(u0) + win[1] * as_f32(u1) + win[2] * as_f32(u2) + win[3] * as_f32(u3)
            for e in range(CONV_K - 1):
                win[e] = win[e + 1]
            qkv[tid] = y / (float32(1.0) + math.exp(-y))
        cuda.syncthreads()
        if t == t0 and tid == 0:                                  # every conv_state read of this block is done;
            arrived = cuda.atomic.add(arrivals, cuda.blockIdx.y * n_k_heads + hk, 1)   # read after the tokens
        kk = float32(0.0)                                         # |k|^2, |q|^2, k . q: lane l sums elements
        qq = float32(0.0)                                         # l, l + 32, .. in order, then the warp
        kq = float32(0.0)
        for e in range(HEAD_MAX_DK // 32):
            if lane + 32 * e < d_k:
                qe = qkv[lane + 32 * e]
                ke = qkv[d_k + lane + 32 * e]
                kk += ke * ke
                qq += qe * qe
                kq += ke * qe
        col0 = 4 * q_l                                            # s . k, s . q: float4 j of the row is
        a0k, a0q = _row_part(s, qkv, d_k, col0, tpr, 0, n4)       # index q_l + tpr j; fold j, j + 2, then
        a2k, a2q = _row_part(s, qkv, d_k, col0, tpr, 2, n4)       # j + 1 (zeros past n4)
        a1k, a1q = _row_part(s, qkv, d_k, col0, tpr, 1, n4)
        a3k, a3q = _row_part(s, qkv, d_k, col0, tpr, 3, n4)
        a0k += a2k
        a0q += a2q
        a1k += a3k
        a1q += a3q
        sk = a0k + a1k
        sq = a0q + a1q
        kk, qq, kq = _warp_sum3(kk, qq, kq)
        m = 8                                                     # then across the row's lanes, highest first
        while m >= 1:
            if m < tpr:
                sk += shfl_xor(sk, m)
                sq += shfl_xor(sq, m)
            m >>= 1
        inv_k = float32(1.0) / math.sqrt(kk + float32(1e-6))
        inv_q = q_scale / math.sqrt(qq + float32(1e-6))
        sp = xg if xg > float32(20.0) else math.log1p(math.exp(min(xg, float32(20.0))))
        decay = math.exp(decay_scale * sp)
        beta = float32(1.0) / (float32(1.0) + math.exp(-xb))
        vr = qkv[2 * d_k + row_l] if on_row else float32(0.0)
        d = (vr - decay * sk * inv_k) * beta                      # (v_r - (decay s_r) . k^) beta
        o = decay * sq * inv_q + d * (kq * inv_k * inv_q)
        dn = d * inv_k
        for j in range(HEAD_MAX_N4):                              # s_r = decay s_r + d k^
            if j < n4:
                k0, k1, k2, k3 = lds_v4_f32(qkv, d_k + col0 + 4 * tpr * j)
                s[4 * j] = s[4 * j] * decay + dn * k0
                s[4 * j + 1] = s[4 * j + 1] * decay + dn * k1
                s[4 * j + 2] = s[4 * j + 2] * decay + dn * k2
                s[4 * j + 3] = s[4 * j + 3] * decay + dn * k3
        if on_row and q_l == 0:
            o_rows[row_l] = o
        if into >= 0:                                             # the state after token t also into slot snaps[t]
            if on_row:
                for j in range(HEAD_MAX_N4):
                    if j < n4:
                        st_v4_f32(state_pool[into], base + 4 * tpr * j, s[4 * j], s[4 * j + 1], s[4 * j + 2],
                                  s[4 * j + 3])
            if c >= 0:                                            # q / k: every block of the key head, same values
                for e in range(CONV_K - 1):
                    conv_pool[into, e, c] = win[e]
        cuda.syncthreads()                                        # o_rows complete; qkv free for the next token
        if t == t0 and n_split > 1:
            cluster_wait()                                        # every block of the cluster has started
        g_local = warp
        if 32 * g_local < rows:                                   # a warp per 32-row group of the block
            r = 32 * g_local + lane
            ov = o_rows[r] if r < rows else float32(0.0)
            ss = warp_sum(ov * ov)
            g = (sl * rows) // 32 + g_local
            if n_split == 1:
                if lane == 0:
                    partial[t & 1, g] = ss
            elif lane < n_split:
                st_cluster_f32(smem_u32(partial) + 4 * ((t & 1) * HEAD_GROUPS + g), lane, ss)
        if n_split > 1:
            cluster_sync()                                        # every group's sum is here
        else:
            cuda.syncthreads()
        if on_row and q_l == 0:                                   # gated RMS norm over the head's Dv outputs
            tot = float32(0.0)
            for g in range(HEAD_GROUPS):
                if g < n_groups:
                    tot += partial[t & 1, g]
            inv = float32(1.0) / math.sqrt(tot / float32(d_v) + eps)
            out[t, h * d_v + row] = ((o * inv) * nw) * (zz / (float32(1.0) + math.exp(-zz)))

    if on_row:
        for j in range(HEAD_MAX_N4):
            if j < n4:
                st_v4_f32(state, base + 4 * tpr * j, s[4 * j], s[4 * j + 1], s[4 * j + 2], s[4 * j + 3])
    if tid == 0:
        last[0] = i32(arrived == ratio * n_split - 1)
    cuda.syncthreads()
    if c >= 0 and (tid >= 2 * d_k or last[0] != 0):              # v rows by their block, q / k by the last
        for e in range(CONV_K - 1):
            conv_state[e, c] = win[e]
    if tid == 0 and last[0] != 0:
        arrivals[cuda.blockIdx.y * n_k_heads + hk] = 0


@cuda.jit(device=True, inline=True)
def _warp_sum3(a, b, c):
    """warp_sum of three values, interleaved."""
    for m in (16, 8, 4, 2, 1):
        a += shfl_xor(a, m)
        b += shfl_xor(b, m)
        c += shfl_xor(c, m)
    return a, b, c


@kernel((f32_2, f32_2, f32_2, f32_2, f32_3, f32_2, f32_1, f32_1, f32_4, i32_1, i32_1, f32_1, f32_2, i32_1, i32, i32,
         f32), launch_bounds=(HEAD_MAX_THREADS, 2), self_sync=True)
def gdn_decode_head_slots_kernel(mixed, z, a, b, conv_state, conv_w, a_log, dt_bias, state, slots, snaps, norm_w,
                                 out, arrivals, n_k_heads, n_split, eps):
    _decode_head(mixed, z, a, b, conv_state, conv_w, a_log, dt_bias, state, slots, snaps, norm_w, out, arrivals,
                 n_k_heads, n_split, eps)


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
