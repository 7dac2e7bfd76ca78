"""Grouped-by-expert MoE for prefill: sort the routed (token, slot) pairs by expert on the device,
then run each expert's SwiGLU MLP as a tiled GEMM over its rows, so every expert's weights are
streamed once per 64-row tile instead of once per routed pair.

`CudaOps.moe_experts` takes this path for T >= GROUPED_MIN_T (and always under the simulator);
smaller T: one token keeps the per-pair GEMV kernels of kernels/moe/moe.py, 2 .. GROUPED_MIN_T - 1
(batched decode rounds, verify batches) take kernels/moe/moe_rows.py.
From MOE_PIPELINED_MIN_PAIRS routed pairs up (ops/cuda/moe.py) the bookkeeping below stays and the
GEMMs 4-5 are replaced by kernels/moe/moe_pipelined.py (twice as fast at a 35B prefill chunk).

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

Grouped GEMMs (tensor cores: mma.sync.m16n8k16.row.col, bf16 operands, fp32 accumulate):
4. `moe_grouped_gate_up_kernel`, grid (ceil(I / BN_GU), max_row_tiles(P, E)), block 256.
   Block (bx, by): if by >= tile_off[E] it exits at once; else a binary search of tile_off
   finds the expert e with tile_off[e] <= by < tile_off[e + 1] and rows
   [offs[e] + (by - tile_off[e]) * BM, offs[e + 1]) of the sorted list, at most BM = 64.
   No host knowledge of the counts is needed: max_row_tiles(P, E) =
   min(P, (P + min(E, P) * (BM - 1)) // BM) bounds sum_e ceil(count[e] / BM) for any routing.
   A stage: the gathered rows x[order[r] // k] (fp32), rounded to bf16 (RNE, pack_bf16x2) while
   staged, as packed bf16x2 words; B stage: 128 rows = gate rows j0.. j0+63 and up rows
   I + j0.. of gate_up[e] (bf16 words as stored). Warp (wm, wn) of the 2 x 4 warps owns rows
   32 wm.. and gate columns 16 wn.. plus the *same* up columns: 2 m16 x (2 gate + 2 up) n8
   tiles, so SwiGLU stays in the register epilogue: h[r, j] = silu(gate) * up (gate rows first
   in gate_up, as ops/cpu.swiglu), stored as bf16 (one bf16x2 word per lane and row).
   h [P, I] bf16, expert-sorted rows: half the bytes of fp32, and directly the A operand of 5.
5. `moe_grouped_down_kernel`, grid (ceil(H / BN_DN), max_row_tiles), block 256, same schedule:
   A stage = contiguous bf16 rows of h, B stage = rows n0.. n0+127 of down[e]; warp (wm, wn)
   owns rows 32 wm.., columns 32 wn.. (2 m16 x 4 n8 tiles); epilogue
   y[p, n] = weights[p] * (h[r] . down[e, n]) in fp32 at the pair's own row p = order[r].
   Both GEMMs: BK = 32 (16 words per stage row), shared row pitch 20 words, so the 8 rows x 4
   words of every fragment load hit 32 distinct banks; fragments are plain 32-bit shared loads
   in the PTX layout (no ldmatrix, no cp.async: simulator-safe, ptx_sim emulates mma_bf16).
   Two stages, register-staged prefetch: iteration kt issues the global loads of k-tile kt
   (each thread: one A row x 4 words, one B row x 8 words), runs the 2 x 8 MMAs of k-tile
   kt - 1, then stores its registers into the other stage; one __syncthreads per k-tile.
   Warp-uniform skips: a warp whose 32 rows are all padding (past the expert's last row) or
   whose columns are all past I / H does no MMAs, nor does its second m16 tile when its 16
   rows are padding, so the MMA work follows the real row count rounded up to 16. Padding rows
   are staged as zeros and never stored. H and I must be even (bf16x2 words; checked by
   CudaOps); other raggedness (K % 32, N % tile, rows % 64) is handled by predication.
   Shared memory, static: A 2 x 64 x 20 x 4 B = 10 KB, B 2 x 128 x 20 x 4 B = 20 KB, + 256 B of
   token / pair ids = 30.25 KB per block (< 48 KB, no opt-in). ptxas (sm_90a): gate_up 126,
   down 128 registers under launch_bounds (256, 2), no spills (tests/kernels/test_ptxas.py
   NO_SPILL), so 2 blocks = 16 warps per SM (register-limited).
6. `moe_combine_kernel`, grid (ceil(H / 256), T), block 256:
   out[t, n] = sum over s = 0..k-1, in slot order, of y[t*k + s, n]. No atomics anywhere, so the
   result is bitwise reproducible run to run (it differs from ops/cpu.moe_experts only by fp32
   summation order).
Scratch (from the per-step arena; CudaOps releases it again after the combine, see there):
hist [C, E] i32, offs / tile_off [E + 1] i32, order [P] i32, h [P, I] bf16, y [P, H] f32.

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
* Arithmetic: 2 x P x 3 x I x H = 103 GFLOP per layer, plus the padding to 16 rows per tile
  (~8 rows x ~257 tiles x 2 GEMMs, ~+10 %), on the tensor cores. Per block and k-tile each warp
  issues 16 MMAs (65.5 kFLOP) against 16 32-bit fragment loads, and each thread loads 12
  global words and stores 12 shared words: the loads are plain 4-byte LDG/LDS (no
  ldmatrix / cp.async, to stay simulator-checkable), so it runs well under gemm_mma.py's rate;
  from MOE_PIPELINED_MIN_PAIRS routed pairs CudaOps takes moe_pipelined.py / moe_wgmma.py.
  Numerics: x and h are rounded to bf16 (relative ~2^-9 each), accumulation is fp32; tests
  compare against ops.cpu on bf16-rounded x and h (sim_cases._moe_ref_bf16).
* tests/kernels/test_kernels_gpu.py::test_moe_grouped_mma checks it against the bf16-operand
  reference at 2e-3. GROUPED_MIN_T is an untuned estimate
  (per-pair cost grows ~linearly with T, grouped cost starts at roughly one read of every
  touched expert; they cross near k * T ~ 2 E at this shape).

Possible next steps (GPU-only, not simulator-checkable): cp.async 16-byte staging of the B
tiles (and of A once x is bf16), ldmatrix.x4 fragment loads with a swizzle instead of the
padded pitch, a third stage, and a 128-row tile for hot experts.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int32, uint32

from ninfer_nb.kernels.common.nbtypes import (
    f32_1,
    f32_2,
    i32,
    i32_1,
    i32_2,
    u16_2,
    u16_3,
)
from ninfer_nb.kernels.common.ptx import mma_bf16, pack_bf16x2
from ninfer_nb.kernels.common.registry import kernel

GROUPED_MIN_T = 64      # CudaOps.moe_experts: grouped path for T >= this (untuned, see above)
SORT_CHUNK = 1024       # pairs per block in the hist / scatter kernels
SORT_THREADS = 256      # block of the hist / scan / scatter kernels (power of two)
COMBINE_THREADS = 256
BM = 64                 # rows (routed pairs of one expert) per tile
BN_GU = 64              # gate_up: I columns per tile (B stage = 64 gate + 64 up rows)
BN_DN = 128             # down: H columns per tile
NB = 128                # B stage rows in both GEMMs
BK = 32                 # k per stage (bf16)
KW = BK // 2            # packed bf16x2 words per stage row
PITCH = KW + 4          # shared row pitch in words: conflict-free fragment loads
THREADS = 256           # GEMM block: 8 warps as 2 (M) x 4 (N), warp tile 32 x 32
A_LD = BM * KW // THREADS       # words of the A stage each thread loads (4)
B_LD = NB * KW // THREADS       # words of the B stage each thread loads (8)


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


@cuda.jit(device=True)
def _expert_rows(offs, tile_off, tile, bm):
    """Row tile `tile` (< tile_off[E]) of bm-row tiles -> (expert e, its first sorted row, the
    expert's last sorted row): the tile owns rows row0 .. min(row0 + bm, last + 1) - 1."""
    e = _find_tile(tile_off, tile)
    return e, offs[e] + (tile - tile_off[e]) * bm, offs[e + 1] - 1


# ------------------------------------------------------------------ grouped GEMMs (mma.sync)
@cuda.jit(device=True)
def _silu(v):
    return v / (float32(1.0) + math.exp(-v))


@cuda.jit(device=True)
def _warp_k16(a_s, b_s, buf, ra, rb0, rb1, kw, g, t, m1, c00, c01, c02, c03, c10, c11, c12, c13):
    """One k16 step of a warp's 32 x 32 tile: A rows ra.. ra+31 (two m16 tiles), B rows (output
    columns) rb0.. rb0+15 and rb1.. rb1+15 (four n8 tiles), packed words kw.. kw+7 of the stage.
    Fragments by plain 32-bit shared loads, lane = 4g + t (PTX m16n8k16 layout): A word
    (row g / g+8, word t / t+4), B word (row g, word t / t+4). c<m><n>: m16 tile m, n8 tile n.
    m1 (warp-uniform): the second m16 tile has a real row (else its MMAs are skipped)."""
    a0 = (a_s[buf, ra + g, kw + t], a_s[buf, ra + g + 8, kw + t],
          a_s[buf, ra + g, kw + t + 4], a_s[buf, ra + g + 8, kw + t + 4])
    p0 = b_s[buf, rb0 + g, kw + t]
    p1 = b_s[buf, rb0 + g, kw + t + 4]
    q0 = b_s[buf, rb0 + g + 8, kw + t]
    q1 = b_s[buf, rb0 + g + 8, kw + t + 4]
    r0 = b_s[buf, rb1 + g, kw + t]
    r1 = b_s[buf, rb1 + g, kw + t + 4]
    s0 = b_s[buf, rb1 + g + 8, kw + t]
    s1 = b_s[buf, rb1 + g + 8, kw + t + 4]
    c00 = mma_bf16(a0, p0, p1, c00)
    c01 = mma_bf16(a0, q0, q1, c01)
    c02 = mma_bf16(a0, r0, r1, c02)
    c03 = mma_bf16(a0, s0, s1, c03)
    if m1:
        a1 = (a_s[buf, ra + g + 16, kw + t], a_s[buf, ra + g + 24, kw + t],
              a_s[buf, ra + g + 16, kw + t + 4], a_s[buf, ra + g + 24, kw + t + 4])
        c10 = mma_bf16(a1, p0, p1, c10)
        c11 = mma_bf16(a1, q0, q1, c11)
        c12 = mma_bf16(a1, r0, r1, c12)
        c13 = mma_bf16(a1, s0, s1, c13)
    return c00, c01, c02, c03, c10, c11, c12, c13


@cuda.jit(device=True)
def _store_h(h32, m0, r, n_valid, col, inter, cg, cu, half):
    """h[m0 + r, col], h[.., col + 1] = silu(gate) * up as one bf16x2 word (col even)."""
    if r < n_valid and col < inter:
        h32[m0 + r, col // 2] = pack_bf16x2(_silu(cg[2 * half + 1]) * cu[2 * half + 1],
                                            _silu(cg[2 * half]) * cu[2 * half])


@cuda.jit(device=True)
def _store_y(y, p, wp, col, hid, c, half):
    if col < hid:
        y[p, col] = wp * c[2 * half]
        y[p, col + 1] = wp * c[2 * half + 1]


@kernel((f32_2, i32_1, i32_1, i32_1, u16_3, u16_2, i32), launch_bounds=(THREADS, 2))
def moe_grouped_gate_up_kernel(x, order, offs, tile_off, gate_up, h, top_k):
    """grid (ceil(I / BN_GU), max_row_tiles), block THREADS. x [T, H] fp32; order [P];
    gate_up [E, 2I, H] bf16; h [P, I] bf16 (expert-sorted rows) = silu(x[tok] @ gate^T) * (x[tok] @ up^T).
    H and I even (packed bf16 pairs)."""
    a_s = cuda.shared.array((2, BM, PITCH), uint32)
    b_s = cuda.shared.array((2, NB, PITCH), uint32)
    tok_s = cuda.shared.array(BM, int32)
    ra = cuda.local.array(A_LD, uint32)
    rb = cuda.local.array(B_LD, uint32)
    n_exp = tile_off.shape[0] - 1
    tile = cuda.blockIdx.y
    if tile >= tile_off[n_exp]:
        return
    e = _find_tile(tile_off, tile)
    m0 = offs[e] + (tile - tile_off[e]) * BM
    n_valid = min(BM, offs[e + 1] - m0)
    w32 = gate_up.view(np.uint32)              # [E, 2I, H/2]: word = (k even, k + 1) bf16 pair
    h32 = h.view(np.uint32)                    # [P, I/2]
    tid = cuda.threadIdx.x
    lane = tid % 32
    g = lane >> 2
    t = lane & 3
    wm = (tid // 32) // 4                      # warp rows 32 wm.. (2 x 4 warps)
    wn = (tid // 32) % 4                       # warp gate / up columns 16 wn..
    ar = tid // (KW // A_LD)                   # loader: A stage row ar, words aw.. aw + A_LD - 1
    aw = (tid % (KW // A_LD)) * A_LD
    br = tid // (KW // B_LD)                   # B stage row br, words bw.. bw + B_LD - 1
    bw = (tid % (KW // B_LD)) * B_LD
    j0 = cuda.blockIdx.x * BN_GU
    inter = h.shape[1]
    hw = x.shape[1] // 2
    if tid < BM:
        tok_s[tid] = order[m0 + tid] // top_k if tid < n_valid else -1
    cuda.syncthreads()
    # warp-uniform skips: a warp whose rows are all padding, or whose columns are all past I,
    # does no MMAs; nor does its second m16 tile when that is all padding
    active = wm * 32 < n_valid and j0 + 16 * wn < inter
    m1 = wm * 32 + 16 < n_valid
    z = (float32(0.0), float32(0.0), float32(0.0), float32(0.0))
    c00 = c01 = c02 = c03 = c10 = c11 = c12 = c13 = z
    tk = tok_s[ar]
    gj = j0 + br % BN_GU                       # B stage rows 0..63: gate j0.., 64..127: up j0..
    src = gj + (inter if br >= BN_GU else 0)
    b_ok = gj < inter
    n_kt = (hw + KW - 1) // KW
    for kt in range(n_kt + 1):                 # kt loads k-tile kt (regs -> stage kt & 1), computes kt - 1
        if kt < n_kt:
            for l in range(A_LD):
                kw = kt * KW + aw + l
                ra[l] = pack_bf16x2(x[tk, 2 * kw + 1], x[tk, 2 * kw]) if (tk >= 0 and kw < hw) else uint32(0)
            for l in range(B_LD):
                kw = kt * KW + bw + l
                rb[l] = w32[e, src, kw] if (b_ok and kw < hw) else uint32(0)
        if kt > 0 and active:
            buf = (kt - 1) & 1
            c00, c01, c02, c03, c10, c11, c12, c13 = _warp_k16(
                a_s, b_s, buf, 32 * wm, 16 * wn, BN_GU + 16 * wn, 0, g, t, m1, c00, c01, c02, c03, c10, c11, c12, c13)
            c00, c01, c02, c03, c10, c11, c12, c13 = _warp_k16(
                a_s, b_s, buf, 32 * wm, 16 * wn, BN_GU + 16 * wn, 8, g, t, m1, c00, c01, c02, c03, c10, c11, c12, c13)
        if kt < n_kt:
            buf = kt & 1
            for l in range(A_LD):
                a_s[buf, ar, aw + l] = ra[l]
            for l in range(B_LD):
                b_s[buf, br, bw + l] = rb[l]
        cuda.syncthreads()
    if active:
        col = j0 + 16 * wn + 2 * t
        for half in range(2):
            r = 32 * wm + g + 8 * half
            _store_h(h32, m0, r, n_valid, col, inter, c00, c02, half)
            _store_h(h32, m0, r, n_valid, col + 8, inter, c01, c03, half)
            _store_h(h32, m0, r + 16, n_valid, col, inter, c10, c12, half)
            _store_h(h32, m0, r + 16, n_valid, col + 8, inter, c11, c13, half)


@kernel((u16_2, i32_1, i32_1, i32_1, f32_1, u16_3, f32_2), launch_bounds=(THREADS, 2))
def moe_grouped_down_kernel(h, order, offs, tile_off, weights, down, y):
    """grid (ceil(H / BN_DN), max_row_tiles), block THREADS. h [P, I] bf16 (expert-sorted);
    weights [P]; down [E, H, I] bf16; y [P, H] fp32 (pair order):
    y[order[r]] = weights[order[r]] * h[r] @ down[e]^T. I and H even."""
    a_s = cuda.shared.array((2, BM, PITCH), uint32)
    b_s = cuda.shared.array((2, NB, PITCH), uint32)
    pair_s = cuda.shared.array(BM, int32)
    ra = cuda.local.array(A_LD, uint32)
    rb = cuda.local.array(B_LD, uint32)
    n_exp = tile_off.shape[0] - 1
    tile = cuda.blockIdx.y
    if tile >= tile_off[n_exp]:
        return
    e = _find_tile(tile_off, tile)
    m0 = offs[e] + (tile - tile_off[e]) * BM
    n_valid = min(BM, offs[e + 1] - m0)
    h32 = h.view(np.uint32)                    # [P, I/2]
    d32 = down.view(np.uint32)                 # [E, H, I/2]
    tid = cuda.threadIdx.x
    lane = tid % 32
    g = lane >> 2
    t = lane & 3
    wm = (tid // 32) // 4                      # warp rows 32 wm.. (2 x 4 warps)
    wn = (tid // 32) % 4                       # warp columns 32 wn..
    ar = tid // (KW // A_LD)                   # loader rows / words as in gate_up
    aw = (tid % (KW // A_LD)) * A_LD
    br = tid // (KW // B_LD)
    bw = (tid % (KW // B_LD)) * B_LD
    n0 = cuda.blockIdx.x * BN_DN
    hid = y.shape[1]
    iw = h.shape[1] // 2
    if tid < BM:
        pair_s[tid] = order[m0 + tid] if tid < n_valid else -1
    active = wm * 32 < n_valid and n0 + 32 * wn < hid     # warp-uniform skips, as in gate_up
    m1 = wm * 32 + 16 < n_valid
    z = (float32(0.0), float32(0.0), float32(0.0), float32(0.0))
    c00 = c01 = c02 = c03 = c10 = c11 = c12 = c13 = z
    n_kt = (iw + KW - 1) // KW
    a_ok = ar < n_valid
    gn = n0 + br
    b_ok = gn < hid
    for kt in range(n_kt + 1):
        if kt < n_kt:
            for l in range(A_LD):
                kw = kt * KW + aw + l
                ra[l] = h32[m0 + ar, kw] if (a_ok and kw < iw) else uint32(0)
            for l in range(B_LD):
                kw = kt * KW + bw + l
                rb[l] = d32[e, gn, kw] if (b_ok and kw < iw) else uint32(0)
        if kt > 0 and active:
            buf = (kt - 1) & 1
            c00, c01, c02, c03, c10, c11, c12, c13 = _warp_k16(
                a_s, b_s, buf, 32 * wm, 32 * wn, 32 * wn + 16, 0, g, t, m1, c00, c01, c02, c03, c10, c11, c12, c13)
            c00, c01, c02, c03, c10, c11, c12, c13 = _warp_k16(
                a_s, b_s, buf, 32 * wm, 32 * wn, 32 * wn + 16, 8, g, t, m1, c00, c01, c02, c03, c10, c11, c12, c13)
        if kt < n_kt:
            buf = kt & 1
            for l in range(A_LD):
                a_s[buf, ar, aw + l] = ra[l]
            for l in range(B_LD):
                b_s[buf, br, bw + l] = rb[l]
        cuda.syncthreads()
    if active:
        col = n0 + 32 * wn + 2 * t
        for half in range(2):
            for mi in range(2):
                r = 32 * wm + 16 * mi + g + 8 * half
                if r < n_valid:
                    p = pair_s[r]
                    wp = weights[p]
                    if mi == 0:
                        _store_y(y, p, wp, col, hid, c00, half)
                        _store_y(y, p, wp, col + 8, hid, c01, half)
                        _store_y(y, p, wp, col + 16, hid, c02, half)
                        _store_y(y, p, wp, col + 24, hid, c03, half)
                    else:
                        _store_y(y, p, wp, col, hid, c10, half)
                        _store_y(y, p, wp, col + 8, hid, c11, half)
                        _store_y(y, p, wp, col + 16, hid, c12, half)
                        _store_y(y, p, wp, col + 24, hid, c13, half)


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
