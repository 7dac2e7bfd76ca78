"""MoE experts for a few tokens (2 .. 63: a batched decode round, a speculative verify), grouped
by expert: every touched expert's weights are read once per launch, with all the rows routed
to it, on the tensor cores (mma.sync m16n8k16, the weight as the A operand, the rows as B).

Pairs: p = t * S + s for token t, slot s (ids [T, S], S = k (+1 shared)); P = T * S.

1. `moe_rows_prep_kernel`, grid 1 + ceil(T H / (8 * 256)), block 256. Block 0 sorts the pairs
   by expert in shared memory (counts by shared atomics, a block scan, rows handed out by shared
   atomics; no host sync):
   order [P] = pair ids, expert-sorted; work items [P, 3] = (expert, first sorted row, rows
   <= ROWS), the last expert of the stack first (the shared one when it is a slot), then
   ascending; n_items [1]. Ids outside [0, E) are dropped. The other blocks split x [T, H] into
   bf16 hi + lo halves (x = hi + lo to ~2^-17 relative), the MMAs' B operands.
2. `moe_rows_gate_up_kernel`, grid (I / 16, max items), block 32 W: block (j, it) computes
   gate rows 16 j .. and the same up rows of item it's expert, warps splitting H; each lane
   streams 16-byte chunks of rows g and g + 8 (g = lane / 4) at column 8 (lane % 4) of each
   32-column step: the four words are the A fragments of two MMAs over a permuted k (the B
   fragment is the row's x at the same 8 columns, one 16-byte load). Hi and lo B halves: two
   MMAs each. The warps' partial sums meet in shared memory (fixed order), SwiGLU, and h
   [P, I] (sorted rows) is written as bf16 hi + lo halves too.
3. `moe_rows_down_kernel`, grid (H / (16 W), max items), block 32 W: one warp per 16 output
   rows over all of I; y[p, n] = weight[p] * (down[e, n] . h[row of p]) at the pair's row.
4. `moe_rows_combine_kernel`, grid (ceil(H / 256), T): out[t] (+)= sum of y[t S + s] in slot
   order (deterministic; the decoder's residual add when accumulating).
Items of up to ROWS = 16 rows (two n8 tiles; the second only when the item has more than 8);
an expert with more rows gets several items (each reads its weights again).
Deterministic although the rows of an expert come in arrival order: an MMA's output column
depends on its own B column only (same k order whatever the column), h and y rows belong to
their pair, and the combine sums each token's slots in slot order.
"""
from __future__ import annotations

import math

from numba import cuda, float32, int32, uint16, uint32

from ninfer_nb.kernels.common.nbtypes import f32_1, f32_2, i32, i32_1, i32_2, u16_2, u16_3
from ninfer_nb.kernels.common.ptx import (
    as_f32,
    ldg_stream_v4_u32,
    ldg_v4_f32,
    mma_bf16,
    pack_bf16x2,
    st_v4_u32,
)
from ninfer_nb.kernels.common.registry import kernel

ROWS = 16              # rows (routed pairs of one expert) per work item: two n8 MMA tiles
MAX_PAIRS = 1024       # T * S the sort holds in shared memory
MAX_EXPERTS = 1088     # experts in the stack (routed + shared)
PREP_THREADS = 256     # block of the prep kernel (a power of two)
MAX_WARPS = 8          # warps per block of the gate_up kernel (its reduction buffer)
GU_UNROLL = 2          # 32-column steps per pass in gate_up: 8 16-byte weight loads per lane in flight
DN_UNROLL = 4          # 32-column steps per pass in down: 8 loads per lane in flight
COMBINE_THREADS = 256


