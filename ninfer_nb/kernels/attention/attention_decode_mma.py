"""Decode attention on tensor cores for bf16 KV caches: one block per (split, kv head, token)
serves all G <= 8 q heads of the kv head, so each K / V row is read once, not once per q head.

Contract (as attention.attn_split_kernel, whose attn_combine_kernel merges the splits; one
kernel per head dim D, `SPLIT_MMA_KERNELS[D]`): q
[T, Hq, D] fp32; caches [S, Hkv, D] bf16 bits (uint16), 16-byte aligned rows; positions [T]
int32 (query t sees keys 0..positions[t]); part_o [T, Hq, n_split, D] (unnormalised), part_ml
[T, Hq, n_split, 2] = (max, sum). D % 64 == 0, D <= 256; Hq / Hkv <= 8. Split sp of token t
holds keys [sp L, (sp + 1) L) with L = max(ceil(n_keys / n_split), MIN_SPLIT_KEYS); blocks of
splits past the keys return at once (the combine, given MIN_SPLIT_KEYS, reads only the others).
CudaOps sizes n_split for SPLIT_BLOCKS_PER_SM blocks per SM: few, long splits, because every
block pays a fixed cost (Q's fragments, the warps' merge) and the combine reads every split.

Why: the per-q-head SIMT kernel spends ~170 warp instructions per (q head, key) on loads,
address arithmetic, bf16 unpacking and 5-shuffle dot-product reductions. Here a 16-key tile
costs a warp 32 mma for S and 32 for P V, for all the group's heads at once.

Each warp of the block (DEC_WARPS) takes 16-key tiles j0 = k0 + 16 w, + 64, ... of the split.
A tile's K and V loads (16-byte, streaming; `load_tile`) are all issued together: the first
tile's right after Q's loads (so their round trips overlap), the next one's at the end of the
previous tile. Per tile, lane l = 4 g + t (g = l >> 2, t = l & 3):
* S^T = K Q^T (m16n8k16, M = 16 keys, N = 8 heads, K = D): A = K rows j0 + g and j0 + g + 8,
  B = Q^T, scaled, in registers for the whole kernel. The dot product's order is free, so the
  k slots of k-step ks map to dims d = 32 (ks >> 1) + 8 t + 4 (ks & 1) (+ 0, 1 for slots 2t,
  2t + 1; + 2, 3 for 2t + 8, 2t + 9): one 16-byte load of a K row feeds two k-steps, and the
  4 lanes t of a row read 64 contiguous bytes.
* Online softmax per head (column of S^T): a lane holds keys g, g + 8 of heads 2t, 2t + 1;
  the column max over the 8 lanes g is 3 shuffles per head; row sums stay per lane until the end.
* O^T += V^T P^T (M = 16 dims per m-tile, N = 8 heads, K = 16 keys). P^T's B fragment wants
  head g at 4 keys, the softmax left heads 2t, 2t + 1 at keys g, g + 8 in the lane: each lane
  packs its (key g, key g + 8) pair per head as bf16x2, and 4 indexed shuffles move them; the
  k slots 2t, 2t + 1, 2t + 8, 2t + 9 then hold keys 2t, 2t + 8, 2t + 1, 2t + 9, which V^T's A
  fragment follows. Its rows (dims) of m-tile mt are 64 (mt >> 2) + 8 g + 2 (mt & 3) (+ 1 for
  row g + 8): one 16-byte load of a V row feeds 4 m-tiles, the 8 lanes g read 128 contiguous
  bytes, and a row's bf16 pairs become fragment pairs by taking both words' low or high halves.
* Keys past the split's end load its first row again and get p = 0.
The warps' (max, sum, O) meet in shared memory (32.9 KB for O) and the block writes its split.
Registers (D = 256): O 64, the tile's K 64 and V 64 words; Q's fragments (32 words a lane)
wait in shared memory, in the first 16 KB of the merge's O buffer (each warp its own copy,
written and read by the same lane, so no barrier), which kept ptxas under 255 registers
without spills (in registers: 196 bytes spilled). Simulator-safe (mma, shuffles
and 16-byte loads are emulated by ptx_sim.py).

The default decode attention for bf16 caches (ops/cuda/attention.py _attention_decode). The
16 Q loads are issued together, the kernel is built per head dim (`SPLIT_MMA_KERNELS`: the
k-step / chunk / m-tile guards fold away) and the first tile's K / V loads go out with Q's.
"""
from __future__ import annotations

