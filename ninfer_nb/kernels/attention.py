"""KV-cache store and causal GQA attention (fp32 math; caches fp32, bf16-as-uint16, or int8
codes with one fp32 scale per 64 values, see kvquant.py).

Layouts: q [T, Hq, D]; caches [S, Hkv, D]; positions [T] int32 in device memory; query i sees
keys 0..positions[i]; q-head h reads kv-head h // (Hq / Hkv). D <= 256.
* decode: `attn_split_kernel` (grid: splits x Hq x T, 4 warps, online softmax per warp, warp
  shuffles) writes per-split (acc, max, sum); `attn_combine_kernel` merges the splits. The
  split count depends only on the cache length, so one graph covers every position.
* prefill: `attn_prefill_kernel`, 16 queries x 16 keys tiles in shared memory (simulator-safe).
"""
from __future__ import annotations

import math

from numba import cuda, float32

from ninfer_nb.kernels.bf16 import from_f32
from ninfer_nb.kernels.kvquant import GROUP, kv_load
from ninfer_nb.kernels.nbtypes import f32, f32_3, f32_4, i8_3, i32, i32_1, u16_3
from ninfer_nb.kernels.registry import kernel
from ninfer_nb.kernels.warp import warp_sum as _warp_sum

NEG = -1.0e30
MAX_D = 256
SPLIT_WARPS = 4
SPLIT_LEN = 256       # keys per split (decode)


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


_SPLIT_SIGS = [(f32_3, c, c, f32_3, f32_3, i32_1, f32, i32, f32_4, f32_4) for c in (f32_3, u16_3, i8_3)]


@kernel(*_SPLIT_SIGS, sim=False, launch_bounds=(128, 4))
def attn_split_kernel(q, k_cache, v_cache, k_scale, v_scale, positions, scale, split_len, part_o,
                      part_ml):
    """grid (n_split, Hq, T), block 128. part_o [T, Hq, n_split, D] (unnormalised),
    part_ml [T, Hq, n_split, 2] = (running max, running sum)."""
    sm_m = cuda.shared.array(SPLIT_WARPS, float32)
    sm_l = cuda.shared.array(SPLIT_WARPS, float32)
    sm_acc = cuda.shared.array((SPLIT_WARPS, MAX_D), float32)
    qv = cuda.local.array(8, float32)
    acc = cuda.local.array(8, float32)
    sp = cuda.blockIdx.x
    h = cuda.blockIdx.y
    t = cuda.blockIdx.z
    lane = cuda.threadIdx.x & 31
    warp = cuda.threadIdx.x >> 5
    d_head = q.shape[2]
    hk = h // (q.shape[1] // k_cache.shape[1])
    pos = positions[t]
    k0 = sp * split_len
    k1 = min(k0 + split_len, pos + 1)
    for e in range(8):
        d = lane + 32 * e
        qv[e] = q[t, h, d] * scale if d < d_head else float32(0.0)
        acc[e] = float32(0.0)
    m = float32(NEG)
    l = float32(0.0)
    for j in range(k0 + warp, k1, SPLIT_WARPS):
        s = float32(0.0)
        for e in range(8):
            d = lane + 32 * e
            if d < d_head:
                s += qv[e] * kv_load(k_cache, k_scale, j, hk, d)
        s = _warp_sum(s)
        m_new = max(m, s)
        corr = math.exp(m - m_new)
        p = math.exp(s - m_new)
        l = l * corr + p
        for e in range(8):
            d = lane + 32 * e
            if d < d_head:
                acc[e] = acc[e] * corr + p * kv_load(v_cache, v_scale, j, hk, d)
        m = m_new
    if lane == 0:
        sm_m[warp] = m
        sm_l[warp] = l
    for e in range(8):
        d = lane + 32 * e
        if d < d_head:
            sm_acc[warp, d] = acc[e]
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


@kernel((f32_4, f32_4, f32_3))
def attn_combine_kernel(part_o, part_ml, out):
    """grid (Hq, T), block 256: out[t, h, :] = merge of the splits."""
    h = cuda.blockIdx.x
    t = cuda.blockIdx.y
    n_split = part_o.shape[2]
    mm = float32(NEG)
    for s in range(n_split):
        mm = max(mm, part_ml[t, h, s, 0])
    ll = float32(0.0)
    for s in range(n_split):
        ll += part_ml[t, h, s, 1] * math.exp(part_ml[t, h, s, 0] - mm)
    inv = float32(1.0) / ll
    for d in range(cuda.threadIdx.x, out.shape[2], cuda.blockDim.x):
        o = float32(0.0)
        for s in range(n_split):
            o += part_o[t, h, s, d] * math.exp(part_ml[t, h, s, 0] - mm)
        out[t, h, d] = o * inv