def max_items(n_pairs: int, n_exp: int) -> int:
    """A bound on the work items of any routing (the gate_up / down grids' y)."""
    return max(1, min(n_pairs, n_exp + n_pairs // ROWS))


@cuda.jit(device=True, inline=True)
def _hi_lo(v0, v1):
    """(hi, lo) bf16x2 words of the pair (v0, v1) (v0 in bits 15:0): v = hi + lo, both RNE."""
    wh = pack_bf16x2(v1, v0)
    h0 = as_f32(wh << 16)
    h1 = as_f32(wh & 0xFFFF0000)
    return wh, pack_bf16x2(v1 - h1, v0 - h0)


@kernel((i32_2, f32_2, i32, i32_2, i32_1, i32_1, u16_2, u16_2), launch_bounds=(PREP_THREADS, 1))
def moe_rows_prep_kernel(ids, x, n_exp, items, order, n_items, xhi, xlo):
    """See the module doc, step 1. ids [T, S] int32; x [T, H] (H % 8 == 0); items [>= max_items,
    3]; order [P]; n_items [1]; xhi, xlo [T, H] bf16 bits."""
    if cuda.blockIdx.x > 0:
        _split_x(x, xhi, xlo, cuda.blockIdx.x - 1)
        return
    _sort_pairs(ids, n_exp, items, order, n_items)


@cuda.jit(device=True, inline=True)
def _split_x(x, xhi, xlo, blk):
    """x -> bf16 hi + lo, 8 values per thread of block blk."""
    i = (blk * cuda.blockDim.x + cuda.threadIdx.x) * 8
    if i < x.shape[0] * x.shape[1]:
        a = ldg_v4_f32(x, i)
        b = ldg_v4_f32(x, i + 4)
        h0, l0 = _hi_lo(a[0], a[1])
        h1, l1 = _hi_lo(a[2], a[3])
        h2, l2 = _hi_lo(b[0], b[1])
        h3, l3 = _hi_lo(b[2], b[3])
        st_v4_u32(xhi, i, h0, h1, h2, h3)
        st_v4_u32(xlo, i, l0, l1, l2, l3)


@cuda.jit(device=True)
def _sort_pairs(ids, n_exp, items, order, n_items):
    """The whole block: the pairs of ids sorted by expert into order, items and n_items (the
    module doc, step 1)."""
    tid = cuda.threadIdx.x
    s_ids = cuda.shared.array(MAX_PAIRS, int32)
    cnt = cuda.shared.array(MAX_EXPERTS, int32)  # counts, then each expert's first sorted row
    scan = cuda.shared.array(PREP_THREADS, int32)
    nthr = cuda.blockDim.x
    n_slots = ids.shape[1]
    n_pairs = ids.shape[0] * n_slots
    for e in range(tid, n_exp, nthr):
        cnt[e] = 0
    for p in range(tid, n_pairs, nthr):
        t = p // n_slots
        e = ids[t, p - t * n_slots]
        s_ids[p] = e if 0 <= e < n_exp else -1
    cuda.syncthreads()
    for p in range(tid, n_pairs, nthr):
        e = s_ids[p]
        if e >= 0:
            cuda.atomic.add(cnt, e, 1)
    cuda.syncthreads()
    # positions i = 0 .. E-1 hold experts E-1, 0, 1, .., E-2; each thread a contiguous segment;
    # (rows << 16) + items packed in one int32 for the scan (rows, items <= MAX_PAIRS)
    seg = (n_exp + nthr - 1) // nthr
    i0 = min(tid * seg, n_exp)
    i1 = min(i0 + seg, n_exp)
    tot = 0
    for i in range(i0, i1):
        c = cnt[i - 1 if i > 0 else n_exp - 1]
        tot += (c << 16) + (c + ROWS - 1) // ROWS
    scan[tid] = tot
    cuda.syncthreads()
    off = 1
    while off < nthr:                            # inclusive Hillis-Steele scan
        v = scan[tid - off] if tid >= off else 0
        cuda.syncthreads()
        scan[tid] += v
        cuda.syncthreads()
        off *= 2
    run = scan[tid] - tot
    if tid == nthr - 1:
        n_items[0] = scan[tid] & 0xFFFF
    for i in range(i0, i1):
        e = i - 1 if i > 0 else n_exp - 1
        c = cnt[e]
        ro = run >> 16
        io = run & 0xFFFF
        q = 0
        while q * ROWS < c:
            items[io + q, 0] = e
            items[io + q, 1] = ro + q * ROWS
            items[io + q, 2] = min(ROWS, c - q * ROWS)
            q += 1
        cnt[e] = ro
        run += (c << 16) + (c + ROWS - 1) // ROWS
    cuda.syncthreads()
    for p in range(tid, n_pairs, nthr):          # a row within the expert's rows by arrival: the
        e = s_ids[p]                             # results do not depend on it (module doc)
        if e >= 0:
            order[cuda.atomic.add(cnt, e, 1)] = p


@cuda.jit(device=True, inline=True)
def _mma2(w0, w1, bh, bl, acc):
    """acc += the two k16 MMAs of rows (g: words w0, g + 8: words w1) against B = hi + lo words."""
    acc = mma_bf16((w0[0], w1[0], w0[1], w1[1]), bh[0], bh[1], acc)
    acc = mma_bf16((w0[0], w1[0], w0[1], w1[1]), bl[0], bl[1], acc)
    acc = mma_bf16((w0[2], w1[2], w0[3], w1[3]), bh[2], bh[3], acc)
    return mma_bf16((w0[2], w1[2], w0[3], w1[3]), bl[2], bl[3], acc)


@cuda.jit(device=True, inline=True)
def _split_bf16(v):
    """bf16 bits (hi, lo) with v = hi + lo."""
    w = pack_bf16x2(v, v)
    hf = as_f32(w & 0xFFFF0000)
    d = v - hf
    return uint16(w & 0xFFFF), uint16(pack_bf16x2(d, d) & 0xFFFF)


@kernel((u16_2, u16_2, u16_3, i32_2, i32_1, i32_1, i32, u16_2, u16_2), fastmath=True, launch_bounds=(256, 2))
def moe_rows_gate_up_kernel(xhi, xlo, gate_up, items, order, n_items, n_slots, hhi, hlo):
    """See the module doc, step 2. gate_up [E, 2I, H] bf16 (I % 16 == 0, H % (32 GU_UNROLL W)
    == 0); hhi, hlo [P, I] bf16 bits, sorted rows."""
    red = cuda.shared.array((MAX_WARPS, 2, 8, 32), float32)     # [warp, gate/up, register, lane]
    it = cuda.blockIdx.y
    if it >= n_items[0]:
        return
    e = items[it, 0]
    r0 = items[it, 1]
    nr = items[it, 2]
    tid = cuda.threadIdx.x
    lane = tid & 31
    warp = tid >> 5
    nw = cuda.blockDim.x >> 5
    g = lane >> 2
    c = lane & 3
    inter = hhi.shape[1]
    hid = xhi.shape[1]
    j0 = cuda.blockIdx.x * 16
    kw = hid // nw
    k0 = warp * kw + 8 * c
    rg0 = (e * 2 * inter + j0 + g) * hid + k0
    rg1 = rg0 + 8 * hid
    ru0 = rg0 + inter * hid
    ru1 = ru0 + 8 * hid
    xo0 = order[r0 + min(g, nr - 1)] // n_slots * hid + k0          # rows past nr: any valid row
    two = nr > 8
    xo1 = order[r0 + min(8 + g, nr - 1)] // n_slots * hid + k0
    z = float32(0.0)
    ag0 = (z, z, z, z)
    au0 = (z, z, z, z)
    ag1 = (z, z, z, z)
    au1 = (z, z, z, z)
    wg0 = cuda.local.array((GU_UNROLL, 4), uint32)
    wg1 = cuda.local.array((GU_UNROLL, 4), uint32)
    wu0 = cuda.local.array((GU_UNROLL, 4), uint32)
    wu1 = cuda.local.array((GU_UNROLL, 4), uint32)
    for s in range(0, kw, 32 * GU_UNROLL):
        for q in range(GU_UNROLL):
            o = s + 32 * q
            wg0[q, 0], wg0[q, 1], wg0[q, 2], wg0[q, 3] = ldg_stream_v4_u32(gate_up, rg0 + o)
            wg1[q, 0], wg1[q, 1], wg1[q, 2], wg1[q, 3] = ldg_stream_v4_u32(gate_up, rg1 + o)
            wu0[q, 0], wu0[q, 1], wu0[q, 2], wu0[q, 3] = ldg_stream_v4_u32(gate_up, ru0 + o)
            wu1[q, 0], wu1[q, 1], wu1[q, 2], wu1[q, 3] = ldg_stream_v4_u32(gate_up, ru1 + o)
        for q in range(GU_UNROLL):
            o = s + 32 * q
            a0 = (wg0[q, 0], wg0[q, 1], wg0[q, 2], wg0[q, 3])
            a1 = (wg1[q, 0], wg1[q, 1], wg1[q, 2], wg1[q, 3])
            b0 = (wu0[q, 0], wu0[q, 1], wu0[q, 2], wu0[q, 3])
            b1 = (wu1[q, 0], wu1[q, 1], wu1[q, 2], wu1[q, 3])
            xh = ldg_stream_v4_u32(xhi, xo0 + o)
            xl = ldg_stream_v4_u32(xlo, xo0 + o)
            ag0 = _mma2(a0, a1, xh, xl, ag0)
            au0 = _mma2(b0, b1, xh, xl, au0)
            if two:
                xh = ldg_stream_v4_u32(xhi, xo1 + o)
                xl = ldg_stream_v4_u32(xlo, xo1 + o)
                ag1 = _mma2(a0, a1, xh, xl, ag1)
                au1 = _mma2(b0, b1, xh, xl, au1)
    for ci in range(4):
        red[warp, 0, ci, lane] = ag0[ci]
        red[warp, 1, ci, lane] = au0[ci]
        red[warp, 0, 4 + ci, lane] = ag1[ci]
        red[warp, 1, 4 + ci, lane] = au1[ci]
    cuda.syncthreads()
    for q in range(tid, 256, cuda.blockDim.x):
        reg = q >> 5
        ln = q & 31
        col = (reg >> 2) * 8 + 2 * (ln & 3) + (reg & 1)
        if col < nr:
            sg = float32(0.0)
            su = float32(0.0)
            for w in range(nw):
                sg += red[w, 0, reg, ln]
                su += red[w, 1, reg, ln]
            hv = sg / (float32(1.0) + math.exp(-sg)) * su
            j = j0 + (ln >> 2) + 8 * ((reg >> 1) & 1)
            hb, lb = _split_bf16(hv)
            hhi[r0 + col, j] = hb
            hlo[r0 + col, j] = lb


@kernel((u16_2, u16_2, u16_3, i32_2, i32_1, i32_1, f32_1, f32_2), fastmath=True, launch_bounds=(256, 2))
def moe_rows_down_kernel(hhi, hlo, down, items, order, n_items, wts, y):
    """See the module doc, step 3. down [E, H, I] bf16 (H % 16 == 0, I % (32 DN_UNROLL) == 0);
    wts [P] slot weights; y [P, H] (rows of dropped pairs are not written)."""
    it = cuda.blockIdx.y
    if it < n_items[0]:
        _down_item(hhi, hlo, down, items, order, wts, y, it)


@cuda.jit(device=True, inline=True)
def _down_item(hhi, hlo, down, items, order, wts, y, it):
    """One block's 16 W output rows of item it (the warps past H do nothing)."""
    e = items[it, 0]
    r0 = items[it, 1]
    nr = items[it, 2]
    lane = cuda.threadIdx.x & 31
    warp = cuda.threadIdx.x >> 5
    n0 = (cuda.blockIdx.x * (cuda.blockDim.x >> 5) + warp) * 16
    if n0 < down.shape[1]:
        _down_rows(hhi, hlo, down, order, wts, y, e, r0, nr, n0, lane)


@cuda.jit(device=True, inline=True)
def _down_rows(hhi, hlo, down, order, wts, y, e, r0, nr, n0, lane):
    """One warp: y rows of the item's pairs at output rows n0 .. n0 + 15."""
    g = lane >> 2
    c = lane & 3
    hid = down.shape[1]
    inter = down.shape[2]
    rw0 = (e * hid + n0 + g) * inter + 8 * c
    rw1 = rw0 + 8 * inter
    ho0 = (r0 + min(g, nr - 1)) * inter + 8 * c
    two = nr > 8
    ho1 = (r0 + min(8 + g, nr - 1)) * inter + 8 * c
    z = float32(0.0)
    acc0 = (z, z, z, z)
    acc1 = (z, z, z, z)
    w0 = cuda.local.array((DN_UNROLL, 4), uint32)
    w1 = cuda.local.array((DN_UNROLL, 4), uint32)
    for s in range(0, inter, 32 * DN_UNROLL):
        for q in range(DN_UNROLL):
            o = s + 32 * q
            w0[q, 0], w0[q, 1], w0[q, 2], w0[q, 3] = ldg_stream_v4_u32(down, rw0 + o)
            w1[q, 0], w1[q, 1], w1[q, 2], w1[q, 3] = ldg_stream_v4_u32(down, rw1 + o)
        for q in range(DN_UNROLL):
            o = s + 32 * q
            a0 = (w0[q, 0], w0[q, 1], w0[q, 2], w0[q, 3])
            a1 = (w1[q, 0], w1[q, 1], w1[q, 2], w1[q, 3])
            acc0 = _mma2(a0, a1, ldg_stream_v4_u32(hhi, ho0 + o), ldg_stream_v4_u32(hlo, ho0 + o), acc0)
            if two:
                acc1 = _mma2(a0, a1, ldg_stream_v4_u32(hhi, ho1 + o), ldg_stream_v4_u32(hlo, ho1 + o), acc1)
    for jj in range(2):
        col = 2 * c + jj
        if col < nr:
            p = order[r0 + col]
            wv = wts[p]
            y[p, n0 + g] = wv * acc0[jj]
            y[p, n0 + g + 8] = wv * acc0[2 + jj]
        col += 8
        if col < nr:
            p = order[r0 + col]
            wv = wts[p]
            y[p, n0 + g] = wv * acc1[jj]
            y[p, n0 + g + 8] = wv * acc1[2 + jj]


@kernel((f32_2, i32_2, i32, f32_2, i32))
def moe_rows_combine_kernel(y, ids, n_exp, out, accumulate):
    """See the module doc, step 4. grid (ceil(H / COMBINE_THREADS), T)."""
    t = cuda.blockIdx.y
    n = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if n >= out.shape[1]:
        return
    _combine_one(y, ids, n_exp, out, accumulate, t, n)


@cuda.jit(device=True, inline=True)
def _combine_one(y, ids, n_exp, out, accumulate, t, n):
    n_slots = ids.shape[1]
    acc = float32(0.0)
    for s in range(n_slots):
        e = ids[t, s]
        if 0 <= e < n_exp:
            acc += y[t * n_slots + s, n]
    out[t, n] = acc + (out[t, n] if accumulate != 0 else float32(0.0))