import math

from numba import cuda, float32, uint32

from ninfer_nb.kernels.attention.attention import MAX_D, NEG
from ninfer_nb.kernels.attention.paging import flat_row, paged_row, seq_of
from ninfer_nb.kernels.common.bf16 import f32_bits
from ninfer_nb.kernels.common.nbtypes import f32, f32_3, f32_4, i32_1, i32_2, u16_3
from ninfer_nb.kernels.common.ptx import (
    as_f32,
    ldg_stream_v4_u32,
    ldg_v4_f32,
    mma_bf16,
    pack_bf16x2,
    shfl_idx,
    shfl_xor,
)
from ninfer_nb.kernels.common.registry import KernelSpec, kernel

DEC_WARPS = 4
DEC_TILE = 16                          # keys per warp and step (the mma's M for S^T, K for P V)
MIN_SPLIT_KEYS = DEC_WARPS * DEC_TILE  # one step of the block
MAX_GROUP = 8                          # q heads per kv head (the mma's N)
BLOCKS_PER_SM = 2                      # launch_bounds minimum (255 registers per thread)
SPLIT_BLOCKS_PER_SM = 1                # CudaOps sizes the split count for this many blocks per SM
# the merge's shared O, one row per (warp, head); pitch MAX_D + 1: a warp's fragment stores
# (lanes 4g + t at dims 8g + ... of heads 2t, 2t + 1) hit 16 banks instead of 4
O_PITCH = MAX_D + 1
O_SLOTS = DEC_WARPS * MAX_GROUP * O_PITCH
HI = uint32(0xFFFF0000)
LO = uint32(0x0000FFFF)


def supported(d_head: int, group: int) -> bool:
    """Shapes the split kernels handle (SPLIT_MMA_KERNELS: bf16 cache rows of whole 16-byte chunks)."""
    return d_head in SPLIT_MMA_KERNELS and 1 <= group <= MAX_GROUP


@cuda.jit(device=True, inline=True)
def _col_max(v):
    """Max over the 8 lanes of a quad column (lanes t, t + 4, ..., t + 28)."""
    v = max(v, shfl_xor(v, 4))
    v = max(v, shfl_xor(v, 8))
    return max(v, shfl_xor(v, 16))


@cuda.jit(device=True, inline=True)
def _col_sum(v):
    v += shfl_xor(v, 4)
    v += shfl_xor(v, 8)
    return v + shfl_xor(v, 16)


@cuda.jit(device=True, inline=True)
def _qslot(w, ks, r, lane):
    """Shared slot of warp w's Q^T B-fragment register r of k-step ks for lane (32 KB buffer)."""
    return ((w * 16 + ks) * 2 + r) * 32 + lane


@cuda.jit(device=True, inline=True)
def _oslot(w, h, d):
    """Shared slot of warp w's O[h, d] for the merge."""
    return (w * MAX_GROUP + h) * O_PITCH + d


@cuda.jit(device=True, inline=True)
def _p_word(we, wo, src, odd):
    """Lane src's bf16x2 P word for head 2 t' (we) or 2 t' + 1 (wo), as this lane's `odd` picks."""
    xe = f32_bits(shfl_idx(as_f32(we), src))
    xo = f32_bits(shfl_idx(as_f32(wo), src))
    return xo if odd else xe


