"""Decode attention (T <= 4 query tokens) that reads each K / V row once per kv head, staged
through shared memory by cp.async. Same contract as attention.attn_split_kernel (per-split
unnormalised outputs and (max, sum), merged by attention.attn_combine_kernel).

Why: attn_split_kernel runs a block per (split, q head), so each K / V row is read G = Hq /
Hkv times (6 for the 27B, 8 for the 35B), from L2 at best: 403 MB of L2 -> SM traffic per 27B
layer at 8K context in 59 us (~6.8 TB/s, the L2's limit), 29 % of the copy bandwidth in unique
bytes. Two earlier kv-head kernels kept the G query vectors in registers (233 registers, 2
blocks per SM, 2 keys in flight per warp): no faster at 8K, slower at 512, latency-bound.

`attn_split_tiled_kernel`: grid (n_split, Hkv, T), THREADS = 256 (8 warps), dynamic shared
memory STAGES x (K tile + V tile) of TK keys x D (64 KB for an fp32 cache at D = 256, 32 KB for
bf16). Every thread issues 16-byte cp.async copies of the next tiles while the warps compute
on the current one (two stages: one tile in flight while one is used). Warp g < G owns q head
hk * G + g for the whole split: lane l holds 8 dims of q and of its accumulator (`_dim`);
per tile it reads each key's K row from shared memory (16-byte loads), one warp reduction per
key, one online-softmax update per tile, then the V rows. Warps past G only copy. No merge
across warps: a warp's (acc, max, sum) is the split's partial for its head.
Caches fp32 or bf16 (uint16 bits); D <= 256, D % 8 == 0. Runs in the CUDA simulator
(cp.async, the 16-byte shared loads and the shuffles are emulated there). Not yet timed on a GPU:
opt-in (ops/cuda.py EXPERIMENTAL "attn_tiled").
"""
from __future__ import annotations

import math

from numba import cuda, float32, int64

from ninfer_nb.kernels.attention import NEG, _split_range
from ninfer_nb.kernels.bf16 import f32_bits
from ninfer_nb.kernels.nbtypes import f32, f32_3, f32_4, i32, i32_1, u16_3
from ninfer_nb.kernels.ptx import as_f32, cp_async16, cp_async_commit, cp_async_wait1, gptr, lds_v4_f32, smem_u32
from ninfer_nb.kernels.registry import kernel
from ninfer_nb.kernels.warp import warp_sum

WARPS = 8                 # q heads per kv head this kernel takes: G <= WARPS
THREADS = 32 * WARPS
TK = 16                   # keys per tile
STAGES = 2
MAX_D = 256
SMEM_BYTES = STAGES * 2 * TK * MAX_D * 4      # fp32 K and V tiles: 65,536 B
BLOCKS_PER_SM = 2         # launch_bounds minimum (and decode_splits' resident blocks per SM)
HI = 0xFFFF0000


def supported(n_q_heads: int, n_kv_heads: int, d_head: int) -> bool:
    return n_q_heads % n_kv_heads == 0 and n_q_heads // n_kv_heads <= WARPS and d_head % 8 == 0 and d_head <= MAX_D


@cuda.jit(device=True, inline=True)
def _copy_tile(sbase, s_off, kbase, vbase, key0, k1, row_bytes, key_stride, tile_bytes, tid):
    """K and V rows of keys key0 .. key0 + TK - 1 (past k1: the last key again, masked later)
    -> the stage at byte offset s_off: [K tile | V tile], each [TK][row_bytes]."""
    parts = row_bytes // 16
    for c in range(tid, TK * parts, THREADS):
        key = c // parts
        part = c - key * parts
        j = min(key0 + key, k1 - 1)
        so = s_off + key * row_bytes + part * 16
        go = j * key_stride + part * 16
        cp_async16(sbase + so, kbase + go)
        cp_async16(sbase + so + tile_bytes, vbase + go)


@cuda.jit(device=True, inline=True)
def _dim(lane, e, esize):
    """Head dim of this lane's value e (0..7). fp32: dims 4 lane .. + 3 and 128 + 4 lane .. + 3,
    so each 16-byte shared load of a warp covers 512 contiguous bytes (no bank conflicts; 8
    contiguous fp32 per lane would be 2-way); bf16: dims 8 lane .. + 7 (one 16-byte load)."""
    if esize == 4:
        return 4 * lane + e if e < 4 else 128 + 4 * lane + (e - 4)
    return 8 * lane + e


