"""Grouped-by-expert MoE for prefill: sort the routed (token, slot) pairs by expert on the device,
then run each expert's SwiGLU MLP as a tiled GEMM over its rows, so every expert's weights are
streamed once per 64-row tile instead of once per routed pair.

`CudaOps.moe_experts` takes this path for T >= GROUPED_MIN_T (and always under the simulator);
smaller T (decode, short verify batches) keeps the per-pair GEMV kernels of kernels/moe.py.

Pairs: p = t * k + s for token t, slot s (ids/weights flattened, [P = T*k]).

Routing bookkeeping (no host round trip, no atomics, deterministic and stable):
1. `moe_hist_kernel`, grid C = ceil(P / SORT_CHUNK), block SORT_THREADS: chunk c of the pairs is
   staged in shared memory; hist[c, e] = number of pairs of expert e in the chunk (one thread
   per expert walks the chunk; broadcast shared reads).
2. `moe_scan_kernel`, grid 1, block SORT_THREADS: per expert, an exclusive scan of hist[:, e]
   over the chunks (in place), giving count[e]; then block scans over the experts:
   offs[e] = sum of count[<e] (row offsets, offs[E] = P) and tile_off[e] = sum of
   ceil(count[<e] / BM) (row-tile offsets, tile_off[E] = number of row tiles).
3. `moe_scatter_kernel`, grid C, block SORT_THREADS: the thread owning expert e walks chunk c in
   pair order and writes order[offs[e] + hist[c, e] + n] = p for its n-th match. `order` [P] is
   the expert-sorted pair list, stable (increasing p, i.e. token order) within an expert.
   Ids outside [0, E) are dropped here and count as zero in the combine.

Grouped GEMMs (plain SIMT, simulator-safe; the tile walk of linear.gemm_kernel):
4. `moe_grouped_gate_up_kernel`, grid (ceil(I / BN), max_row_tiles(P, E)), block 256.
   Block (bx, by): if by >= tile_off[E] it exits at once; else a binary search of tile_off
   finds the expert e with tile_off[e] <= by < tile_off[e + 1] and rows
   [offs[e] + (by - tile_off[e]) * BM, offs[e + 1]) of the sorted list, at most BM = 64.
   No host knowledge of the counts is needed: max_row_tiles(P, E) =
   min(P, (P + min(E, P) * (BM - 1)) // BM) bounds sum_e ceil(count[e] / BM) for any routing.
   The A tile gathers x[order[r] // k] rows; the B tiles are rows j0.. (gate) and I + j0..
   (up) of gate_up[e], widened bf16 -> fp32 into shared memory.
   BK = 16; each thread holds 4 x 4 gate and 4 x 4 up accumulators (rows 4*ty + i, columns
   tx + 16*j). Epilogue: h[r, j] = silu(gate) * up (gate rows first in gate_up, as in
   ops/cpu.swiglu), h [P, I] in expert-sorted row order.
5. `moe_grouped_down_kernel`, grid (ceil(H / BN), max_row_tiles), block 256, same schedule:
   A tile = contiguous rows of h, B tile = rows n0.. of down[e]; epilogue
   y[p, n] = weights[p] * (h[r] . down[e, n]) written at the pair's own row p = order[r].
6. `moe_combine_kernel`, grid (ceil(H / 256), T), block 256:
   out[t, n] = sum over s = 0..k-1, in slot order, of y[t*k + s, n]. No atomics anywhere, so the
   result is bitwise reproducible run to run (it differs from ops/cpu.moe_experts only by fp32
   summation order).
Both GEMMs prefetch the next k-tile into registers before computing on the current one, and a
warp whose 8 rows are all past the expert's last row skips the FMAs (it still loads and syncs),
so the arithmetic follows the real row count rounded up to 8, not to 64.

Scratch (from the per-step arena; CudaOps releases it again after the combine, see there):
hist [C, E] i32, offs / tile_off [E + 1] i32, order [P] i32, h [P, I] f32, y [P, H] f32.

Expected cost at the Qwen3.6-35B-A3B shape (H 2048, E 256, k 8, I 512, bf16 experts:
6.29 MB per expert, 1.61 GB per layer), 2048-token prefill chunk (P = 16384):
* Today (per-pair kernels): every pair streams its expert: 16384 x 6.29 MB = 103 GB of weight
  reads per layer (~64 reads of each expert), far beyond L2 reuse.
* Grouped: each expert's weights are read once per row tile it owns (GEMM 4 reads all of
  gate_up[e] across its column tiles, GEMM 5 all of down[e]): sum_e ceil(count[e] / 64) x
  6.29 MB. Uniform routing (~64 +- 8 rows per expert, ~1.5 tiles) ~2.4 GB; worst case
  (max_row_tiles = 508 tiles) 3.2 GB; i.e. ~32-43x fewer weight bytes. Activations: x rows are
  re-read once per gate_up column tile (8 x 128 MB) and h rows once per down column tile
  (32 x 32 MB), mostly from L2 since a row tile's column blocks run together; y is 128 MB
  written and read once.
* Arithmetic: 2 x P x 3 x I x H = 103 GFLOP per layer (+ padding to 8 rows per tile) on fp32
  CUDA cores, so this SIMT version is expected to be compute-bound; the tensor-core version
  below removes that. Simulator-verified only: not timed on a GPU yet, and GROUPED_MIN_T is an
  untuned estimate (per-pair cost grows ~linearly with T, grouped cost starts at roughly one
  read of every touched expert; they cross near k * T ~ 2 E at this shape).

Tensor-core (mma.sync) version, later: keep steps 1-3, the tile schedule (tile_off binary
search -> expert, row range) and the combine; replace the two GEMM bodies with the
gemm_mma.py main loop (m16n8k16 bf16, fp32 accumulate, cp.async ring, swizzled ldmatrix):
x converted to bf16 once (f32_to_bf16_kernel), the A-tile loader gathering 16-byte chunks of
rows order[r] // k (padded rows clamped to the last real row, never stored); the B tile holding
gate rows j0.. and up rows I + j0.. so each warp keeps gate and up accumulators of the same
columns and SwiGLU stays in the register epilogue; h stored as bf16 (the A operand of the down
GEMM, contiguous rows; tests then compare against bf16-rounded activations, as test_linear
does); the down epilogue scaling by the routing weight and storing y rows by pair id
unchanged. BM stays 64 (about the mean rows per expert at T = 2048); warps whose MMA rows are
all padding skip their MMAs as here.
"""
from __future__ import annotations

