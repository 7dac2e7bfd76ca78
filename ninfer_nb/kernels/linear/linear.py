"""Linear layers y[T, N] = x[T, K] @ W[N, K]^T (+ bias[N]); x, y fp32, W bf16 (uint16) or fp32.

* `gemv_bf16_kernel` (T <= 16, decode; T = 1 goes to gemv_one_token): memory-bound. A warp
  owns 2 weight rows and streams them with 16-byte inline-PTX loads
  (`ld.global.nc.L1::no_allocate.L2::256B.v4`), 4 chunks of 256 columns per row issued
  together (8 loads in flight per lane: 2 in flight left bandwidth unused), 4 tokens per pass,
  fp32 FMA, warp-shuffle reduction.
  `vec = 0` selects a scalar path (K % 8 != 0 or unaligned).
* `gemv_bf16_splitk_kernel` / `gemv_bf16_splitk2_kernel`: the same loop over 4 / 2 K slices
  per row pair, for weights with few, long rows (see the docstring); CudaOps picks them by
  shape for 2-16 tokens (ops/cuda/linear.py SPLITK_*).
* `gemv_bf16_swiglu_kernel`: the MLP's gate_up GEMV with the SwiGLU applied as
  each warp finishes its gate and up row.
* `gemv_one_token(mode, ways, blocks, warps)`: the one-token decode GEMVs (T = 1, the batch-1
  decode step), built per K-split, blocks per SM and warps per block (ops/cuda/linear.py
  one_token_build picks them per shape: blocks of 4 warps for rows longer than 4096, else 8):
  "plain", "normed" (one token of rms_norm(x) * w as input, the norm fused in:
  `_stream_pair_normed` scales x by the norm weight as it is read, sums x^2 over the same
  loads, applies 1 / rms to the dot products at the end: no norm launch) and "swiglu" (the MLP's normed
  gate_up with the SwiGLU applied as each warp finishes its gate and up row).
* All the GEMVs above are `self_sync` kernels: each pass issues its weight loads before
  `grid_dependency_sync()`, so under programmatic dependent launch the first ones overlap
  the previous kernel's tail. They also run in the CUDA simulator, on ptx_sim's stand-ins for
  the 16-byte loads, shuffles and griddepcontrol (tests/kernels/sim_cases.py test_gemv_*).
* `gemm_kernel` (prefill chunks, any dtype of W): 64x64x16 shared-memory tiles, 4x4 per thread.
  CUDA cores only (no tensor cores yet). Simulator-safe.
"""
from __future__ import annotations

import math
from typing import Any

from numba import cuda, float32

from ninfer_nb.kernels.common.bf16 import widen
from ninfer_nb.kernels.common.nbtypes import f32, f32_1, f32_2, i32, u16_2
from ninfer_nb.kernels.common.ptx import (
    as_f32,
    grid_dependency_sync,
    ldg_stream_v4_u32,
    ldg_v4_f32,
)
from ninfer_nb.kernels.common.registry import kernel
from ninfer_nb.kernels.common.warp import warp_sum

GEMV_WARPS = 8
GEMV_ROWS = 2           # weight rows per warp
GEMV_ROWS_PER_BLOCK = GEMV_WARPS * GEMV_ROWS
GEMV_MAX_T = 16
UNROLL = 4              # 256-column chunks per pass of the vectorised GEMV loop
HI = 0xFFFF0000


@cuda.jit(device=True)
def _dot8(w, xa, xb):
    """8 bf16 weights (4 u32 words, element 2j in the low half of word j) . 8 fp32 x values."""
    s = as_f32(w[0] << 16) * xa[0]
    s += as_f32(w[0] & HI) * xa[1]
    s += as_f32(w[1] << 16) * xa[2]
    s += as_f32(w[1] & HI) * xa[3]
    s += as_f32(w[2] << 16) * xb[0]
    s += as_f32(w[2] & HI) * xb[1]
    s += as_f32(w[3] << 16) * xb[2]
    s += as_f32(w[3] & HI) * xb[3]
    return s