@cuda.jit(device=True, inline=True)
def _row8(smem, row_word, lane, esize, d_head, live, x):
    """This lane's 8 values (see _dim) of a staged row starting at 32-bit word row_word; zeros
    for dims past the head dim (what lies there may be NaN bits) and in warps without a head."""
    a = (float32(0.0), float32(0.0), float32(0.0), float32(0.0))
    b = a
    if live and (4 * lane if esize == 4 else 8 * lane) < d_head:   # the first 16 bytes' dims
        a = lds_v4_f32(smem, row_word + 4 * lane)
    if esize == 4:
        if live and 128 + 4 * lane < d_head:
            b = lds_v4_f32(smem, row_word + 128 + 4 * lane)
        x[0], x[1], x[2], x[3] = a
        x[4], x[5], x[6], x[7] = b
    else:
        for i in range(4):
            u = int64(f32_bits(a[i]))                   # the bf16 pair's bits, int64
            x[2 * i] = as_f32(u << 16)
            x[2 * i + 1] = as_f32(u & HI)


@kernel((f32_3, f32_3, f32_3, i32_1, f32, i32, f32_4, f32_4), (f32_3, u16_3, u16_3, i32_1, f32, i32, f32_4, f32_4),
        launch_bounds=(THREADS, BLOCKS_PER_SM), dynamic_smem=SMEM_BYTES)
def attn_split_tiled_kernel(q, k_cache, v_cache, positions, scale, esize, part_o, part_ml):
    """q [T, Hq, D]; caches [S, Hkv, D] (esize: 4 fp32, 2 bf16); part_o [T, Hq, n_split, D],
    part_ml [T, Hq, n_split, 2] as attn_split_kernel. Grid (n_split, Hkv, T), THREADS threads,
    SMEM_BYTES of dynamic shared memory."""
    smem = cuda.shared.array(0, float32)
    sbase = smem_u32(smem)
    qv = cuda.local.array(8, float32)
    acc = cuda.local.array(8, float32)
    row = cuda.local.array(8, float32)
    sc = cuda.local.array(TK, float32)
    sp = cuda.blockIdx.x
    hk = cuda.blockIdx.y
    t = cuda.blockIdx.z
    tid = cuda.threadIdx.x
    lane = tid & 31
    warp = tid >> 5
    d_head = q.shape[2]
    n_kv = k_cache.shape[1]
    n_g = q.shape[1] // n_kv
    k0, k1 = _split_range(positions[t], sp, part_o.shape[2])
    n_tiles = (k1 - k0 + TK - 1) // TK if k1 > k0 else 0
    row_bytes = int64(d_head) * int64(esize)        # int64: byte offsets into the cache
    tile_bytes = TK * row_bytes
    key_stride = n_kv * row_bytes
    kbase = gptr(k_cache) + hk * row_bytes
    vbase = gptr(v_cache) + hk * row_bytes
    if n_tiles > 0:
        _copy_tile(sbase, 0, kbase, vbase, k0, k1, row_bytes, key_stride, tile_bytes, tid)
    cp_async_commit()                                   # group: tile 0
    if n_tiles > 1:
        _copy_tile(sbase, 2 * tile_bytes, kbase, vbase, k0 + TK, k1, row_bytes, key_stride, tile_bytes, tid)
    cp_async_commit()                                   # group: tile 1 (maybe empty)

    h = hk * n_g + warp
    live = warp < n_g                                   # warps past the group only copy
    for e in range(8):
        d = _dim(lane, e, esize)
        qv[e] = q[t, h, d] * scale if (live and d < d_head) else float32(0.0)
        acc[e] = float32(0.0)
    m = float32(NEG)
    l = float32(0.0)
    for it in range(n_tiles):
        cp_async_wait1()                                # tile `it` has landed (this thread's copies)
        cuda.syncthreads()                              # (everyone's)
        s_off = (it & 1) * 2 * tile_bytes
        key0 = k0 + it * TK
        if live:
            k_word = s_off // 4
            m_new = m
            for j in range(TK):                         # scores: one warp reduction per key
                _row8(smem, k_word + j * (row_bytes // 4), lane, esize, d_head, live, row)
                s_ = float32(0.0)
                for e in range(8):
                    s_ += qv[e] * row[e]
                s_ = warp_sum(s_)
                sc[j] = s_
                if key0 + j < k1:
                    m_new = max(m_new, s_)
            corr = math.exp(m - m_new)
            l = l * corr
            for e in range(8):
                acc[e] = acc[e] * corr
            v_word = k_word + tile_bytes // 4
            for j in range(TK):
                p = math.exp(sc[j] - m_new) if key0 + j < k1 else float32(0.0)
                l += p
                _row8(smem, v_word + j * (row_bytes // 4), lane, esize, d_head, live, row)
                for e in range(8):
                    acc[e] += p * row[e]
            m = m_new
        cuda.syncthreads()                              # every warp is done with this stage
        if it + 2 < n_tiles:
            _copy_tile(sbase, s_off, kbase, vbase, key0 + 2 * TK, k1, row_bytes, key_stride, tile_bytes, tid)
        cp_async_commit()                               # group: tile it + 2 (maybe empty)
    if live:
        for e in range(8):
            d = _dim(lane, e, esize)
            if d < d_head:
                part_o[t, h, sp, d] = acc[e]
    if live and lane == 0:
        part_ml[t, h, sp, 0] = m
        part_ml[t, h, sp, 1] = l
