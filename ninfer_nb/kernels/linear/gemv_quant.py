"""Decode GEMVs on the project's own groupwise int4 / int8 weights (quant/formats.py), read
quantized: y[T, N] = x[T, K] @ W^T with W = scale * (code - zero) per group of columns.

The weight arrays are the canonical layout as stored (no repack): codes uint8 [N, K / 2]
(int4: column 2j in the low nibble of byte j, so nibble i of a little-endian 32-bit word is
column 8w + i) or [N, K] (int8), scales float16 bits (uint16) [N, K / g], zero points uint8
[N, K / g] (formats with zero points; the symmetric formats use 2^(bits-1)). x is fp32.

* `gemv_quant(bits, mode, tokens, ways, warps, min_blocks)`: the decode GEMV for 1 token
  (`tokens` = 1; modes "plain", "normed", "swiglu" as linear.py gemv_one_token) or 2-16 tokens
  (`tokens` = 4 per pass; modes "plain", "swiglu"). A warp owns a row pair (swiglu: the gate
  row j and the up row I + j) and streams its codes with 16-byte loads, `ways` warps splitting
  K as gemv_one_token does (their sums meet in shared memory in a fixed order). Each lane reads
  16 bytes of both rows per 512-byte warp step (int4: 32 columns, int8: 16; always inside one
  group), 2 or 4 steps' code loads (steps_per_pass) issued before any math and before
  `grid_dependency_sync()` (the self_sync convention of linear.py: the codes do not depend on
  the previous kernel; only streaming loads may precede the wait, so the scales and zero
  points are read after it). Products and sums in fp32, one scale multiply per 16 bytes and
  row:
  - int8: a code becomes the exact float (code - zero) as as_f32(0x4B000000 | code) - (2^23 +
    zero) (the magic number);
  - int4: a code c becomes m = 1 + c / 16 by one shift and one mask-or into the mantissa of
    1.0, and sum (c - zero) x = 16 sum m x - (16 + zero) sum x, the sum of x shared by the row
    pair (no per-weight subtract: int4 carries twice the weights per byte, so its instructions
    per weight decide whether the GEMV keeps up with the bytes).
  "normed" scales x by the norm weight as it is read and applies 1 / rms at the end; bias may
  alias out at T = 1 (the residual add).
* `dequant_bf16_kernel`: W dequantized into a bf16 matrix (uint16 bits, round to nearest even)
  for the prefill GEMMs. The bf16 rounding of scale * (code - zero) (about 2^-9 relative) is
  below both formats' quantization step.
Row bytes must be a multiple of 16 and the codes 16-byte aligned (true of every format: the
group is at least 32 columns). Knows nothing about which build suits which shape
(ops/cuda/linear.py picks them).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import config, cuda, float32, int32, uint8, uint16, uint32

from ninfer_nb.kernels.common.bf16 import f32_to_bf16
from ninfer_nb.kernels.common.nbtypes import f32, f32_1, f32_2, i32
from ninfer_nb.kernels.common.ptx import as_f32, grid_dependency_sync, ldg_stream_v4_u32, ldg_v4_f32
from ninfer_nb.kernels.common.registry import kernel
from ninfer_nb.kernels.common.warp import warp_sum

u8_2 = uint8[:, ::1]
u16_2 = uint16[:, ::1]

MAGIC = np.uint32(0x4B000000)           # as_f32(MAGIC | c) == 2^23 + c for 0 <= c < 2^23
MAGIC_F = np.float32(8388608.0)
ONE = np.uint32(0x3F800000)             # 1.0f; | (c << 19) is 1 + c / 16 for a 4-bit c
M4 = np.uint32(0x00780000)              # mantissa bits 19-22
M8 = np.uint32(0xFF)
# shift counts and masks as uint32 constants: the bit ops stay 32-bit in numba's IR (an int
# literal would type them int64)
SH1, SH3, SH5, SH7, SH8, SH9 = (np.uint32(n) for n in (1, 3, 5, 7, 8, 9))
SH11, SH15, SH16, SH19, SH24 = (np.uint32(n) for n in (11, 15, 16, 19, 24))
F16_EXP_FIX = np.float32(2.0 ** 112)    # float16 bits << 13, times this: the float32 value
STEP = 512                              # code bytes a warp reads per step (16 per lane)
UNROLL = 4                              # steps whose code loads a pass issues together (at most)
MODES = {1: ("plain", "normed", "swiglu"), 4: ("plain", "swiglu")}
MAX_TOKENS = 16


# Small device helpers are inlined by NVVM (alwaysinline), not by Numba's IR inliner, which copies
# the IR at every call site (slow compiles). The simulator inlines nothing.
_INLINE: dict[str, Any] = {} if config.ENABLE_CUDASIM else {"forceinline": True}


@cuda.jit(device=True, **_INLINE)
def _f16(h):
    """float16 bits (uint16) -> float32, exact for zero, subnormals and normals."""
    b = int32(h)
    v = as_f32((b & 0x7FFF) << 13) * F16_EXP_FIX
    return -v if (b & 0x8000) != 0 else v


@cuda.jit(device=True)
def _dot_i4(w, xa, xb, m4):
    """The 8 int4 codes c of word w (nibble i = column i) as m = 1 + c / 16 (the code placed in
    the top mantissa bits of 1.0: one shift and one mask-or, no conversion) dotted with the
    8 fp32 x values xa, xb. sum (c - z) x = 16 sum m x - (16 + z) sum x (_pair_dots)."""
    s = as_f32(((w << SH19) & m4) | ONE) * xa[0]
    s += as_f32(((w << SH15) & m4) | ONE) * xa[1]
    s += as_f32(((w << SH11) & m4) | ONE) * xa[2]
    s += as_f32(((w << SH7) & m4) | ONE) * xa[3]
    s += as_f32(((w << SH3) & m4) | ONE) * xb[0]
    s += as_f32(((w >> SH1) & m4) | ONE) * xb[1]
    s += as_f32(((w >> SH5) & m4) | ONE) * xb[2]
    s += as_f32(((w >> SH9) & m4) | ONE) * xb[3]
    return s


@cuda.jit(device=True, **_INLINE)
def _sum16(xa, xb, xc, xd):
    return (((xa[0] + xa[1]) + (xa[2] + xa[3])) + ((xb[0] + xb[1]) + (xb[2] + xb[3]))
            + (((xc[0] + xc[1]) + (xc[2] + xc[3])) + ((xd[0] + xd[1]) + (xd[2] + xd[3]))))


@cuda.jit(device=True)
def _dot_i8(w, xa, zf):
    """The 4 int8 codes of word w (byte i = column i) minus the zero point, dotted with xa."""
    s = (as_f32((w & M8) | MAGIC) - zf) * xa[0]
    s += (as_f32(((w >> SH8) & M8) | MAGIC) - zf) * xa[1]
    s += (as_f32(((w >> SH16) & M8) | MAGIC) - zf) * xa[2]
    s += (as_f32((w >> SH24) | MAGIC) - zf) * xa[3]
    return s


@cuda.jit(device=True)
def _x16(x, xi, nw, ki, normed):
    """x.flat[xi : xi + 16] as four 4-tuples (times nw[ki : ki + 16] when `normed`) and the sum of
    squares of the raw values (normed only; the norm's statistic)."""
    xa = ldg_v4_f32(x, xi)
    xb = ldg_v4_f32(x, xi + 4)
    xc = ldg_v4_f32(x, xi + 8)
    xd = ldg_v4_f32(x, xi + 12)
    ss = float32(0.0)
    if normed:
        ss = (xa[0] * xa[0] + xa[1] * xa[1] + xa[2] * xa[2] + xa[3] * xa[3]
              + xb[0] * xb[0] + xb[1] * xb[1] + xb[2] * xb[2] + xb[3] * xb[3]
              + xc[0] * xc[0] + xc[1] * xc[1] + xc[2] * xc[2] + xc[3] * xc[3]
              + xd[0] * xd[0] + xd[1] * xd[1] + xd[2] * xd[2] + xd[3] * xd[3])
        na = ldg_v4_f32(nw, ki)
        nb = ldg_v4_f32(nw, ki + 4)
        nc = ldg_v4_f32(nw, ki + 8)
        nd = ldg_v4_f32(nw, ki + 12)
        xa = (xa[0] * na[0], xa[1] * na[1], xa[2] * na[2], xa[3] * na[3])
        xb = (xb[0] * nb[0], xb[1] * nb[1], xb[2] * nb[2], xb[3] * nb[3])
        xc = (xc[0] * nc[0], xc[1] * nc[1], xc[2] * nc[2], xc[3] * nc[3])
        xd = (xd[0] * nd[0], xd[1] * nd[1], xd[2] * nd[2], xd[3] * nd[3])
    return xa, xb, xc, xd, ss


@cuda.jit(device=True)
def _pair_dots(bits, x, xi, nw, ki, normed, wa, wb, za, zb):
    """One lane's 16 code bytes of two rows (wa, wb: 4 words each; za, zb: the _meta offsets of
    their zero points) dotted with one token's x from column ki (flat index xi): the two
    unscaled partial dot products sum (code - zero) x and the sum of squares of the x values
    read (normed). int4: 16 sum m x - (16 + zero) sum x (_dot_i4), the sum of x shared by the
    rows; int8: exact (code - zero) terms (_dot_i8)."""
    if bits == 4:
        # M4 as a value computed at run time ((xi >> 40) is 0): ptxas keeps it in a register
        # for the mask-or LOP3 instead of re-materialising one of its two constants each time
        m4 = uint32(M4 | (xi >> 40))
        xa, xb, xc, xd, s = _x16(x, xi, nw, ki, normed)
        sx = _sum16(xa, xb, xc, xd)
        d0 = _dot_i4(wa[0], xa, xb, m4) + _dot_i4(wa[1], xc, xd, m4)
        d1 = _dot_i4(wb[0], xa, xb, m4) + _dot_i4(wb[1], xc, xd, m4)
        xa, xb, xc, xd, s2 = _x16(x, xi + 16, nw, ki + 16, normed)
        sx += _sum16(xa, xb, xc, xd)
        d0 += _dot_i4(wa[2], xa, xb, m4) + _dot_i4(wa[3], xc, xd, m4)
        d1 += _dot_i4(wb[2], xa, xb, m4) + _dot_i4(wb[3], xc, xd, m4)
        return float32(16.0) * d0 - za * sx, float32(16.0) * d1 - zb * sx, s + s2
    xa, xb, xc, xd, s = _x16(x, xi, nw, ki, normed)
    d0 = _dot_i8(wa[0], xa, za) + _dot_i8(wa[1], xb, za) + _dot_i8(wa[2], xc, za) + _dot_i8(wa[3], xd, za)
    d1 = _dot_i8(wb[0], xa, zb) + _dot_i8(wb[1], xb, zb) + _dot_i8(wb[2], xc, zb) + _dot_i8(wb[3], xd, zb)
    return d0, d1, s


@cuda.jit(device=True, **_INLINE)
def _meta(scales, zeros, r, g, has_zeros, mid):
    """(scale, offset + zero point) of group g of row r; offset 16 for int4 (mid 8: _dot_i4's
    1 + c / 16), 2^23 for int8 (_dot_i8's magic number)."""
    z = float32(zeros[r, g]) if has_zeros != 0 else float32(mid)
    return _f16(scales[r, g]), (float32(16.0) if mid == 8 else MAGIC_F) + z


@cuda.jit(device=True, **_INLINE)
def _step_codes(codes, r0, r1, kb):
    """One lane's 16 code bytes of rows r0, r1 at code byte kb (streaming loads: the only
    global reads a self_sync kernel issues before grid_dependency_sync)."""
    rb = codes.shape[1]
    return ldg_stream_v4_u32(codes, r0 * rb + kb), ldg_stream_v4_u32(codes, r1 * rb + kb)


@cuda.jit(device=True)
def _step_meta(bits, scales, zeros, r0, r1, kb, gshift, has_zeros, mid):
    """The scales and zero-point offsets (_meta) of rows r0, r1 for the group of code byte kb."""
    g = ((kb * 2) if bits == 4 else kb) >> gshift
    sa, za = _meta(scales, zeros, r0, g, has_zeros, mid)
    sb, zb = _meta(scales, zeros, r1, g, has_zeros, mid)
    return sa, sb, za, zb


@cuda.jit(device=True)
def _step_math(bits, x, k_dim, nw, normed, kb, t0, ok1, ok2, ok3, wa, wb, sa, sb, za, zb, acc, ss):
    """Add one warp step (this lane's 16 code bytes of two rows) times up to 4 tokens of x to the
    8 accumulators acc[token][row]; ss gathers token t0's sum of squares (normed)."""
    a00, a01, a10, a11, a20, a21, a30, a31 = acc
    k = (kb * 2) if bits == 4 else kb
    xi = t0 * k_dim + k
    d0, d1, s = _pair_dots(bits, x, xi, nw, k, normed, wa, wb, za, zb)
    a00 += sa * d0
    a01 += sb * d1
    ss += s
    if ok1:
        d0, d1, s = _pair_dots(bits, x, xi + k_dim, nw, k, False, wa, wb, za, zb)
        a10 += sa * d0
        a11 += sb * d1
    if ok2:
        d0, d1, s = _pair_dots(bits, x, xi + 2 * k_dim, nw, k, False, wa, wb, za, zb)
        a20 += sa * d0
        a21 += sb * d1
    if ok3:
        d0, d1, s = _pair_dots(bits, x, xi + 3 * k_dim, nw, k, False, wa, wb, za, zb)
        a30 += sa * d0
        a31 += sb * d1
    return (a00, a01, a10, a11, a20, a21, a30, a31), ss


@cuda.jit(device=True)
def _stream_pair(bits, normed, unroll, x, nw, codes, scales, zeros, gshift, has_zeros, mid, r0, r1, kb, kb_end,
                 t0, ok1, ok2, ok3, acc, ss):
    """This lane's share of two rows (r0, r1) over code bytes kb, kb + 512, ... < kb_end times up
    to 4 tokens from t0: `unroll` (4 or 2) steps' loads issued together, then the math; the rest
    one step at a time. grid_dependency_sync() after each pass's loads, before x is read."""
    k_dim = x.shape[1]
    while unroll == 4 and kb + 3 * STEP < kb_end:
        wa0, wb0 = _step_codes(codes, r0, r1, kb)
        wa1, wb1 = _step_codes(codes, r0, r1, kb + STEP)
        wa2, wb2 = _step_codes(codes, r0, r1, kb + 2 * STEP)
        wa3, wb3 = _step_codes(codes, r0, r1, kb + 3 * STEP)
        grid_dependency_sync()      # x is the previous kernel's output; the codes were not
        sa0, sb0, za0, zb0 = _step_meta(bits, scales, zeros, r0, r1, kb, gshift, has_zeros, mid)
        sa1, sb1, za1, zb1 = _step_meta(bits, scales, zeros, r0, r1, kb + STEP, gshift, has_zeros, mid)
        sa2, sb2, za2, zb2 = _step_meta(bits, scales, zeros, r0, r1, kb + 2 * STEP, gshift, has_zeros, mid)
        sa3, sb3, za3, zb3 = _step_meta(bits, scales, zeros, r0, r1, kb + 3 * STEP, gshift, has_zeros, mid)
        acc, ss = _step_math(bits, x, k_dim, nw, normed, kb, t0, ok1, ok2, ok3, wa0, wb0, sa0, sb0, za0, zb0,
                             acc, ss)
        acc, ss = _step_math(bits, x, k_dim, nw, normed, kb + STEP, t0, ok1, ok2, ok3, wa1, wb1, sa1, sb1, za1,
                             zb1, acc, ss)
        acc, ss = _step_math(bits, x, k_dim, nw, normed, kb + 2 * STEP, t0, ok1, ok2, ok3, wa2, wb2, sa2, sb2,
                             za2, zb2, acc, ss)
        acc, ss = _step_math(bits, x, k_dim, nw, normed, kb + 3 * STEP, t0, ok1, ok2, ok3, wa3, wb3, sa3, sb3,
                             za3, zb3, acc, ss)
        kb += 4 * STEP
    while unroll == 2 and kb + STEP < kb_end:
        wa0, wb0 = _step_codes(codes, r0, r1, kb)
        wa1, wb1 = _step_codes(codes, r0, r1, kb + STEP)
        grid_dependency_sync()
        sa0, sb0, za0, zb0 = _step_meta(bits, scales, zeros, r0, r1, kb, gshift, has_zeros, mid)
        sa1, sb1, za1, zb1 = _step_meta(bits, scales, zeros, r0, r1, kb + STEP, gshift, has_zeros, mid)
        acc, ss = _step_math(bits, x, k_dim, nw, normed, kb, t0, ok1, ok2, ok3, wa0, wb0, sa0, sb0, za0, zb0,
                             acc, ss)
        acc, ss = _step_math(bits, x, k_dim, nw, normed, kb + STEP, t0, ok1, ok2, ok3, wa1, wb1, sa1, sb1, za1,
                             zb1, acc, ss)
        kb += 2 * STEP
    while kb < kb_end:
        wa0, wb0 = _step_codes(codes, r0, r1, kb)
        grid_dependency_sync()
        sa0, sb0, za0, zb0 = _step_meta(bits, scales, zeros, r0, r1, kb, gshift, has_zeros, mid)
        acc, ss = _step_math(bits, x, k_dim, nw, normed, kb, t0, ok1, ok2, ok3, wa0, wb0, sa0, sb0, za0, zb0,
                             acc, ss)
        kb += STEP
    grid_dependency_sync()          # a lane with no columns has waited too (returns at once)
    return acc, ss


@cuda.jit(device=True)
def k_slice_bytes(sl, ways, row_bytes):
    """Code bytes [kb_beg, kb_end) of slice sl of `ways` K slices, each a multiple of 512 bytes
    (a warp step), so the last ones may be shorter or empty."""
    k_len = ((row_bytes + ways * STEP - 1) // (ways * STEP)) * STEP
    k_beg = sl * k_len
    return k_beg, min(row_bytes, k_beg + k_len)


_BUILDS: dict[tuple[int, str, int, int, int, int], Any] = {}


def gemv_quant(bits: int, mode: str, tokens: int, ways: int, warps: int, min_blocks: int) -> Any:
    """The quantized decode GEMV build (see the module doc), registered on first use. One
    signature for every build: (x [T, K] fp32, nw [K], eps, codes uint8 [N, K * bits / 8],
    scales uint16 [N, K / g] (float16 bits), zeros uint8 [N, K / g] (any [1, 1] array when
    has_zeros == 0), gshift = log2(g), has_zeros, bias [N], out [T, N] ([T, N / 2] for
    "swiglu"), has_bias). Grid ceil(pairs / (warps / ways)), block 32 * warps; pairs =
    ceil(N / 2) (plain, normed) or N / 2 (swiglu). tokens = 1: T = 1; tokens = 4: T <= 16."""
    key = (bits, mode, tokens, ways, warps, min_blocks)
    if key not in _BUILDS:
        if (bits not in (4, 8) or tokens not in MODES or mode not in MODES[tokens] or ways not in (1, 2, 4, 8)
                or warps not in (2, 4, 8) or ways > warps or not 1 <= min_blocks * warps <= 64):
            raise ValueError(f"gemv_quant: no build {key}")
        _BUILDS[key] = _make(bits, mode, tokens, ways, warps, min_blocks)
    return _BUILDS[key]


def _make(bits: int, mode: str, tokens: int, ways: int, warps: int, min_blocks: int) -> Any:
    BITS = bits
    MID = 1 << (bits - 1)
    NT = tokens
    WAYS = ways
    WARPS = warps
    PAIRS = warps // ways
    SWIGLU = mode == "swiglu"
    NORMED = mode == "normed" or (SWIGLU and tokens == 1)      # one token: the RMSNorm fused in
    UNROLL_STEPS = steps_per_pass(bits, mode, tokens)

    def gemv_quant_build(x, nw, eps, codes, scales, zeros, gshift, has_zeros, bias, out, has_bias):
        red = cuda.shared.array((WARPS, 9), float32)
        lane = cuda.threadIdx.x & 31
        warp = cuda.threadIdx.x >> 5
        pair = warp // WAYS
        sl = warp - pair * WAYS
        n_rows = codes.shape[0]
        k_dim = x.shape[1]
        n_tok = x.shape[0]
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
        kb_beg, kb_end = k_slice_bytes(sl, WAYS, codes.shape[1])
        for t0 in range(0, n_tok, NT):
            ok1 = NT > 1 and t0 + 1 < n_tok
            ok2 = NT > 1 and t0 + 2 < n_tok
            ok3 = NT > 1 and t0 + 3 < n_tok
            z = float32(0.0)
            acc = (z, z, z, z, z, z, z, z)
            ss = z
            if live:
                acc, ss = _stream_pair(BITS, NORMED, UNROLL_STEPS, x, nw, codes, scales, zeros, gshift, has_zeros,
                                       MID, r0, r1, kb_beg + lane * 16, kb_end, t0, ok1, ok2, ok3, acc, ss)
            grid_dependency_sync()                  # dead pairs too, before the stores
            a00, a01, a10, a11, a20, a21, a30, a31 = acc
            a00 = warp_sum(a00)
            a01 = warp_sum(a01)
            if NT > 1:
                a10 = warp_sum(a10)
                a11 = warp_sum(a11)
                a20 = warp_sum(a20)
                a21 = warp_sum(a21)
                a30 = warp_sum(a30)
                a31 = warp_sum(a31)
            if NORMED:
                ss = warp_sum(ss)
            if WAYS > 1:                            # the slices' sums meet in a fixed order
                if lane == 0:
                    red[warp, 0] = a00
                    red[warp, 1] = a01
                    red[warp, 2] = a10
                    red[warp, 3] = a11
                    red[warp, 4] = a20
                    red[warp, 5] = a21
                    red[warp, 6] = a30
                    red[warp, 7] = a31
                    red[warp, 8] = ss
                cuda.syncthreads()
                a00 = z
                a01 = z
                a10 = z
                a11 = z
                a20 = z
                a21 = z
                a30 = z
                a31 = z
                ss = z
                for j in range(WAYS):
                    a00 += red[warp - sl + j, 0]
                    a01 += red[warp - sl + j, 1]
                    a10 += red[warp - sl + j, 2]
                    a11 += red[warp - sl + j, 3]
                    a20 += red[warp - sl + j, 4]
                    a21 += red[warp - sl + j, 5]
                    a30 += red[warp - sl + j, 6]
                    a31 += red[warp - sl + j, 7]
                    ss += red[warp - sl + j, 8]
                cuda.syncthreads()                  # red is rewritten by the next pass
            if live and sl == 0 and lane == 0:
                if NORMED:
                    inv = float32(1.0) / math.sqrt(ss / float32(k_dim) + eps)
                    a00 *= inv
                    a01 *= inv
                if SWIGLU:
                    out[t0, p] = a00 / (float32(1.0) + math.exp(-a00)) * a01
                    if ok1:
                        out[t0 + 1, p] = a10 / (float32(1.0) + math.exp(-a10)) * a11
                    if ok2:
                        out[t0 + 2, p] = a20 / (float32(1.0) + math.exp(-a20)) * a21
                    if ok3:
                        out[t0 + 3, p] = a30 / (float32(1.0) + math.exp(-a30)) * a31
                else:
                    b0 = bias[r0] if has_bias != 0 else z
                    b1 = bias[r1] if has_bias != 0 else z
                    out[t0, r0] = a00 + b0
                    if has1:
                        out[t0, r1] = a01 + b1
                    if ok1:
                        out[t0 + 1, r0] = a10 + b0
                        if has1:
                            out[t0 + 1, r1] = a11 + b1
                    if ok2:
                        out[t0 + 2, r0] = a20 + b0
                        if has1:
                            out[t0 + 2, r1] = a21 + b1
                    if ok3:
                        out[t0 + 3, r0] = a30 + b0
                        if has1:
                            out[t0 + 3, r1] = a31 + b1

    gemv_quant_build.__name__ = f"gemv_q{bits}_{mode}_t{tokens}_w{ways}_b{min_blocks}_x{warps}_kernel"
    return kernel((f32_2, f32_1, f32, u8_2, u16_2, u8_2, i32, i32, f32_1, f32_2, i32), sim=True, fastmath=True,
                  launch_bounds=(32 * warps, min_blocks), self_sync=True)(gemv_quant_build)


DEQUANT_THREADS = 256


@kernel((u8_2, u16_2, u8_2, i32, i32, i32, u16_2), sim=True, launch_bounds=(DEQUANT_THREADS, 4))
def dequant_bf16_kernel(codes, scales, zeros, gshift, has_zeros, bits, out):
    """out [N, K] bf16 bits = scale * (code - zero) (round to nearest even); one code byte per
    thread and grid-stride step (int4: two columns). codes [N, K * bits / 8]."""
    rb = codes.shape[1]
    n = codes.shape[0] * rb
    mid = 8 if bits == 4 else 128
    for i in range(cuda.blockIdx.x * DEQUANT_THREADS + cuda.threadIdx.x, n, cuda.gridDim.x * DEQUANT_THREADS):
        r = i // rb
        kb = i - r * rb
        c = int(codes[r, kb])
        k = 2 * kb if bits == 4 else kb
        g = k >> gshift
        s = _f16(scales[r, g])
        zp = int(zeros[r, g]) if has_zeros != 0 else mid
        if bits == 4:
            out[r, k] = f32_to_bf16(s * float32((c & 0xF) - zp))
            out[r, k + 1] = f32_to_bf16(s * float32((c >> 4) - zp))
        else:
            out[r, k] = f32_to_bf16(s * float32(c - zp))


def steps_per_pass(bits: int, mode: str, tokens: int) -> int:
    """Warp steps whose code loads a pass issues together: UNROLL where the registers hold them
    without spills (int8 plain and int4 normed one-token builds), else 2."""
    one_token = tokens == 1 and ((mode == "plain" and bits == 8) or (mode == "normed" and bits == 4))
    return UNROLL if one_token else 2


def one_token_blocks(bits: int, mode: str) -> int:
    """Blocks of 4 warps per SM of the one-token builds: the most without register spills
    (ptxas, sm_90a): 4 (128 registers) for plain and int8 swiglu, 3 (168) for normed and int4
    swiglu (the norm weight's loads; int4's mask and sums of x)."""
    return 4 if mode == "plain" or (mode == "swiglu" and bits == 8) else 3


def dequant_grid(n_bytes: int) -> int:
    return max(1, min(4096, (n_bytes + DEQUANT_THREADS - 1) // DEQUANT_THREADS))


# The builds ops/cuda/linear.py picks (quant_build), registered at import so that the compile
# tests see them.
BUILDS = tuple((bits, "plain", 1, ways, 4, one_token_blocks(bits, "plain")) for bits in (4, 8) for ways in (1, 2, 4)) + \
    tuple((bits, mode, 1, 1, 4, one_token_blocks(bits, mode)) for bits in (4, 8) for mode in ("normed", "swiglu")) + \
    tuple((bits, mode, 4, ways, 4, 3) for bits in (4, 8) for mode, ways in
          (("plain", 1), ("plain", 4), ("swiglu", 1)))
for _build in BUILDS:
    gemv_quant(*_build)