@cuda.jit(device=True)
def _chunk(x, xi, k_dim, w0, w1, ok1, ok2, ok3, acc):
    """Add one 8-column chunk of two weight rows (w0, w1) times up to 4 tokens of x (token
    t0 at flat index xi, the next ones k_dim apart) to the 8 accumulators acc[token][row]."""
    a00, a01, a10, a11, a20, a21, a30, a31 = acc
    xa = ldg_v4_f32(x, xi)
    xb = ldg_v4_f32(x, xi + 4)
    a00 += _dot8(w0, xa, xb)
    a01 += _dot8(w1, xa, xb)
    if ok1:
        xi += k_dim
        xa = ldg_v4_f32(x, xi)
        xb = ldg_v4_f32(x, xi + 4)
        a10 += _dot8(w0, xa, xb)
        a11 += _dot8(w1, xa, xb)
    if ok2:
        xi += k_dim
        xa = ldg_v4_f32(x, xi)
        xb = ldg_v4_f32(x, xi + 4)
        a20 += _dot8(w0, xa, xb)
        a21 += _dot8(w1, xa, xb)
    if ok3:
        xi += k_dim
        xa = ldg_v4_f32(x, xi)
        xb = ldg_v4_f32(x, xi + 4)
        a30 += _dot8(w0, xa, xb)
        a31 += _dot8(w1, xa, xb)
    return (a00, a01, a10, a11, a20, a21, a30, a31)


@cuda.jit(device=True, inline=True)
def pass_loads(w, r0, r1, k):
    """One pass's weight loads, issued together: UNROLL (4) chunks of 256 columns of two rows
    (flat offsets r0, r1) at this lane's column k, as (row 0 chunk 0, row 1 chunk 0, row 0
    chunk 1, ...): 8 x 16 bytes in flight per lane."""
    return (ldg_stream_v4_u32(w, r0 + k), ldg_stream_v4_u32(w, r1 + k),
            ldg_stream_v4_u32(w, r0 + k + 256), ldg_stream_v4_u32(w, r1 + k + 256),
            ldg_stream_v4_u32(w, r0 + k + 512), ldg_stream_v4_u32(w, r1 + k + 512),
            ldg_stream_v4_u32(w, r0 + k + 768), ldg_stream_v4_u32(w, r1 + k + 768))


@cuda.jit(device=True)
def _stream_pair(x, w, r0, r1, k, k_end, t0, k_dim, ok1, ok2, ok3, acc):
    """This lane's share of two weight rows (flat offsets r0, r1) times up to 4 tokens of x
    over columns k, k + 256, ... < k_end (k = first column + lane * 8). UNROLL chunks of 256
    columns per pass: all 2 * UNROLL weight loads are issued before any math, so each lane
    keeps 8 x 16 B in flight (latency hiding); then the last < UNROLL chunks, one per round
    trip (issuing them together, predicated, was no faster).
    Each pass calls ptx.grid_dependency_sync() after its weight loads, before the first read of
    x: a kernel registered with self_sync=True thus streams its first weights while the kernel
    before it (which wrote x) finishes; later calls return at once."""
    while k + (UNROLL - 1) * 256 < k_end:
        w00, w10, w01, w11, w02, w12, w03, w13 = pass_loads(w, r0, r1, k)
        grid_dependency_sync()      # x is the previous kernel's output; the weights were not
        xi = t0 * k_dim + k
        acc = _chunk(x, xi, k_dim, w00, w10, ok1, ok2, ok3, acc)
        acc = _chunk(x, xi + 256, k_dim, w01, w11, ok1, ok2, ok3, acc)
        acc = _chunk(x, xi + 512, k_dim, w02, w12, ok1, ok2, ok3, acc)
        acc = _chunk(x, xi + 768, k_dim, w03, w13, ok1, ok2, ok3, acc)
        k += UNROLL * 256
    while k < k_end:
        w00 = ldg_stream_v4_u32(w, r0 + k)
        w10 = ldg_stream_v4_u32(w, r1 + k)
        grid_dependency_sync()
        acc = _chunk(x, t0 * k_dim + k, k_dim, w00, w10, ok1, ok2, ok3, acc)
        k += 256
    grid_dependency_sync()          # a lane with no columns has waited too (returns at once)
    return acc