BQ = 16
BKEY = 16
PITCH = MAX_D + 1     # padded row pitch of the shared tiles (bank-conflict free)
TILE = BQ * PITCH
PRE_THREADS = 256
ACC_PER_THREAD = MAX_D // 16

@cuda.jit(device=True)
def _tile_max_pos(pos_s):
    mx = float32(-1.0)
    for i in range(BQ):
        mx = max(mx, pos_s[i])
    return int(mx)


_PRE_SIGS = [(f32_3, c, c, f32_3, f32_3, i32_1, f32, f32_3) for c in (f32_3, u16_3, i8_3)]


@kernel(*_PRE_SIGS)
def attn_prefill_kernel(q, k_cache, v_cache, k_scale, v_scale, positions, scale, out):
    """grid (ceil(T / 16), Hq), block 256. Flash-style online softmax over 16-key tiles."""
    q_s = cuda.shared.array(TILE, float32)
    kv_s = cuda.shared.array(TILE, float32)
    p_s = cuda.shared.array((BQ, BKEY), float32)
    m_s = cuda.shared.array(BQ, float32)
    l_s = cuda.shared.array(BQ, float32)
    c_s = cuda.shared.array(BQ, float32)
    pos_s = cuda.shared.array(BQ, float32)     # positions as fp32 (exact below 2^24)
    acc = cuda.local.array(ACC_PER_THREAD, float32)
    tid = cuda.threadIdx.x
    q0 = cuda.blockIdx.x * BQ
    h = cuda.blockIdx.y
    n_tok = q.shape[0]
    d_head = q.shape[2]
    hk = h // (q.shape[1] // k_cache.shape[1])
    # stage Q (pre-scaled) and the query positions
    for i in range(tid, BQ * d_head, PRE_THREADS):
        r = i // d_head
        d = i - r * d_head
        q_s[r * PITCH + d] = q[q0 + r, h, d] * scale if q0 + r < n_tok else float32(0.0)
    if tid < BQ:
        pos_s[tid] = float32(positions[q0 + tid]) if q0 + tid < n_tok else float32(-1.0)
        m_s[tid] = float32(NEG)
        l_s[tid] = float32(0.0)
    for e in range(ACC_PER_THREAD):
        acc[e] = float32(0.0)
    cuda.syncthreads()
    kmax = _tile_max_pos(pos_s)
    qi = tid // BKEY          # row handled in the score / accumulate phases
    kj = tid % BKEY
    qpos = pos_s[qi]
    for j0 in range(0, kmax + 1, BKEY):
        # K tile
        for i in range(tid, BKEY * d_head, PRE_THREADS):
            r = i // d_head
            d = i - r * d_head
            kv_s[r * PITCH + d] = kv_load(k_cache, k_scale, j0 + r, hk, d) if j0 + r <= kmax else float32(0.0)
        cuda.syncthreads()
        s = float32(0.0)
        for d in range(d_head):
            s += q_s[qi * PITCH + d] * kv_s[kj * PITCH + d]
        p_s[qi, kj] = s if float32(j0 + kj) <= qpos else float32(NEG)
        cuda.syncthreads()
        if tid < BQ:
            m_old = m_s[tid]
            m_new = m_old
            for c in range(BKEY):
                m_new = max(m_new, p_s[tid, c])
            corr = math.exp(m_old - m_new)
            lsum = float32(0.0)
            for c in range(BKEY):
                sc = p_s[tid, c]
                pe = math.exp(sc - m_new) if sc > float32(NEG) else float32(0.0)
                p_s[tid, c] = pe
                lsum += pe
            l_s[tid] = l_s[tid] * corr + lsum
            m_s[tid] = m_new
            c_s[tid] = corr
        # V tile (K no longer needed)
        for i in range(tid, BKEY * d_head, PRE_THREADS):
            r = i // d_head
            d = i - r * d_head
            kv_s[r * PITCH + d] = kv_load(v_cache, v_scale, j0 + r, hk, d) if j0 + r <= kmax else float32(0.0)
        cuda.syncthreads()
        corr = c_s[qi]
        for e in range(ACC_PER_THREAD):
            d = kj + 16 * e
            if d < d_head:
                a = acc[e] * corr
                for c in range(BKEY):
                    a += p_s[qi, c] * kv_s[c * PITCH + d]
                acc[e] = a
        cuda.syncthreads()
    if q0 + qi < n_tok:
        inv = float32(1.0) / l_s[qi]
        for e in range(ACC_PER_THREAD):
            d = kj + 16 * e
            if d < d_head:
                out[q0 + qi, h, d] = acc[e] * inv