import math

from numba import cuda, float32, int32

from ninfer_nb.kernels.bf16 import widen
from ninfer_nb.kernels.nbtypes import f32_1, f32_2, i32, i32_1, i32_2, u16_3
from ninfer_nb.kernels.registry import kernel

GROUPED_MIN_T = 64      # CudaOps.moe_experts: grouped path for T >= this (untuned, see above)
SORT_CHUNK = 1024       # pairs per block in the hist / scatter kernels
SORT_THREADS = 256      # block of the hist / scan / scatter kernels (power of two)
COMBINE_THREADS = 256
BM = 64                 # rows (routed pairs of one expert) per tile
BN = 64                 # output columns per tile
BK = 16
THREADS = 256           # GEMM block: 16 x 16 threads, 4 x 4 micro-tile each
BMP = BM + 4            # padded shared-tile pitch
BNP = BN + 4


def max_row_tiles(n_pairs: int, n_exp: int) -> int:
    """Upper bound of sum_e ceil(count[e] / BM) over any routing of n_pairs pairs: at most
    n_used = min(E, P) experts own rows, each tile has a row, and
    sum ceil(c / BM) <= (P + n_used * (BM - 1)) / BM."""
    n_used = min(n_exp, n_pairs)
    return min(n_pairs, (n_pairs + n_used * (BM - 1)) // BM)


# ------------------------------------------------------------------ routing bookkeeping
@kernel((i32_1, i32_2))
def moe_hist_kernel(ids, hist):
    """grid C, block SORT_THREADS. ids [P] (flattened [T, k]); hist [C, E]: pairs per chunk, expert."""
    ids_s = cuda.shared.array(SORT_CHUNK, int32)
    tid = cuda.threadIdx.x
    nthr = cuda.blockDim.x
    c = cuda.blockIdx.x
    n_exp = hist.shape[1]
    p0 = c * SORT_CHUNK
    n = min(SORT_CHUNK, ids.shape[0] - p0)
    for i in range(tid, n, nthr):
        ids_s[i] = ids[p0 + i]
    cuda.syncthreads()
    for e in range(tid, n_exp, nthr):
        cnt = 0
        for i in range(n):
            if ids_s[i] == e:
                cnt += 1
        hist[c, e] = cnt


@kernel((i32_2, i32_1, i32_1))
def moe_scan_kernel(hist, offs, tile_off):
    """grid 1, block SORT_THREADS. hist [C, E] -> per-expert exclusive prefix over chunks (in
    place); offs [E + 1] row offsets, tile_off [E + 1] BM-row-tile offsets."""
    s_r = cuda.shared.array(SORT_THREADS, int32)
    s_t = cuda.shared.array(SORT_THREADS, int32)
    tid = cuda.threadIdx.x
    nthr = cuda.blockDim.x
    n_chunks = hist.shape[0]
    n_exp = hist.shape[1]
    carry_r = 0
    carry_t = 0
    for base in range(0, n_exp, nthr):
        e = base + tid
        cnt = 0
        if e < n_exp:
            for c in range(n_chunks):
                v = hist[c, e]
                hist[c, e] = cnt
                cnt += v
        til = (cnt + BM - 1) // BM
        s_r[tid] = cnt
        s_t[tid] = til
        cuda.syncthreads()
        off = 1
        while off < nthr:                       # Hillis-Steele inclusive scan
            vr = 0
            vt = 0
            if tid >= off:
                vr = s_r[tid - off]
                vt = s_t[tid - off]
            cuda.syncthreads()
            s_r[tid] += vr
            s_t[tid] += vt
            cuda.syncthreads()
            off *= 2
        if e < n_exp:
            offs[e] = carry_r + s_r[tid] - cnt
            tile_off[e] = carry_t + s_t[tid] - til
        carry_r += s_r[nthr - 1]
        carry_t += s_t[nthr - 1]
        cuda.syncthreads()
    if tid == 0:
        offs[n_exp] = carry_r
        tile_off[n_exp] = carry_t


@kernel((i32_1, i32_2, i32_1, i32_1))
def moe_scatter_kernel(ids, hist, offs, order):
    """grid C, block SORT_THREADS. order[offs[e] + hist[c, e] + n] = p (n-th pair of e in chunk c)."""
    ids_s = cuda.shared.array(SORT_CHUNK, int32)
    tid = cuda.threadIdx.x
    nthr = cuda.blockDim.x
    c = cuda.blockIdx.x
    n_exp = hist.shape[1]
    p0 = c * SORT_CHUNK
    n = min(SORT_CHUNK, ids.shape[0] - p0)
    for i in range(tid, n, nthr):
        ids_s[i] = ids[p0 + i]
    cuda.syncthreads()
    for e in range(tid, n_exp, nthr):
        pos = offs[e] + hist[c, e]
        for i in range(n):
            if ids_s[i] == e:
                order[pos] = p0 + i
                pos += 1


@cuda.jit(device=True)
def _find_tile(tile_off, tile):
    """Expert e with tile_off[e] <= tile < tile_off[e + 1] (tile < tile_off[E])."""
    lo = 0
    hi = tile_off.shape[0] - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if tile_off[mid] <= tile:
            lo = mid
        else:
            hi = mid
    return lo


# ------------------------------------------------------------------ grouped GEMMs
@kernel((f32_2, i32_1, i32_1, i32_1, u16_3, f32_2, i32), launch_bounds=(256, 2))
def moe_grouped_gate_up_kernel(x, order, offs, tile_off, gate_up, h, top_k):
    """grid (ceil(I / BN), max_row_tiles), block 256. x [T, H]; order [P]; gate_up [E, 2I, H];
    h [P, I] (expert-sorted rows) = silu(x[tok] @ gate^T) * (x[tok] @ up^T)."""
    a_s = cuda.shared.array((BK, BMP), float32)
    g_s = cuda.shared.array((BK, BNP), float32)
    u_s = cuda.shared.array((BK, BNP), float32)
    tok_s = cuda.shared.array(BM, int32)
    acc_g = cuda.local.array((4, 4), float32)
    acc_u = cuda.local.array((4, 4), float32)
    ra = cuda.local.array(4, float32)
    rg = cuda.local.array(4, float32)
    ru = cuda.local.array(4, float32)
    n_exp = tile_off.shape[0] - 1
    tile = cuda.blockIdx.y
    if tile >= tile_off[n_exp]:
        return
    e = _find_tile(tile_off, tile)
    m0 = offs[e] + (tile - tile_off[e]) * BM
    n_valid = min(BM, offs[e + 1] - m0)
    tid = cuda.threadIdx.x
    ty = tid // 16
    tx = tid % 16
    j0 = cuda.blockIdx.x * BN
    inter = h.shape[1]
    hid = x.shape[1]
    if tid < BM:
        tok_s[tid] = order[m0 + tid] // top_k if tid < n_valid else -1
    for i in range(4):
        for j in range(4):
            acc_g[i, j] = float32(0.0)
            acc_u[i, j] = float32(0.0)
    cuda.syncthreads()
    active = ty * 4 < n_valid
    # registers hold the k-tile being loaded: thread (ty, tx) loads rows ty + 16 l, column tx
    for l in range(4):
        tk = tok_s[ty + 16 * l]
        ra[l] = x[tk, tx] if (tk >= 0 and tx < hid) else float32(0.0)
        gj = j0 + ty + 16 * l
        ok = gj < inter and tx < hid
        rg[l] = widen(gate_up[e, gj, tx]) if ok else float32(0.0)
        ru[l] = widen(gate_up[e, inter + gj, tx]) if ok else float32(0.0)
    for k0 in range(0, hid, BK):
        for l in range(4):
            a_s[tx, ty + 16 * l] = ra[l]
            g_s[tx, ty + 16 * l] = rg[l]
            u_s[tx, ty + 16 * l] = ru[l]
        cuda.syncthreads()
        gk = k0 + BK + tx
        if k0 + BK < hid:                       # prefetch the next k-tile
            for l in range(4):
                tk = tok_s[ty + 16 * l]
                ra[l] = x[tk, gk] if (tk >= 0 and gk < hid) else float32(0.0)
                gj = j0 + ty + 16 * l
                ok = gj < inter and gk < hid
                rg[l] = widen(gate_up[e, gj, gk]) if ok else float32(0.0)
                ru[l] = widen(gate_up[e, inter + gj, gk]) if ok else float32(0.0)
        if active:
            for kk in range(BK):
                a0 = a_s[kk, ty * 4]
                a1 = a_s[kk, ty * 4 + 1]
                a2 = a_s[kk, ty * 4 + 2]
                a3 = a_s[kk, ty * 4 + 3]
                for j in range(4):
                    bg = g_s[kk, tx + 16 * j]
                    bu = u_s[kk, tx + 16 * j]
                    acc_g[0, j] += a0 * bg
                    acc_g[1, j] += a1 * bg
                    acc_g[2, j] += a2 * bg
                    acc_g[3, j] += a3 * bg
                    acc_u[0, j] += a0 * bu
                    acc_u[1, j] += a1 * bu
                    acc_u[2, j] += a2 * bu
                    acc_u[3, j] += a3 * bu
        cuda.syncthreads()
    for i in range(4):
        r = ty * 4 + i
        if r < n_valid:
            for j in range(4):
                gj = j0 + tx + 16 * j
                if gj < inter:
                    g = acc_g[i, j]
                    h[m0 + r, gj] = (g / (float32(1.0) + math.exp(-g))) * acc_u[i, j]


@kernel((f32_2, i32_1, i32_1, i32_1, f32_1, u16_3, f32_2), launch_bounds=(256, 2))
def moe_grouped_down_kernel(h, order, offs, tile_off, weights, down, y):
    """grid (ceil(H / BN), max_row_tiles), block 256. h [P, I] (expert-sorted); weights [P];
    down [E, H, I]; y [P, H] (pair order): y[order[r]] = weights[order[r]] * h[r] @ down[e]^T."""
    a_s = cuda.shared.array((BK, BMP), float32)
    b_s = cuda.shared.array((BK, BNP), float32)
    pair_s = cuda.shared.array(BM, int32)
    acc = cuda.local.array((4, 4), float32)
    ra = cuda.local.array(4, float32)
    rb = cuda.local.array(4, float32)
    n_exp = tile_off.shape[0] - 1
    tile = cuda.blockIdx.y
    if tile >= tile_off[n_exp]:
        return
    e = _find_tile(tile_off, tile)
    m0 = offs[e] + (tile - tile_off[e]) * BM
    n_valid = min(BM, offs[e + 1] - m0)
    tid = cuda.threadIdx.x
    ty = tid // 16
    tx = tid % 16
    n0 = cuda.blockIdx.x * BN
    hid = y.shape[1]
    inter = h.shape[1]
    if tid < BM:
        pair_s[tid] = order[m0 + tid] if tid < n_valid else -1
    for i in range(4):
        for j in range(4):
            acc[i, j] = float32(0.0)
    active = ty * 4 < n_valid
    for l in range(4):
        r = ty + 16 * l
        ra[l] = h[m0 + r, tx] if (r < n_valid and tx < inter) else float32(0.0)
        gn = n0 + r
        rb[l] = widen(down[e, gn, tx]) if (gn < hid and tx < inter) else float32(0.0)
    for k0 in range(0, inter, BK):
        for l in range(4):
            a_s[tx, ty + 16 * l] = ra[l]
            b_s[tx, ty + 16 * l] = rb[l]
        cuda.syncthreads()
        gk = k0 + BK + tx
        if k0 + BK < inter:                     # prefetch the next k-tile
            for l in range(4):
                r = ty + 16 * l
                ra[l] = h[m0 + r, gk] if (r < n_valid and gk < inter) else float32(0.0)
                gn = n0 + r
                rb[l] = widen(down[e, gn, gk]) if (gn < hid and gk < inter) else float32(0.0)
        if active:
            for kk in range(BK):
                a0 = a_s[kk, ty * 4]
                a1 = a_s[kk, ty * 4 + 1]
                a2 = a_s[kk, ty * 4 + 2]
                a3 = a_s[kk, ty * 4 + 3]
                for j in range(4):
                    b = b_s[kk, tx + 16 * j]
                    acc[0, j] += a0 * b
                    acc[1, j] += a1 * b
                    acc[2, j] += a2 * b
                    acc[3, j] += a3 * b
        cuda.syncthreads()
    for i in range(4):
        r = ty * 4 + i
        if r < n_valid:
            p = pair_s[r]
            wp = weights[p]
            for j in range(4):
                gn = n0 + tx + 16 * j
                if gn < hid:
                    y[p, gn] = wp * acc[i, j]


@kernel((f32_2, i32_1, i32, f32_2))
def moe_combine_kernel(y, ids, n_exp, out):
    """grid (ceil(H / 256), T), block 256. out[t, n] = sum_s y[t*k + s, n], slots in order
    (pairs with an id outside [0, E) contribute 0)."""
    t = cuda.blockIdx.y
    n = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    hid = out.shape[1]
    if n >= hid:
        return
    top_k = ids.shape[0] // out.shape[0]
    acc = float32(0.0)
    for s in range(top_k):
        p = t * top_k + s
        e = ids[p]
        if e >= 0 and e < n_exp:
            acc += y[p, n]
    out[t, n] = acc