@cuda.jit(device=True, inline=True)
def _normed8(x, xi, nw, ki):
    """x[xi : xi + 8] * nw[ki : ki + 8] (the norm weight) as two 4-tuples, and the sum of squares
    of the raw x[xi : xi + 8] (the norm's statistic, accumulated alongside the dot products)."""
    xa = ldg_v4_f32(x, xi)
    xb = ldg_v4_f32(x, xi + 4)
    na = ldg_v4_f32(nw, ki)
    nb = ldg_v4_f32(nw, ki + 4)
    ss = xa[0] * xa[0] + xa[1] * xa[1] + xa[2] * xa[2] + xa[3] * xa[3]
    ss += xb[0] * xb[0] + xb[1] * xb[1] + xb[2] * xb[2] + xb[3] * xb[3]
    ya = (xa[0] * na[0], xa[1] * na[1], xa[2] * na[2], xa[3] * na[3])
    yb = (xb[0] * nb[0], xb[1] * nb[1], xb[2] * nb[2], xb[3] * nb[3])
    return ya, yb, ss


@cuda.jit(device=True)
def _stream_pair_normed(x, xr, nw, w, r0, r1, k, k_end):
    """_stream_pair for one token of a normed input: two weight rows (flat offsets r0, r1) times
    x[xr + j] * nw[j] over this lane's columns j = k, k + 256, ... < k_end. Returns the two
    partial dot products and this lane's partial sum of x^2 over the same columns; a warp that
    covers every column thus has the whole row's statistic (rms_norm(x) . w = (x * nw) . w / rms)."""
    a0 = float32(0.0)
    a1 = float32(0.0)
    ss = float32(0.0)
    while k + (UNROLL - 1) * 256 < k_end:
        w00, w10, w01, w11, w02, w12, w03, w13 = pass_loads(w, r0, r1, k)
        grid_dependency_sync()
        ya, yb, s = _normed8(x, xr + k, nw, k)
        a0 += _dot8(w00, ya, yb)
        a1 += _dot8(w10, ya, yb)
        ss += s
        ya, yb, s = _normed8(x, xr + k + 256, nw, k + 256)
        a0 += _dot8(w01, ya, yb)
        a1 += _dot8(w11, ya, yb)
        ss += s
        ya, yb, s = _normed8(x, xr + k + 512, nw, k + 512)
        a0 += _dot8(w02, ya, yb)
        a1 += _dot8(w12, ya, yb)
        ss += s
        ya, yb, s = _normed8(x, xr + k + 768, nw, k + 768)
        a0 += _dot8(w03, ya, yb)
        a1 += _dot8(w13, ya, yb)
        ss += s
        k += UNROLL * 256
    while k < k_end:
        w00 = ldg_stream_v4_u32(w, r0 + k)
        w10 = ldg_stream_v4_u32(w, r1 + k)
        grid_dependency_sync()
        ya, yb, s = _normed8(x, xr + k, nw, k)
        a0 += _dot8(w00, ya, yb)
        a1 += _dot8(w10, ya, yb)
        ss += s
        k += 256
    grid_dependency_sync()          # a lane with no columns has waited too (returns at once)
    return a0, a1, ss