def _make_split_mma(d_head_: int, paged: bool = False) -> KernelSpec:
    """attn_split_mma_d{D}_kernel: the kernel for one head dim D (HEAD_DIMS), so the
    k-step / chunk / m-tile counts are constants and their guards fold away (with D a runtime
    value every mma sat behind a branch and a WARPSYNC). paged: attn_split_mma_paged_d{D}_kernel,
    with page_table [B, P] after positions (token t's keys through its sequence's table row,
    paging.py); the flat kernel's rows are the key positions."""
    D_HEAD = d_head_
    key_row = paged_row if paged else flat_row
    n_ks = D_HEAD >> 4                  # S k-steps (16 dims each)
    n_kc = D_HEAD >> 5                  # 16-byte K chunks per lane and row (2 k-steps each)
    n_vc = D_HEAD >> 6                  # 16-byte V chunks per lane and row (4 m-tiles each)

    @cuda.jit(device=True, inline=True)
    def load_tile(k_cache, v_cache, page_table, b, kw, vw, j0, k0, k1, row, col, g, t4):
        """The 16-byte loads of the tile at j0: K keys j0 + g, + 8 into kw; V keys j0 + 2t, + 8,
        + 1, + 9 into vw (keys past k1 load key k0 again; their p is 0); key j at cache row
        key_row(page_table, b, j)."""
        for r in range(2):
            j = j0 + g + 8 * r
            base = key_row(page_table, b, j if j < k1 else k0) * row + col + 8 * t4
            for c in range(8):
                if c < n_kc:
                    x = ldg_stream_v4_u32(k_cache, base + 32 * c)
                    for i in range(4):
                        kw[r, c, i] = x[i]
        for r in range(4):
            j = j0 + 2 * t4 + (r >> 1) + 8 * (r & 1)
            base = key_row(page_table, b, j if j < k1 else k0) * row + col + 8 * g
            for c in range(4):
                if c < n_vc:
                    x = ldg_stream_v4_u32(v_cache, base + 64 * c)
                    for i in range(4):
                        vw[r, c, i] = x[i]

    @cuda.jit(device=True, inline=True)
    def split_mma(q, k_cache, v_cache, positions, page_table, scale, part_o, part_ml):
        """grid (n_split, Hkv, T), block 32 DEC_WARPS; q.shape[2] == D_HEAD. See the module docstring."""
        sm_m = cuda.shared.array((DEC_WARPS, MAX_GROUP), float32)
        sm_l = cuda.shared.array((DEC_WARPS, MAX_GROUP), float32)
        # the warps' O for the merge [DEC_WARPS, MAX_GROUP, MAX_D]; during the key loop its first
        # 16 KB hold Q^T's B-fragments (bits) per warp, k-step, register and lane
        sm_o = cuda.shared.array(O_SLOTS, float32)
        kw = cuda.local.array((2, 8, 4), uint32)    # K rows g, g + 8: 8 chunks of 4 words
        vw = cuda.local.array((4, 4, 4), uint32)    # V rows 2t, 2t + 8, 2t + 1, 2t + 9: 4 chunks of 4 words
        o = cuda.local.array((16, 4), float32)      # O^T C-fragments per m-tile
        qa = cuda.local.array((8, 8), float32)      # the lane's q values: 8 chunks of 8 dims
        sp = cuda.blockIdx.x
        hk = cuda.blockIdx.y
        t = cuda.blockIdx.z
        tid = cuda.threadIdx.x
        lane = tid & 31
        w = tid >> 5
        g = lane >> 2
        t4 = lane & 3
        n_kv = k_cache.shape[1]
        grp = q.shape[1] // n_kv
        d_head = D_HEAD
        n_keys = positions[t] + 1
        b = seq_of(t, positions.shape[0], page_table.shape[0])
        n_split = part_o.shape[2]
        split_len = max((n_keys + n_split - 1) // n_split, MIN_SPLIT_KEYS)
        k0 = sp * split_len
        k1 = min(k0 + split_len, n_keys)
        if k0 >= k1:                        # past the keys: the combine does not read this split
            return
        # Q^T's B-fragments: every 16-byte load of the lane's q row first (one round trip; a loop
        # of loads and stores waited one per k-step pair), then scale, pack, store
        qrow = (t * q.shape[1] + hk * grp + min(g, grp - 1)) * d_head + 8 * t4
        for c in range(8):
            if c < n_kc:
                x = ldg_v4_f32(q, qrow + 32 * c)
                y = ldg_v4_f32(q, qrow + 32 * c + 4)
                for i in range(4):
                    qa[c, i] = x[i]
                    qa[c, 4 + i] = y[i]
        row = n_kv * d_head                 # cache elements per key
        col = hk * d_head
        j0 = k0 + DEC_TILE * w
        if j0 < k1:                         # the first tile's loads overlap Q's round trip
            load_tile(k_cache, v_cache, page_table, b, kw, vw, j0, k0, k1, row, col, g, t4)
        z = scale if g < grp else float32(0.0)      # the mma's head columns past the group: zero
        for c in range(8):
            if c < n_kc:
                for r in range(4):          # k-step 2c + (r >> 1), register r & 1: dims 4r, 4r + 1
                    sm_o[_qslot(w, 2 * c + (r >> 1), r & 1, lane)] = as_f32(
                        pack_bf16x2(qa[c, 2 * r + 1] * z, qa[c, 2 * r] * z))
        for mt in range(16):
            for e in range(4):
                o[mt, e] = float32(0.0)
        m_e = float32(NEG)                  # running max / sum of heads 2t (e) and 2t + 1 (o)
        m_o = float32(NEG)
        l_e = float32(0.0)
        l_o = float32(0.0)
        while j0 < k1:                      # kw, vw hold tile j0
            # ---- S^T = K Q^T, two accumulators (even / odd k-steps)
            s = (float32(0.0), float32(0.0), float32(0.0), float32(0.0))
            s2 = (float32(0.0), float32(0.0), float32(0.0), float32(0.0))
            for ks in range(16):
                if ks < n_ks:
                    c = ks >> 1
                    i = 2 * (ks & 1)
                    a = (kw[0, c, i], kw[1, c, i], kw[0, c, i + 1], kw[1, c, i + 1])
                    b0 = f32_bits(sm_o[_qslot(w, ks, 0, lane)])
                    b1 = f32_bits(sm_o[_qslot(w, ks, 1, lane)])
                    if ks & 1:
                        s2 = mma_bf16(a, b0, b1, s2)
                    else:
                        s = mma_bf16(a, b0, b1, s)
            ok0 = j0 + g < k1
            ok1 = j0 + g + 8 < k1
            s0 = s[0] + s2[0] if ok0 else float32(NEG)     # key g, head 2t
            s1 = s[1] + s2[1] if ok0 else float32(NEG)     # key g, head 2t + 1
            s2_ = s[2] + s2[2] if ok1 else float32(NEG)    # key g + 8, head 2t
            s3 = s[3] + s2[3] if ok1 else float32(NEG)     # key g + 8, head 2t + 1
            # ---- online softmax per head (key j0 is in range, so the tile max is finite)
            mn_e = max(m_e, _col_max(max(s0, s2_)))
            mn_o = max(m_o, _col_max(max(s1, s3)))
            c_e = math.exp(m_e - mn_e)
            c_o = math.exp(m_o - mn_o)
            m_e = mn_e
            m_o = mn_o
            p0 = math.exp(s0 - mn_e) if ok0 else float32(0.0)
            p1 = math.exp(s1 - mn_o) if ok0 else float32(0.0)
            p2 = math.exp(s2_ - mn_e) if ok1 else float32(0.0)
            p3 = math.exp(s3 - mn_o) if ok1 else float32(0.0)
            l_e = l_e * c_e + p0 + p2
            l_o = l_o * c_o + p1 + p3
            for mt in range(16):
                o[mt, 0] *= c_e
                o[mt, 1] *= c_o
                o[mt, 2] *= c_e
                o[mt, 3] *= c_o
            # ---- P^T B-fragment: head g, keys (2t, 2t + 8) and (2t + 1, 2t + 9)
            we = pack_bf16x2(p2, p0)
            wo = pack_bf16x2(p3, p1)
            odd = (g & 1) != 0
            b0 = _p_word(we, wo, 8 * t4 + (g >> 1), odd)
            b1 = _p_word(we, wo, 8 * t4 + 4 + (g >> 1), odd)
            # ---- O^T += V^T P^T; m-tile mt = 4 c + i: rows g / g + 8 = dims 64 c + 8 g + 2 i (+ 1)
            for mt in range(16):
                c = mt >> 2
                if c < n_vc:
                    i = mt & 3
                    wa = vw[0, c, i]
                    wb = vw[1, c, i]
                    wc = vw[2, c, i]
                    wd = vw[3, c, i]
                    a = (uint32((wa & LO) | (wb << 16)), uint32((wa >> 16) | (wb & HI)),
                         uint32((wc & LO) | (wd << 16)), uint32((wc >> 16) | (wd & HI)))
                    r = mma_bf16(a, b0, b1, (o[mt, 0], o[mt, 1], o[mt, 2], o[mt, 3]))
                    o[mt, 0] = r[0]
                    o[mt, 1] = r[1]
                    o[mt, 2] = r[2]
                    o[mt, 3] = r[3]
            j0 += DEC_TILE * DEC_WARPS
            if j0 < k1:
                load_tile(k_cache, v_cache, page_table, b, kw, vw, j0, k0, k1, row, col, g, t4)
        # ---- this warp's (max, sum, O) to shared memory, then the block's merge
        l_e = _col_sum(l_e)
        l_o = _col_sum(l_o)
        he = 2 * t4
        cuda.syncthreads()                  # every warp is past its last read of Q in sm_o
        if g == 0:
            sm_m[w, he] = m_e
            sm_m[w, he + 1] = m_o
            sm_l[w, he] = l_e
            sm_l[w, he + 1] = l_o
        for mt in range(16):
            c = mt >> 2
            if c < n_vc:
                d = 64 * c + 8 * g + 2 * (mt & 3)
                x = _oslot(w, he, d)
                sm_o[x] = o[mt, 0]
                sm_o[x + O_PITCH] = o[mt, 1]
                sm_o[x + 1] = o[mt, 2]
                sm_o[x + O_PITCH + 1] = o[mt, 3]
        cuda.syncthreads()
        if tid < grp:                       # per head: the split's max and sum, each warp's weight
            mm = float32(NEG)
            for w_ in range(DEC_WARPS):
                mm = max(mm, sm_m[w_, tid])
            ll = float32(0.0)
            for w_ in range(DEC_WARPS):
                wt = math.exp(sm_m[w_, tid] - mm)
                sm_m[w_, tid] = wt
                ll += sm_l[w_, tid] * wt
            part_ml[t, hk * grp + tid, sp, 0] = mm
            part_ml[t, hk * grp + tid, sp, 1] = ll
        cuda.syncthreads()
        for hh in range(grp):
            for d in range(tid, d_head, 32 * DEC_WARPS):
                acc = float32(0.0)
                for w_ in range(DEC_WARPS):
                    acc += sm_o[_oslot(w_, hh, d)] * sm_m[w_, hh]
                part_o[t, hk * grp + hh, sp, d] = acc

    options: dict = {"sim": True, "fastmath": True, "launch_bounds": (32 * DEC_WARPS, BLOCKS_PER_SM)}
    if paged:
        def attn_split_mma_paged(q, k_cache, v_cache, positions, page_table, scale, part_o, part_ml):
            split_mma(q, k_cache, v_cache, positions, page_table, scale, part_o, part_ml)

        attn_split_mma_paged.__name__ = f"attn_split_mma_paged_d{D_HEAD}_kernel"
        return kernel((f32_3, u16_3, u16_3, i32_1, i32_2, f32, f32_4, f32_4), **options)(attn_split_mma_paged)

    def attn_split_mma(q, k_cache, v_cache, positions, scale, part_o, part_ml):
        split_mma(q, k_cache, v_cache, positions, positions, scale, part_o, part_ml)

    attn_split_mma.__name__ = f"attn_split_mma_d{D_HEAD}_kernel"
    return kernel((f32_3, u16_3, u16_3, i32_1, f32, f32_4, f32_4), **options)(attn_split_mma)


HEAD_DIMS = (64, 256)           # Qwen3.5 / 3.6 attention: 256; 64: Llama-family (SmolLM2) and the simulator's case
SPLIT_MMA_KERNELS: dict[int, KernelSpec] = {d: _make_split_mma(d) for d in HEAD_DIMS}
SPLIT_MMA_PAGED_KERNELS: dict[int, KernelSpec] = {d: _make_split_mma(d, paged=True) for d in HEAD_DIMS}