@cuda.jit(device=True, inline=True)
def k_slice(sl, ways, k_dim):
    """Columns [k_beg, k_end) of slice sl of `ways` K slices: each a multiple of 256 columns
    (the lanes' 8-column chunks), so the last ones may be shorter or empty."""
    k_len = ((k_dim + ways * 256 - 1) // (ways * 256)) * 256
    k_beg = sl * k_len
    return k_beg, min(k_dim, k_beg + k_len)


@cuda.jit(device=True, inline=True)
def inv_rms(ss_warp, k_dim, eps):
    """1 / rms from a warp's partial sums of squares over a whole k_dim-wide row."""
    return float32(1.0) / math.sqrt(warp_sum(ss_warp) / float32(k_dim) + eps)


@cuda.jit(device=True, inline=True)
def normed_pair_dots(x, nw, eps, w, r0, r1, lane, k_dim):
    """(w[r0] . rms_norm(x[0], nw, eps), w[r1] . rms_norm(x[0], nw, eps), 1 / rms) for one
    token, summed over the warp (every lane gets them): the normed GEMVs' row pair."""
    a0, a1, ss = _stream_pair_normed(x, 0, nw, w, r0, r1, lane * 8, k_dim)
    inv = inv_rms(ss, k_dim, eps)
    return warp_sum(a0) * inv, warp_sum(a1) * inv, inv


@kernel((f32_2, u16_2, f32_1, f32_2, i32, i32), sim=True, fastmath=True, launch_bounds=(256, 2),
        self_sync=True)
def gemv_bf16_kernel(x, w, bias, out, has_bias, vec):
    """grid ceil(N / 16), block 256. x [T, K] fp32, w [N, K] bf16, out [T, N] fp32."""
    lane = cuda.threadIdx.x & 31
    warp = cuda.threadIdx.x >> 5
    n_rows = w.shape[0]
    k_dim = w.shape[1]
    n_tok = x.shape[0]
    n0 = (cuda.blockIdx.x * GEMV_WARPS + warp) * GEMV_ROWS
    if n0 >= n_rows:
        return
    has1 = n0 + 1 < n_rows
    n1 = n0 + 1 if has1 else n0
    for t0 in range(0, n_tok, 4):
        a00 = float32(0.0)
        a01 = float32(0.0)
        a10 = float32(0.0)
        a11 = float32(0.0)
        a20 = float32(0.0)
        a21 = float32(0.0)
        a30 = float32(0.0)
        a31 = float32(0.0)
        ok1 = t0 + 1 < n_tok
        ok2 = t0 + 2 < n_tok
        ok3 = t0 + 3 < n_tok
        acc = (a00, a01, a10, a11, a20, a21, a30, a31)
        if vec != 0:
            # r1 = r0 for a lone last row: loaded, never stored
            acc = _stream_pair(x, w, n0 * k_dim, n1 * k_dim, lane * 8, k_dim, t0, k_dim, ok1, ok2, ok3, acc)
            a00, a01, a10, a11, a20, a21, a30, a31 = acc
        else:
            grid_dependency_sync()
            for k in range(lane, k_dim, 32):
                v0 = widen(w[n0, k])
                v1 = widen(w[n1, k])
                xv = x[t0, k]
                a00 += v0 * xv
                a01 += v1 * xv
                if ok1:
                    xv = x[t0 + 1, k]
                    a10 += v0 * xv
                    a11 += v1 * xv
                if ok2:
                    xv = x[t0 + 2, k]
                    a20 += v0 * xv
                    a21 += v1 * xv
                if ok3:
                    xv = x[t0 + 3, k]
                    a30 += v0 * xv
                    a31 += v1 * xv
        a00 = warp_sum(a00)
        a01 = warp_sum(a01)
        a10 = warp_sum(a10)
        a11 = warp_sum(a11)
        a20 = warp_sum(a20)
        a21 = warp_sum(a21)
        a30 = warp_sum(a30)
        a31 = warp_sum(a31)
        if lane == 0:
            b0 = bias[n0] if has_bias != 0 else float32(0.0)
            b1 = bias[n1] if has_bias != 0 else float32(0.0)
            out[t0, n0] = a00 + b0
            if has1:
                out[t0, n1] = a01 + b1
            if ok1:
                out[t0 + 1, n0] = a10 + b0
                if has1:
                    out[t0 + 1, n1] = a11 + b1
            if ok2:
                out[t0 + 2, n0] = a20 + b0
                if has1:
                    out[t0 + 2, n1] = a21 + b1
            if ok3:
                out[t0 + 3, n0] = a30 + b0
                if has1:
                    out[t0 + 3, n1] = a31 + b1


@kernel((f32_2, u16_2, f32_2), sim=True, fastmath=True, launch_bounds=(256, 2),
        self_sync=True)
def gemv_bf16_swiglu_kernel(x, w, h):
    """grid ceil(I / 8), block 256: h[t, j] = silu(w[j] . x[t]) * (w[I + j] . x[t]) for every
    token t (T <= 16, 4 per pass). w = [gate; up] [2I, K] bf16, K % 8 == 0, 16-byte aligned
    (the vectorised loop only). A warp streams the gate row j and the up row I + j as
    gemv_bf16_kernel streams a row pair, so the SwiGLU costs no launch and the [T, 2I]
    intermediate is never written."""
    lane = cuda.threadIdx.x & 31
    warp = cuda.threadIdx.x >> 5
    inter = h.shape[1]
    k_dim = w.shape[1]
    n_tok = x.shape[0]
    j = cuda.blockIdx.x * GEMV_WARPS + warp
    if j >= inter:
        return
    for t0 in range(0, n_tok, 4):
        z = float32(0.0)
        ok1 = t0 + 1 < n_tok
        ok2 = t0 + 2 < n_tok
        ok3 = t0 + 3 < n_tok
        acc = _stream_pair(x, w, j * k_dim, (inter + j) * k_dim, lane * 8, k_dim, t0, k_dim, ok1, ok2, ok3,
                           (z, z, z, z, z, z, z, z))
        g0 = warp_sum(acc[0])
        u0 = warp_sum(acc[1])
        g1 = warp_sum(acc[2])
        u1 = warp_sum(acc[3])
        g2 = warp_sum(acc[4])
        u2 = warp_sum(acc[5])
        g3 = warp_sum(acc[6])
        u3 = warp_sum(acc[7])
        if lane == 0:
            h[t0, j] = g0 / (float32(1.0) + math.exp(-g0)) * u0
            if ok1:
                h[t0 + 1, j] = g1 / (float32(1.0) + math.exp(-g1)) * u1
            if ok2:
                h[t0 + 2, j] = g2 / (float32(1.0) + math.exp(-g2)) * u2
            if ok3:
                h[t0 + 3, j] = g3 / (float32(1.0) + math.exp(-g3)) * u3


def splitk_rows_per_block(ways: int) -> int:
    return GEMV_WARPS // ways * GEMV_ROWS


def _make_splitk(ways: int, name: str):
    """gemv_bf16_splitk with `ways` K slices (warps) per row pair (compile-time constant)."""
    WAYS = ways
    PAIRS = GEMV_WARPS // ways

    def gemv_bf16_splitk(x, w, bias, out, has_bias):
        """grid ceil(N / splitk_rows_per_block(ways)), block 256; the vectorised path only (K % 8
        == 0, 16-byte aligned).
        x [T, K] fp32, w [N, K] bf16, out [T, N] fp32, T <= 4 per pass like gemv_bf16_kernel.

        For weights with few rows and long rows (the 27B's 5120 x 17408 and 5120 x 6144, the 35B's
        2048 x 4096): gemv_bf16_kernel gives each warp 2 whole rows, so N = 5120 is 320 blocks for
        264 resident (2 per SM), and the second, 56-block wave leaves most SMs idle. Here the
        `ways` warps of a row pair each stream
        one K slice (a multiple of 256 columns) of both rows: at 4 ways 4 rows per block, N = 5120
        is 1280 short blocks (~5 waves, so the last one costs little); at 2 ways 8 rows per block,
        each slice twice as long. The slices' sums meet in shared memory in
        a fixed order, so the result is deterministic (no atomics)."""
        red = cuda.shared.array((GEMV_WARPS, 8), float32)
        lane = cuda.threadIdx.x & 31
        warp = cuda.threadIdx.x >> 5
        pair = warp // WAYS
        sl = warp - pair * WAYS
        n_rows = w.shape[0]
        k_dim = w.shape[1]
        n_tok = x.shape[0]
        n0 = (cuda.blockIdx.x * PAIRS + pair) * GEMV_ROWS
        live = n0 < n_rows                           # dead pairs still reach the barriers
        n0 = n0 if live else 0
        has1 = n0 + 1 < n_rows
        n1 = n0 + 1 if has1 else n0
        k_beg, k_end = k_slice(sl, WAYS, k_dim)
        for t0 in range(0, n_tok, 4):
            ok1 = t0 + 1 < n_tok
            ok2 = t0 + 2 < n_tok
            ok3 = t0 + 3 < n_tok
            acc = (float32(0.0), float32(0.0), float32(0.0), float32(0.0),
                   float32(0.0), float32(0.0), float32(0.0), float32(0.0))
            if live:
                acc = _stream_pair(x, w, n0 * k_dim, n1 * k_dim, k_beg + lane * 8, k_end, t0, k_dim, ok1, ok2, ok3,
                                   acc)
            grid_dependency_sync()                   # dead pairs too, before the shared sums and stores
            a00, a01, a10, a11, a20, a21, a30, a31 = acc
            a00 = warp_sum(a00)
            a01 = warp_sum(a01)
            a10 = warp_sum(a10)
            a11 = warp_sum(a11)
            a20 = warp_sum(a20)
            a21 = warp_sum(a21)
            a30 = warp_sum(a30)
            a31 = warp_sum(a31)
            if lane == 0:
                red[warp, 0] = a00
                red[warp, 1] = a01
                red[warp, 2] = a10
                red[warp, 3] = a11
                red[warp, 4] = a20
                red[warp, 5] = a21
                red[warp, 6] = a30
                red[warp, 7] = a31
            cuda.syncthreads()
            if live and sl == 0 and lane < 8:            # lane j adds value j over the slices
                v = float32(0.0)
                for j in range(WAYS):
                    v += red[warp + j, lane]
                tok = t0 + (lane >> 1)
                row = n0 if (lane & 1) == 0 else n1
                if tok < n_tok and ((lane & 1) == 0 or has1):
                    b = bias[row] if has_bias != 0 else float32(0.0)
                    out[tok, row] = v + b
            cuda.syncthreads()                           # red is rewritten by the next pass

    gemv_bf16_splitk.__name__ = name
    return kernel((f32_2, u16_2, f32_1, f32_2, i32), sim=True, fastmath=True,
                  launch_bounds=(256, 2), self_sync=True)(gemv_bf16_splitk)


gemv_bf16_splitk_kernel = _make_splitk(4, "gemv_bf16_splitk_kernel")     # 4 K slices per row pair
gemv_bf16_splitk2_kernel = _make_splitk(2, "gemv_bf16_splitk2_kernel")   # 2 K slices per row pair


ONE_TOKEN_MODES = ("plain", "normed", "swiglu")
_ONE_TOKEN: dict[tuple[str, int, int, int], Any] = {}


def gemv_one_token(mode: str, ways: int, min_blocks: int, warps: int = GEMV_WARPS) -> Any:
    """The one-token decode GEMV (T = 1, the vectorised path: K % 8 == 0, 16-byte aligned) built
    for `mode`, `ways` K slices per row pair, blocks of `warps` warps and `min_blocks` resident
    blocks per SM (launch bounds: 8 warps x 2 blocks -> up to 128 registers, x 4 -> 64),
    registered on first use. One signature for every mode: (x [1, K], nw [K], eps, w [N, K]
    bf16, bias [N], out, has_bias).

    * "plain": out[0, n] = w[n] . x[0] (+ bias[n]; bias may alias out: the residual add).
    * "normed": the same for rms_norm(x[0], nw, eps), the norm fused in as in
      `_stream_pair_normed` (each slice also sums x^2 over its columns; the slices' sums meet
      with the dot products).
    * "swiglu": out [1, I] = silu(w[j] . xn) * (w[I + j] . xn) of the normed x (w = [gate; up]),
      the gate and up row of j streamed as a pair.

    Grid ceil(pairs / (warps / ways)), block 32 * warps; pairs = ceil(N / 2) (plain, normed) or I.
    Without the token loop of gemv_bf16_kernel (up to 16 tokens, 8 accumulators) the plain
    loop fits 80 registers without spills (ptxas, sm_90a), so 3 blocks (24 warps) per SM keep
    their loads in flight, and the K slices even out the last wave of a few-row weight."""
    key = (mode, ways, min_blocks, warps)
    if key not in _ONE_TOKEN:
        if (mode not in ONE_TOKEN_MODES or ways not in (1, 2, 4, 8) or warps not in (2, 4, 8) or ways > warps
                or not 1 <= min_blocks * warps <= 64):
            raise ValueError(f"gemv_one_token: no build {key}")
        _ONE_TOKEN[key] = _make_one_token(mode, ways, min_blocks, warps)
    return _ONE_TOKEN[key]


def _make_one_token(mode: str, ways: int, min_blocks: int, warps: int):
    WAYS = ways
    WARPS = warps
    PAIRS = warps // ways
    NORMED = mode != "plain"
    SWIGLU = mode == "swiglu"

    def gemv_bf16_one_token(x, nw, eps, w, bias, out, has_bias):
        red = cuda.shared.array((WARPS, 3), float32)
        lane = cuda.threadIdx.x & 31
        warp = cuda.threadIdx.x >> 5
        pair = warp // WAYS
        sl = warp - pair * WAYS
        n_rows = w.shape[0]
        k_dim = w.shape[1]
        n_pairs = out.shape[1] if SWIGLU else (n_rows + 1) // 2
        p = cuda.blockIdx.x * PAIRS + pair
        live = p < n_pairs                          # dead pairs still reach the barriers
        p = p if live else 0
        if SWIGLU:
            r0 = p
            r1 = n_pairs + p
            has1 = True
        else:
            r0 = 2 * p
            has1 = r0 + 1 < n_rows
            r1 = r0 + 1 if has1 else r0             # a lone last row: loaded, never stored
        k_beg, k_end = k_slice(sl, WAYS, k_dim)
        a0 = float32(0.0)
        a1 = float32(0.0)
        ss = float32(0.0)
        if live:
            if NORMED:
                a0, a1, ss = _stream_pair_normed(x, 0, nw, w, r0 * k_dim, r1 * k_dim, k_beg + lane * 8, k_end)
            else:
                z = float32(0.0)
                acc = _stream_pair(x, w, r0 * k_dim, r1 * k_dim, k_beg + lane * 8, k_end, 0, k_dim,
                                   False, False, False, (z, z, z, z, z, z, z, z))
                a0 = acc[0]
                a1 = acc[1]
        grid_dependency_sync()                      # dead pairs too, before the stores
        a0 = warp_sum(a0)
        a1 = warp_sum(a1)
        if NORMED:
            ss = warp_sum(ss)
        if WAYS > 1:                                # the slices' sums meet in a fixed order
            if lane == 0:
                red[warp, 0] = a0
                red[warp, 1] = a1
                red[warp, 2] = ss
            cuda.syncthreads()
            a0 = float32(0.0)
            a1 = float32(0.0)
            ss = float32(0.0)
            for j in range(WAYS):
                a0 += red[warp - sl + j, 0]
                a1 += red[warp - sl + j, 1]
                ss += red[warp - sl + j, 2]
        if live and sl == 0 and lane == 0:
            if NORMED:
                inv = float32(1.0) / math.sqrt(ss / float32(k_dim) + eps)
                a0 *= inv
                a1 *= inv
            if SWIGLU:
                out[0, p] = a0 / (float32(1.0) + math.exp(-a0)) * a1
            else:
                out[0, r0] = a0 + (bias[r0] if has_bias != 0 else float32(0.0))
                if has1:
                    out[0, r1] = a1 + (bias[r1] if has_bias != 0 else float32(0.0))

    gemv_bf16_one_token.__name__ = f"gemv_bf16_{mode}_w{ways}_b{min_blocks}{'' if warps == 8 else f'_x{warps}'}_kernel"
    return kernel((f32_2, f32_1, f32, u16_2, f32_1, f32_2, i32), sim=True, fastmath=True,
                  launch_bounds=(32 * warps, min_blocks), self_sync=True)(gemv_bf16_one_token)


BM = 64
BN = 64
BK = 16
BMP = BM + 4   # padded shared-tile pitch
BNP = BN + 4


@kernel((f32_2, u16_2, f32_1, f32_2, i32), (f32_2, f32_2, f32_1, f32_2, i32), launch_bounds=(256, 2))
def gemm_kernel(x, w, bias, out, has_bias):
    """grid (ceil(N / 64), ceil(T / 64)), block 256. out[T, N] = x[T, K] @ w[N, K]^T (+ bias)."""
    a_s = cuda.shared.array((BK, BMP), float32)
    b_s = cuda.shared.array((BK, BNP), float32)
    acc = cuda.local.array((4, 4), float32)
    tid = cuda.threadIdx.x
    ty = tid // 16
    tx = tid % 16
    m0 = cuda.blockIdx.y * BM
    n0 = cuda.blockIdx.x * BN
    n_tok = x.shape[0]
    k_dim = x.shape[1]
    n_rows = w.shape[0]
    for i in range(4):
        for j in range(4):
            acc[i, j] = float32(0.0)
    for k0 in range(0, k_dim, BK):
        for l in range(4):
            idx = tid + 256 * l
            r = idx // BK
            kk = idx % BK
            gk = k0 + kk
            gm = m0 + r
            a_s[kk, r] = x[gm, gk] if (gm < n_tok and gk < k_dim) else float32(0.0)
            gn = n0 + r
            b_s[kk, r] = widen(w[gn, gk]) if (gn < n_rows and gk < k_dim) else float32(0.0)
        cuda.syncthreads()
        for kk in range(BK):
            a0 = a_s[kk, ty]
            a1 = a_s[kk, ty + 16]
            a2 = a_s[kk, ty + 32]
            a3 = a_s[kk, ty + 48]
            for j in range(4):
                b = b_s[kk, tx + 16 * j]
                acc[0, j] += a0 * b
                acc[1, j] += a1 * b
                acc[2, j] += a2 * b
                acc[3, j] += a3 * b
        cuda.syncthreads()
    for i in range(4):
        gm = m0 + ty + 16 * i
        if gm < n_tok:
            for j in range(4):
                gn = n0 + tx + 16 * j
                if gn < n_rows:
                    v = acc[i, j]
                    if has_bias != 0:
                        v += bias[gn]
                    out[gm, gn] = v


GEMV_F32_WARPS = 8


@kernel((f32_2, f32_2, f32_1, f32_2, i32), sim=False, fastmath=True, launch_bounds=(256, 2))
def gemv_f32_kernel(x, w, bias, out, has_bias):
    """fp32 weights, T <= GEMV_MAX_T tokens (exact checkpoints such as dequantized GGUF).
    x [T, K], w [N, K] -> out [T, N]; one warp per weight row, lanes stride K (coalesced)."""
    warp = cuda.threadIdx.x // 32
    lane = cuda.threadIdx.x % 32
    row = cuda.blockIdx.x * GEMV_F32_WARPS + warp
    if row >= w.shape[0]:
        return
    k = w.shape[1]
    for t in range(x.shape[0]):
        acc = float32(0.0)
        for j in range(lane, k, 32):
            acc += w[row, j] * x[t, j]
        acc = warp_sum(acc)
        if lane == 0:
            out[t, row] = acc + (bias[row] if has_bias else float32(0.0))


# The one-token builds ops/cuda/linear.py picks (one_token_build), registered at import so that the
# compile tests see them; others are built on first use (scripts/gemv_probe.py sweeps them).
ONE_TOKEN_BUILDS = (("plain", 2, 2, 8), ("plain", 2, 3, 8), ("normed", 1, 2, 8), ("swiglu", 1, 2, 8),
                    ("plain", 2, 4, 4), ("plain", 2, 6, 4), ("plain", 1, 5, 4), ("normed", 1, 4, 4),
                    ("swiglu", 1, 4, 4))
for _build in ONE_TOKEN_BUILDS:
    gemv_one_token(*_build)
