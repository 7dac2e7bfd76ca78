"""Tensor-core decode GEMVs on quantized weights in the tiled device layout (quant/tiled.py):
y[T, N] = x[T, K] @ W^T for 1..16 tokens, W int4 / int8 groupwise (fp16 scales, optional zero
points) or fp8 e4m3 with 128 x 128 block scales.

A warp owns a pair of 16-row tiles (plain / normed: rows 32p .. 32p + 31; swiglu: the gate
tile p and the up tile p + NT / 2) and streams its K-tiles (512 bytes each: one 16-byte
`ldg_stream_v4_u32` per lane and tile) in passes of `UNROLL` K-tiles, software-pipelined: the
next pass's code and scale loads (two register buffers) are issued before this pass's math,
the first pass's before `grid_dependency_sync()` in self_sync builds (codes and scales depend
on no kernel; x does). Each lane's 16 bytes are the A fragments of 4 (4-bit) or 2 (8-bit)
`mma.m16n8k16` sub-blocks: codes become exact bf16 values in registers (int4: two nibbles
OR-ed into the mantissa of bf16 128.0, one LOP3 per register; symmetric formats subtract
136 * sum(x) from constant-A mmas shared by the tile pair, zero points by one fma.bf16x2 per
register; int8: the fp32 magic number, then one cvt to bf16x2; fp8: the e4m3 bits shifted
into a bf16 with its exponent 120 short, then one fma.bf16x2 by 2^120), x (fp32, times the
norm weight in "normed") becomes the bf16 B fragment (token g of lane 4g + t; 8 tokens per
mma, a second mma set for tokens 8..15), and the fp32 accumulators of each group (int4 g32:
each 32-column half) or K-tile are scaled by its scale after the mmas (rows g and g + 8 of a
lane: one 32-bit word of two fp16 scales; fp8: one fp32 per tile and 128 columns). x is read
once per tile pair (32 rows), not once per row pair.

`ways` warps of a block split a pair's K-tiles; their sums meet in shared memory in a fixed
order (deterministic), and the slice-0 warp's lanes store: lane 4g + t holds rows g, g + 8 of
both tiles for tokens 2t, 2t + 1 (+ 8). Epilogues as linear.py's GEMVs: bias (may alias out
at T = 1: the residual add), "normed" (one token of rms_norm(x) * nw: the sum of squares is
gathered from the same loads, 1 / rms applied at the end), "swiglu" (silu(gate) * up of the
gate and up rows a lane holds, the [T, 2I] product never written).

MoE builds (`experts`, any number of tokens, one x row per block): "gate_up" (swiglu for
every routed pair: blockIdx.y = pair t * k + s, expert ids[t, s], x row t, out row = the
pair) and "down" (blockIdx.y = token t: out[t] = bias[t] + sum over slots s of
weights[t, s] * W_ids[t, s] @ h[t * k + s]: x = h viewed as [T, k * I], so K runs over the
slots' rows concatenated, each K-tile reading its slot's expert, the slot weight folded into
the scales; bias flat [T * N]). They read ids written by the previous kernel, so they wait at
entry (not self_sync).

`gemv_t1` (one token; MoE builds for any number of tokens, one x row per block) is a second
scheme for the decode step: fp16 tensor cores, weights streamed through per-warp shared-memory
rings of cp.async copies, x staged once per block as fp16 (see its docstring).

Knows nothing about shapes or which build suits them (ops/cuda/linear_quant.py picks).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
from llvmlite import ir
from numba import config, cuda, float32, int32, int64, uint16, uint32
from numba.cuda import types as nbtypes
from numba.cuda.extending import intrinsic

from ninfer_nb.kernels.common.bf16 import f32_to_bf16
from ninfer_nb.kernels.common.nbtypes import f32, f32_1, f32_2, i32, i32_1, i32_2, u16_2, u32
from ninfer_nb.kernels.common.ptx import (
    _I32,
    _asm,
    _make_mma,
    _make_noarg,
    as_f32,
    cp_async4_l2,
    cp_async16_l2,
    cp_async_commit,
    f16x2_to_f32,
    fma_bf16x2,
    gptr,
    grid_dependency_sync,
    ldg_stream_u32,
    ldg_stream_v4_u32,
    ldg_v4_f32,
    mma_bf16,
    pack_bf16x2,
    pack_f16x2,
    shfl_xor,
    smem_u32,
    st_v4_u32,
)
from ninfer_nb.kernels.common.registry import kernel
from ninfer_nb.kernels.common.warp import warp_sum

# Small device helpers are inlined by NVVM (alwaysinline), not by Numba's IR inliner, which copies
# the IR at every call site (the same SASS, builds compile 2-3x faster). The simulator inlines nothing.
_INLINE: dict[str, Any] = {} if config.ENABLE_CUDASIM else {"forceinline": True}

u32_1 = u32[::1]

TILE_WORDS = 128                        # 512 bytes of a K-tile as uint32
UNROLL = 4                              # K-tiles whose loads a pass issues together
MAX_TOKENS = 16
KINDS = ("i4", "i8", "fp8")
MODES = ("plain", "normed", "swiglu", "normed_swiglu")
ONE2 = np.uint32(0x3F803F80)            # bf16x2 (1, 1)
NEG136 = np.uint32(0xC308C308)          # bf16x2 (-136, -136): -(128 + 8), the symmetric int4 zero
M4 = np.uint32(0x000F000F)
O4 = np.uint32(0x43004300)              # bf16x2 (128, 128); | a nibble: 128 + code
MAGIC = np.uint32(0x4B000000)           # as_f32(MAGIC | c) == 2^23 + c
MAGIC_MID = np.float32(8388608.0 + 128.0)
MAGIC_F = np.float32(8388608.0)
M8 = np.uint32(0xFF)
F8_LO = np.uint32(0x007F007F)
F8_SIGN = np.uint32(0x00800080)
TWO120 = np.uint32(0x7B807B80)          # bf16x2 (2^120, 2^120): e4m3's exponent bias 7 vs bf16's 127
NEG_ZERO2 = np.uint32(0x80008000)
LO16 = np.uint32(0xFFFF)
HI16 = np.uint32(0xFFFF0000)
SH4, SH8, SH12, SH16, SH24 = (np.uint32(n) for n in (4, 8, 12, 16, 24))
Z4 = (float32(0.0), float32(0.0), float32(0.0), float32(0.0))
Z4U = (np.uint32(0), np.uint32(0), np.uint32(0), np.uint32(0))
ZL = (Z4U, Z4U, np.uint32(0), np.uint32(0), np.uint32(0), np.uint32(0), Z4U)    # a K-tile's loads, none
A136 = (np.uint32(0x43084308), np.uint32(0x43084308), np.uint32(0x43084308), np.uint32(0x43084308))   # bf16 136


@cuda.jit(device=True, **_INLINE)
def _a_i4(w, kz0, kz1, m4):
    """The 4 A registers of one 4-bit sub-block (word w, nibble p = register p & 3, half
    p >> 2) as bf16x2 code - zero: 128 + code by a mask-or, then + kz (bf16x2 -(128 + zero))
    of the register's row (even registers row g, odd g + 8). Exact."""
    r0 = fma_bf16x2((w & m4) | O4, ONE2, kz0)
    r1 = fma_bf16x2(((w >> SH4) & m4) | O4, ONE2, kz1)
    r2 = fma_bf16x2(((w >> SH8) & m4) | O4, ONE2, kz0)
    r3 = fma_bf16x2(((w >> SH12) & m4) | O4, ONE2, kz1)
    return (r0, r1, r2, r3)


@cuda.jit(device=True, **_INLINE)
def _kz(q):
    """A zero-point word (bf16 -(128 + zero) of rows g | g + 8) as each row's value in both
    halves of a bf16x2."""
    return (q & LO16) | (q << SH16), (q >> SH16) | (q & HI16)


@cuda.jit(device=True, **_INLINE)
def _a_i8(w, z0, z1, m8):
    """Two A registers from one 8-bit word (bytes: register lo (row g) low / high element, then
    register hi (row g + 8)): code - zero as fp32 by the magic number, packed to bf16x2 (exact);
    z0, z1 = 2^23 + the rows' zero points."""
    f0 = as_f32((w & m8) | MAGIC) - z0
    f1 = as_f32(((w >> SH8) & m8) | MAGIC) - z0
    f2 = as_f32(((w >> SH16) & m8) | MAGIC) - z1
    f3 = as_f32((w >> SH24) | MAGIC) - z1
    return pack_bf16x2(f1, f0), pack_bf16x2(f3, f2)


@cuda.jit(device=True, **_INLINE)
def _a_fp8(w, rz):
    """Two A registers from one word of e4m3 codes (layout as _a_i8): each byte's exponent and
    mantissa shifted into a bf16 (exponent 120 short, subnormals included) and its sign moved,
    then times 2^120 (fma.bf16x2, exact)."""
    f8lo = F8_LO | rz
    f8s = F8_SIGN | rz
    lo = (w & (M8 | rz)) | ((w & (np.uint32(0xFF00) | rz)) << SH8)        # bytes 0, 1 -> halves
    hi = ((w >> SH16) & (M8 | rz)) | ((w >> SH8) & (np.uint32(0x00FF0000) | rz))   # bytes 2, 3 -> halves
    lo = ((lo & f8lo) << SH4) | ((lo & f8s) << SH8)
    hi = ((hi & f8lo) << SH4) | ((hi & f8s) << SH8)
    return fma_bf16x2(lo, TWO120, NEG_ZERO2), fma_bf16x2(hi, TWO120, NEG_ZERO2)


@cuda.jit(device=True, **_INLINE)
def _b(xv):
    """B fragment registers (k 2t, 2t + 1 | 2t + 8, 2t + 9 = the lane's 4 consecutive columns
    of a sub-block) of a 4-tuple of fp32 x."""
    return pack_bf16x2(xv[1], xv[0]), pack_bf16x2(xv[3], xv[2])


@cuda.jit(device=True, **_INLINE)
def _x8(x, xi, nw, ni, ok, normed):
    """8 consecutive fp32 x at flat index xi (times nw[ni ..] when normed) as two 4-tuples, and
    the sum of squares of the raw values; zeros where not ok (tokens past T)."""
    xa = Z4
    xb = Z4
    ss = float32(0.0)
    if ok:
        xa = ldg_v4_f32(x, xi)
        xb = ldg_v4_f32(x, xi + 4)
        if normed:
            ss = (xa[0] * xa[0] + xa[1] * xa[1] + xa[2] * xa[2] + xa[3] * xa[3]
                  + xb[0] * xb[0] + xb[1] * xb[1] + xb[2] * xb[2] + xb[3] * xb[3])
            na = ldg_v4_f32(nw, ni)
            nb = ldg_v4_f32(nw, ni + 4)
            xa = (xa[0] * na[0], xa[1] * na[1], xa[2] * na[2], xa[3] * na[3])
            xb = (xb[0] * nb[0], xb[1] * nb[1], xb[2] * nb[2], xb[3] * nb[3])
    return xa, xb, ss


@cuda.jit(device=True, **_INLINE)
def _scaled(acc, c, s0, s1):
    """acc (rows g, g | g + 8, g + 8 for tokens 2t, 2t + 1) += scale * c."""
    return (acc[0] + s0 * c[0], acc[1] + s0 * c[1], acc[2] + s1 * c[2], acc[3] + s1 * c[3])


@cuda.jit(device=True, **_INLINE)
def _scale_pair(kind, word, mult):
    """(scale of row g, scale of row g + 8) from a scale word (fp8: one fp32 for the tile)."""
    if kind == 2:
        s = as_f32(word) * mult
        return s, s
    s0, s1 = f16x2_to_f32(word)
    return s0 * mult, s1 * mult


@cuda.jit(device=True)
def _tile_i4(w, kz0, kz1, kh0, kh1, b, split, s0a, s0b, s1a, s1b, acc, m4):
    """One 4-bit K-tile of one row tile (w: the lane's 4 words) times one token group's B
    registers b (8: sub-blocks 0..3), scaled and added to acc: per 32-column half (split: the
    group of 32; scales s0* / s1* and zero offsets kz* / kh* of rows g / g + 8) or once for
    the K-tile."""
    c = mma_bf16(_a_i4(w[0], kz0, kz1, m4), b[0], b[1], Z4)
    c = mma_bf16(_a_i4(w[1], kz0, kz1, m4), b[2], b[3], c)
    if split:
        acc = _scaled(acc, c, s0a, s0b)
        c = Z4
    c = mma_bf16(_a_i4(w[2], kh0, kh1, m4), b[4], b[5], c)
    c = mma_bf16(_a_i4(w[3], kh0, kh1, m4), b[6], b[7], c)
    return _scaled(acc, c, s1a, s1b)


@cuda.jit(device=True)
def _tile_b8(kind, w, z0, z1, b, sa, sb, acc, rz):
    """One 8-bit (int8 or fp8) K-tile of one row tile times one token group's B registers b (4:
    sub-blocks 0, 1), scaled and added to acc."""
    if kind == 2:
        a0, a1 = _a_fp8(w[0], rz)
        a2, a3 = _a_fp8(w[1], rz)
        c = mma_bf16((a0, a1, a2, a3), b[0], b[1], Z4)
        a0, a1 = _a_fp8(w[2], rz)
        a2, a3 = _a_fp8(w[3], rz)
        c = mma_bf16((a0, a1, a2, a3), b[2], b[3], c)
    else:
        a0, a1 = _a_i8(w[0], z0, z1, M8 | rz)
        a2, a3 = _a_i8(w[1], z0, z1, M8 | rz)
        c = mma_bf16((a0, a1, a2, a3), b[0], b[1], Z4)
        a0, a1 = _a_i8(w[2], z0, z1, M8 | rz)
        a2, a3 = _a_i8(w[3], z0, z1, M8 | rz)
        c = mma_bf16((a0, a1, a2, a3), b[2], b[3], c)
    return _scaled(acc, c, sa, sb)


@cuda.jit(device=True, **_INLINE)
def _bases(kind, ktw, e, nt, kt_exp, ng, k_exp, ta, tb, lane, g):
    """Word offsets of K-tile 0 of tiles ta, tb of expert e (this lane's 16 code bytes) and
    of their scale words (int: row pair g of group 0; fp8: block 0)."""
    ct = e * nt
    ca = (ct + ta) * kt_exp * TILE_WORDS + lane * 4
    cb = (ct + tb) * kt_exp * TILE_WORDS + lane * 4
    if kind == 2:
        nb128 = k_exp >> 7
        return ca, cb, (ct + ta) * nb128, (ct + tb) * nb128
    return ca, cb, (ct + ta) * ng * 8 + g, (ct + tb) * ng * 8 + g


@cuda.jit(device=True, **_INLINE)
def _ktile_loads(kind, ktw, gshift, split, zp, codes, scales, zeros, ca, cb, ia, ib, kl):
    """The streaming loads of K-tile kl (of the bases' expert) of a tile pair: the lane's 16
    code bytes of each tile, their scale words (split: both halves') and zero-point words
    (a, b, split a, split b). gshift = log2(group) is a build constant."""
    va = ldg_stream_v4_u32(codes, ca + kl * TILE_WORDS)
    vb = ldg_stream_v4_u32(codes, cb + kl * TILE_WORDS)
    if kind == 2:
        ia += (kl * ktw) >> 7
        ib += (kl * ktw) >> 7
    else:
        ia += ((kl * ktw) >> gshift) * 8
        ib += ((kl * ktw) >> gshift) * 8
    sa = ldg_stream_u32(scales, ia)
    sb = ldg_stream_u32(scales, ib)
    ha = uint32(0)
    hb = uint32(0)
    if split:
        ha = ldg_stream_u32(scales, ia + 8)
        hb = ldg_stream_u32(scales, ib + 8)
    qz = Z4U
    if zp:
        za_ = ldg_stream_u32(zeros, ia)
        zb_ = ldg_stream_u32(zeros, ib)
        qz = (za_, zb_, za_, zb_)
        if split:
            qz = (za_, zb_, ldg_stream_u32(zeros, ia + 8), ldg_stream_u32(zeros, ib + 8))
    return va, vb, sa, sb, ha, hb, qz


@cuda.jit(device=True, **_INLINE)
def _k_loads(kind, ktw, gshift, split, zp, down, codes, scales, zeros, ids, tq, nt, kt_exp, ng, k_exp, ta, tb, lane,
             g, base, k):
    """_ktile_loads of K-tile k: dense / MoE gate_up from the warp's bases; MoE down from the
    slot's expert of the concatenated K."""
    ca, cb, ia, ib = base
    kl = k
    if down:
        s_i = k // kt_exp
        ca, cb, ia, ib = _bases(kind, ktw, ids[tq, s_i], nt, kt_exp, ng, k_exp, ta, tb, lane, g)
        kl = k - s_i * kt_exp
    return _ktile_loads(kind, ktw, gshift, split, zp, codes, scales, zeros, ca, cb, ia, ib, kl)


@cuda.jit(device=True, **_INLINE)
def _pass_loads(kind, ktw, gshift, split, zp, down, codes, scales, zeros, ids, tq, nt, kt_exp, ng, k_exp, ta, tb,
                lane, g, base, kt):
    """_k_loads of the UNROLL (4) K-tiles of a full pass from kt."""
    return (_k_loads(kind, ktw, gshift, split, zp, down, codes, scales, zeros, ids, tq, nt, kt_exp, ng, k_exp, ta,
                     tb, lane, g, base, kt),
            _k_loads(kind, ktw, gshift, split, zp, down, codes, scales, zeros, ids, tq, nt, kt_exp, ng, k_exp, ta,
                     tb, lane, g, base, kt + 1),
            _k_loads(kind, ktw, gshift, split, zp, down, codes, scales, zeros, ids, tq, nt, kt_exp, ng, k_exp, ta,
                     tb, lane, g, base, kt + 2),
            _k_loads(kind, ktw, gshift, split, zp, down, codes, scales, zeros, ids, tq, nt, kt_exp, ng, k_exp, ta,
                     tb, lane, g, base, kt + 3))


@cuda.jit(device=True, **_INLINE)
def _a_raw4(w, m4):
    """The 4 A registers of one 4-bit sub-block as bf16x2 128 + code (a mask-or each; m4 the
    mask as a run-time value, so ptxas keeps it in a register for the LOP3 instead of
    re-materialising one of two immediates before each)."""
    return ((w & m4) | O4, ((w >> SH4) & m4) | O4, ((w >> SH8) & m4) | O4, ((w >> SH12) & m4) | O4)


@cuda.jit(device=True, **_INLINE)
def _minus(c, d):
    return (c[0] - d[0], c[1] - d[1], c[2] - d[2], c[3] - d[3])


@cuda.jit(device=True)
def _tile_i4_sym(w, b, split, d0, d1, s0a, s0b, s1a, s1b, acc, m4):
    """_tile_i4 for symmetric int4: the mmas on 128 + code, minus d = 136 * (the sum of the
    bf16 x) from the constant-A mmas shared by the tile pair (d0: the first half, d1: the
    second half (split) or the whole K-tile)."""
    c = mma_bf16(_a_raw4(w[0], m4), b[0], b[1], Z4)
    c = mma_bf16(_a_raw4(w[1], m4), b[2], b[3], c)
    if split:
        acc = _scaled(acc, _minus(c, d0), s0a, s0b)
        c = Z4
    c = mma_bf16(_a_raw4(w[2], m4), b[4], b[5], c)
    c = mma_bf16(_a_raw4(w[3], m4), b[6], b[7], c)
    return _scaled(acc, _minus(c, d1), s1a, s1b)


@cuda.jit(device=True)
def _ktile_math(kind, ktw, split, zp, down, ntg, normed, x, nw, ew, tq, kt_exp, k, t, ok0, ok1, xrow0, xrow1, ld,
                acc, ss, rz):
    """One K-tile of the tile pair: x of the lane's token(s) -> B registers, then per token
    group the two tiles' mmas, scaled into acc (16: token group h, tile a rows g, g | g + 8,
    g + 8 at [8h .. 8h + 3], tile b at [8h + 4 ..]); ss += the raw x's sum of squares."""
    wa, wb, sa, sb, ha, hb, qz = ld
    m4 = M4 | rz
    sw = float32(1.0)
    if down:
        sw = ew[tq, k // kt_exp]
    col = k * ktw + 8 * t
    s0a, s0b = _scale_pair(kind, sa, sw)
    s1a, s1b = _scale_pair(kind, sb, sw)
    t0a, t0b = s0a, s0b
    t1a, t1b = s1a, s1b
    if split:
        t0a, t0b = _scale_pair(kind, ha, sw)
        t1a, t1b = _scale_pair(kind, hb, sw)
    kza0 = kza1 = kzb0 = kzb1 = NEG136
    kha0 = kha1 = khb0 = khb1 = NEG136
    za0 = za1 = zb0 = zb1 = MAGIC_MID
    if zp:
        if kind == 0:                               # bf16 -(128 + zero) of rows g, g + 8, in both halves
            kza0, kza1 = _kz(qz[0])
            kzb0, kzb1 = _kz(qz[1])
            kha0, kha1 = _kz(qz[2])
            khb0, khb1 = _kz(qz[3])
        else:
            za0 = MAGIC_F + float32(qz[0] & LO16)
            za1 = MAGIC_F + float32(qz[0] >> SH16)
            zb0 = MAGIC_F + float32(qz[1] & LO16)
            zb1 = MAGIC_F + float32(qz[1] >> SH16)
    for h in range(ntg):
        xr = xrow0 if h == 0 else xrow1
        okh = ok0 if h == 0 else ok1
        x0, x1, s = _x8(x, xr + col, nw, col, okh, normed)
        ss += s
        b0, b1 = _b(x0)
        b2, b3 = _b(x1)
        if kind == 0:
            x2, x3, s = _x8(x, xr + col + 32, nw, col + 32, okh, normed)
            ss += s
            b4, b5 = _b(x2)
            b6, b7 = _b(x3)
            bb = (b0, b1, b2, b3, b4, b5, b6, b7)
            acc_a = (acc[8 * h], acc[8 * h + 1], acc[8 * h + 2], acc[8 * h + 3])
            acc_b = (acc[8 * h + 4], acc[8 * h + 5], acc[8 * h + 6], acc[8 * h + 7])
            if zp:
                ca4 = _tile_i4(wa, kza0, kza1, kha0, kha1, bb, split, s0a, s0b, t0a, t0b, acc_a, m4)
                cb4 = _tile_i4(wb, kzb0, kzb1, khb0, khb1, bb, split, s1a, s1b, t1a, t1b, acc_b, m4)
            else:
                d0 = mma_bf16(A136, b0, b1, Z4)
                d0 = mma_bf16(A136, b2, b3, d0)
                d1 = d0
                if split:
                    d1 = Z4
                d1 = mma_bf16(A136, b4, b5, d1)
                d1 = mma_bf16(A136, b6, b7, d1)
                ca4 = _tile_i4_sym(wa, bb, split, d0, d1, s0a, s0b, t0a, t0b, acc_a, m4)
                cb4 = _tile_i4_sym(wb, bb, split, d0, d1, s1a, s1b, t1a, t1b, acc_b, m4)
        else:
            bb = (b0, b1, b2, b3)
            ca4 = _tile_b8(kind, wa, za0, za1, bb, s0a, s0b,
                           (acc[8 * h], acc[8 * h + 1], acc[8 * h + 2], acc[8 * h + 3]), rz)
            cb4 = _tile_b8(kind, wb, zb0, zb1, bb, s1a, s1b,
                           (acc[8 * h + 4], acc[8 * h + 5], acc[8 * h + 6], acc[8 * h + 7]), rz)
        if h == 0:
            acc = (ca4[0], ca4[1], ca4[2], ca4[3], cb4[0], cb4[1], cb4[2], cb4[3],
                   acc[8], acc[9], acc[10], acc[11], acc[12], acc[13], acc[14], acc[15])
        else:
            acc = (acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7],
                   ca4[0], ca4[1], ca4[2], ca4[3], cb4[0], cb4[1], cb4[2], cb4[3])
    return acc, ss


@cuda.jit(device=True, **_INLINE)
def _pass_math(kind, ktw, split, zp, down, ntg, normed, x, nw, ew, tq, kt_exp, kt, t, ok0, ok1, xrow0, xrow1, lp,
               acc, ss, rz):
    """_ktile_math of the 4 K-tiles of a full pass (written out: a loop over the buffer would
    stay a loop, its selects costing more than the math)."""
    acc, ss = _ktile_math(kind, ktw, split, zp, down, ntg, normed, x, nw, ew, tq, kt_exp, kt, t, ok0, ok1, xrow0,
                          xrow1, lp[0], acc, ss, rz)
    acc, ss = _ktile_math(kind, ktw, split, zp, down, ntg, normed, x, nw, ew, tq, kt_exp, kt + 1, t, ok0, ok1, xrow0,
                          xrow1, lp[1], acc, ss, rz)
    acc, ss = _ktile_math(kind, ktw, split, zp, down, ntg, normed, x, nw, ew, tq, kt_exp, kt + 2, t, ok0, ok1, xrow0,
                          xrow1, lp[2], acc, ss, rz)
    return _ktile_math(kind, ktw, split, zp, down, ntg, normed, x, nw, ew, tq, kt_exp, kt + 3, t, ok0, ok1, xrow0,
                       xrow1, lp[3], acc, ss, rz)


_BUILDS: dict[tuple[Any, ...], Any] = {}


def gemv_tiled(kind: str, zp: bool, split: bool, mode: str, ntg: int, ways: int, warps: int, min_blocks: int,
               experts: str = "", group: int = 64) -> Any:
    """The build (registered on first use). kind "i4" / "i8" / "fp8"; zp: zero points (int);
    split: int4 groups of 32 (two scales per K-tile; must match group); group: the format's group
    size (fp8: 128; the kernel's gshift argument must equal log2(group)); mode "plain" /
    "normed" / "swiglu" / "normed_swiglu"; ntg: token groups of 8 (T <= 8 * ntg; normed: T =
    1); `ways` K slices per tile pair; experts "" / "gate_up" (mode swiglu) / "down" (plain).
    One signature: (x [T, K] fp32, nw [K], eps, codes u32 [...], scales u32 [...] (fp8: fp32
    bits), zeros u32 [...] (dummy without zero points), gshift = log2(group), n_rows (logical
    N), k_exp (an expert's K; = K for dense), bias [N], out [T, N] ([T, N / 2] swiglu;
    gate_up: [T * k, I]), has_bias, ids [T, k] int32, ew [T, k] fp32 (MoE; dummies
    otherwise)). Grid (ceil(pairs / (warps / ways)), T * k (gate_up) / T (down) / 1), block
    32 * warps."""
    if kind == "fp8":
        group = 128
    key = (kind, zp, split, mode, ntg, ways, warps, min_blocks, experts, group)
    if key not in _BUILDS:
        if (kind not in KINDS or mode not in MODES or ntg not in (1, 2) or ways not in (1, 2, 4, 8)
                or warps not in (2, 4, 8) or ways > warps or not 1 <= min_blocks * warps <= 64
                or (mode.startswith("normed") and ntg != 1) or (split and kind != "i4") or (zp and kind == "fp8")
                or experts not in ("", "gate_up", "down") or group not in (32, 64, 128) or split != (kind == "i4" and group == 32) or (experts == "gate_up" and (mode != "swiglu" or ntg != 1))
                or (experts == "down" and (mode != "plain" or ntg != 1))):
            raise ValueError(f"gemv_tiled: no build {key}")
        _BUILDS[key] = _make(*key)
    return _BUILDS[key]


def build_name(kind: str, zp: bool, split: bool, mode: str, ntg: int, ways: int, warps: int, min_blocks: int,
               experts: str = "", group: int = 64) -> str:
    fmt = kind + ("" if kind == "fp8" else f"g{group}") + ("zp" if zp else "")
    moe = f"_moe_{experts}" if experts else ""
    return f"gemv_tiled_{fmt}_{mode}{moe}_n{ntg}_w{ways}_b{min_blocks}_x{warps}_kernel"


def _make(kind: str, zp: bool, split: bool, mode: str, ntg: int, ways: int, warps: int, min_blocks: int,
          experts: str, group: int) -> Any:
    KIND = KINDS.index(kind)              # 0 int4, 1 int8, 2 fp8
    KTW = 64 if kind == "i4" else 32      # columns per K-tile
    GSHIFT = group.bit_length() - 1       # log2(group): scale index shifts are constants
    ZP = zp
    SPLIT = split
    NTG = ntg
    WAYS = ways
    WARPS = warps
    PAIRS = warps // ways
    SWIGLU = mode in ("swiglu", "normed_swiglu")
    NORMED = mode in ("normed", "normed_swiglu")
    GATE_UP = experts == "gate_up"
    DOWN = experts == "down"
    MOE = experts != ""
    NACC = 8 * ntg + 1

    def gemv_tiled_build(x, nw, eps, codes, scales, zeros, gshift, n_rows, k_exp, bias, out, has_bias, ids, ew):
        red = cuda.shared.array((WARPS, 32, NACC), float32)
        lane = cuda.threadIdx.x & 31
        warp = cuda.threadIdx.x >> 5
        g = lane >> 2
        t = lane & 3
        pair = warp // WAYS
        sl = warp - pair * WAYS
        k_dim = x.shape[1]                          # DOWN: the slots' rows of h concatenated
        n_tok = x.shape[0]
        nt = (n_rows + 15) >> 4                     # row tiles
        kt_exp = k_exp // KTW                       # K-tiles of one expert (dense: of the matrix)
        ng = k_exp >> GSHIFT                        # groups per row (int)
        n_pairs = nt >> 1 if SWIGLU else (nt + 1) >> 1
        p = cuda.blockIdx.x * PAIRS + pair
        live = p < n_pairs                          # dead pairs still reach the barriers
        p = p if live else 0
        if SWIGLU:
            ta = p
            tb = p + (nt >> 1)
            has_b = True
        else:
            ta = 2 * p
            has_b = ta + 1 < nt
            tb = ta + 1 if has_b else ta            # a lone last tile: loaded, never stored
        slot = cuda.blockIdx.y                      # gate_up: routed pair t * k + s; down: token t
        top_k = ids.shape[1]
        tq = slot // top_k if GATE_UP else slot     # the token whose x row the block reads
        ebase = 0
        if MOE:
            grid_dependency_sync()                  # ids come from the router kernel
        if GATE_UP:
            ebase = ids[tq, slot - tq * top_k]
        kt_all = k_dim // KTW
        kt_len = ((kt_all + WAYS - 1) // WAYS)
        kt = sl * kt_len
        kt_end = min(kt_all, kt + kt_len) if live else kt
        z = float32(0.0)
        acc = (z, z, z, z, z, z, z, z, z, z, z, z, z, z, z, z)
        ss = z
        ok0 = g < n_tok                             # this lane's B token g (and g + 8)
        ok1 = NTG > 1 and g + 8 < n_tok
        xrow0 = g * k_dim
        xrow1 = (g + 8) * k_dim
        if MOE:
            ok0 = g == 0                            # one x row per block (B column 0)
            xrow0 = tq * k_dim
        rz = uint32(n_rows >> 31)                   # 0 (n_rows >= 0), unknown to ptxas: masks stay in registers
        # software pipeline over full passes of UNROLL K-tiles, two register buffers (la, lb):
        # the next pass's code / scale loads are issued before this pass's math
        base = _bases(KIND, KTW, ebase, nt, kt_exp, ng, k_exp, ta, tb, lane, g)
        la = (ZL, ZL, ZL, ZL)
        if kt + UNROLL <= kt_end:
            la = _pass_loads(KIND, KTW, GSHIFT, SPLIT, ZP, DOWN, codes, scales, zeros, ids, tq, nt, kt_exp, ng,
                             k_exp, ta, tb, lane, g, base, kt)
        if not MOE:
            grid_dependency_sync()                  # x is the previous kernel's output; the codes were not
        lb = la
        while kt + UNROLL <= kt_end:
            more = kt + 2 * UNROLL <= kt_end
            if more:
                lb = _pass_loads(KIND, KTW, GSHIFT, SPLIT, ZP, DOWN, codes, scales, zeros, ids, tq, nt, kt_exp, ng,
                                 k_exp, ta, tb, lane, g, base, kt + UNROLL)
            acc, ss = _pass_math(KIND, KTW, SPLIT, ZP, DOWN, NTG, NORMED, x, nw, ew, tq, kt_exp, kt, t, ok0, ok1,
                                 xrow0, xrow1, la, acc, ss, rz)
            kt += UNROLL
            if not more:
                break
            more = kt + 2 * UNROLL <= kt_end
            if more:
                la = _pass_loads(KIND, KTW, GSHIFT, SPLIT, ZP, DOWN, codes, scales, zeros, ids, tq, nt, kt_exp, ng,
                                 k_exp, ta, tb, lane, g, base, kt + UNROLL)
            acc, ss = _pass_math(KIND, KTW, SPLIT, ZP, DOWN, NTG, NORMED, x, nw, ew, tq, kt_exp, kt, t, ok0, ok1,
                                 xrow0, xrow1, lb, acc, ss, rz)
            kt += UNROLL
            if not more:
                break
        while kt < kt_end:                          # the last < UNROLL K-tiles, one at a time
            ld = _k_loads(KIND, KTW, GSHIFT, SPLIT, ZP, DOWN, codes, scales, zeros, ids, tq, nt, kt_exp, ng, k_exp,
                          ta, tb, lane, g, base, kt)
            acc, ss = _ktile_math(KIND, KTW, SPLIT, ZP, DOWN, NTG, NORMED, x, nw, ew, tq, kt_exp, kt, t, ok0, ok1,
                                  xrow0, xrow1, ld, acc, ss, rz)
            kt += 1
        grid_dependency_sync()                      # dead pairs and empty slices too, before the stores
        if NORMED:
            ss = warp_sum(ss)
        if WAYS > 1:                                # the slices' sums meet in a fixed order
            for i in range(8 * NTG):
                red[warp, lane, i] = acc[i]
            red[warp, lane, NACC - 1] = ss
            cuda.syncthreads()
            v = cuda.local.array(16, float32)
            for i in range(8 * NTG):
                v[i] = float32(0.0)
            ss = float32(0.0)
            for j in range(WAYS):
                for i in range(8 * NTG):
                    v[i] += red[warp - sl + j, lane, i]
                ss += red[warp - sl + j, lane, NACC - 1]
            if NTG == 1:
                acc = (v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], z, z, z, z, z, z, z, z)
            else:
                acc = (v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7],
                       v[8], v[9], v[10], v[11], v[12], v[13], v[14], v[15])
        if live and sl == 0:
            inv = float32(1.0)
            if NORMED:
                inv = float32(1.0) / math.sqrt(ss / float32(k_dim) + eps)
            for h in range(NTG):
                for c in range(4):
                    tok = 2 * t + (c & 1) + 8 * h
                    rl = g + 8 * (c >> 1)
                    va = acc[8 * h + c] * inv
                    vb = acc[8 * h + 4 + c] * inv
                    if GATE_UP:
                        if t == 0 and (c & 1) == 0:
                            out[slot, ta * 16 + rl] = va / (float32(1.0) + math.exp(-va)) * vb
                    elif DOWN:
                        if t == 0 and (c & 1) == 0:
                            ra = ta * 16 + rl
                            if ra < n_rows:
                                out[tq, ra] = va + (bias[tq * n_rows + ra] if has_bias != 0 else float32(0.0))
                            rb = tb * 16 + rl
                            if has_b and rb < n_rows:
                                out[tq, rb] = vb + (bias[tq * n_rows + rb] if has_bias != 0 else float32(0.0))
                    elif tok < n_tok:
                        if SWIGLU:
                            out[tok, ta * 16 + rl] = va / (float32(1.0) + math.exp(-va)) * vb
                        else:
                            ra = ta * 16 + rl
                            if ra < n_rows:
                                out[tok, ra] = va + (bias[ra] if has_bias != 0 else float32(0.0))
                            rb = tb * 16 + rl
                            if has_b and rb < n_rows:
                                out[tok, rb] = vb + (bias[rb] if has_bias != 0 else float32(0.0))

    gemv_tiled_build.__name__ = build_name(kind, zp, split, mode, ntg, ways, warps, min_blocks, experts, group)
    return kernel((f32_2, f32_1, f32, u32_1, u32_1, u32_1, i32, i32, i32, f32_1, f32_2, i32, i32_2, f32_2),
                  sim=True, fastmath=True, launch_bounds=(32 * warps, min_blocks),
                  self_sync=not MOE)(gemv_tiled_build)


DEQUANT_THREADS = 256


@kernel((u32_1, u32_1, u32_1, i32, i32, i32, u16_2), sim=True, launch_bounds=(DEQUANT_THREADS, 4))
def dequant_tiled_bf16_kernel(codes, scales, zeros, kind, zp, gshift, out):
    """out [N, K] bf16 bits = the tiled weight's values (round to nearest even), for the prefill
    GEMMs. A warp per K-tile (grid-stride): each lane loads its 16 code bytes (one coalesced
    512-byte read per warp) and writes its rows g and g + 8 as 8 consecutive columns each per
    32-column half (16-byte stores). codes: the tiled words [NT * KT * 128] (quant/tiled.py),
    kind 0 int4 / 1 int8 / 2 fp8."""
    n_rows = out.shape[0]
    k_dim = out.shape[1]
    ktw = 64 if kind == 0 else 32
    kts = k_dim // ktw
    ng = k_dim >> gshift
    lane = cuda.threadIdx.x & 31
    g = lane >> 2
    t = lane & 3
    w = cuda.local.array(4, uint32)
    v = cuda.local.array(8, uint16)
    n_warps = cuda.gridDim.x * (DEQUANT_THREADS // 32)
    for tl in range(cuda.blockIdx.x * (DEQUANT_THREADS // 32) + (cuda.threadIdx.x >> 5), codes.shape[0] // TILE_WORDS,
                    n_warps):
        rt = tl // kts
        kt = tl - rt * kts
        w0, w1, w2, w3 = ldg_stream_v4_u32(codes, tl * TILE_WORDS + lane * 4)
        w[0] = w0
        w[1] = w1
        w[2] = w2
        w[3] = w3
        for hr in range(2):                         # row g, row g + 8
            row = rt * 16 + g + 8 * hr
            if row >= n_rows:
                continue
            for h in range(2 if kind == 0 else 1):  # 32-column halves of an int4 K-tile
                col0 = kt * ktw + 32 * h + 8 * t
                if kind == 2:
                    s = as_f32(ldg_stream_u32(scales, rt * (k_dim >> 7) + (col0 >> 7)))
                    zf = float32(0.0)
                else:
                    si = (rt * ng + (col0 >> gshift)) * 8 + g
                    s0, s1 = f16x2_to_f32(ldg_stream_u32(scales, si))
                    s = s1 if hr == 1 else s0
                    zf = float32(8.0 if kind == 0 else 128.0)
                    if zp != 0:
                        zw = ldg_stream_u32(zeros, si)
                        zh = (zw >> SH16) if hr == 1 else (zw & LO16)
                        if kind == 0:               # bf16 -(128 + zero)
                            zf = -as_f32(uint32(zh) << SH16) - float32(128.0)
                        else:
                            zf = float32(zh)
                for ee in range(8):                 # column col0 + ee
                    j = 2 * h + (ee >> 2) if kind == 0 else (ee >> 2)
                    e = ee & 3
                    r = 2 * (e >> 1) + hr
                    hi = e & 1
                    if kind == 0:
                        c = int32((w[j] >> uint32(4 * (r + 4 * hi))) & uint32(15))
                    else:
                        c = int32((w[2 * j + (r >> 1)] >> uint32(8 * (2 * (r & 1) + hi))) & uint32(255))
                    if kind == 2:
                        f = as_f32(uint32((c & 0x80) << 24) | uint32((c & 0x7F) << 20)) * float32(2.0 ** 120)
                        val = f * s
                    else:
                        val = s * (float32(c) - zf)
                    v[ee] = f32_to_bf16(val)
                st_v4_u32(out, row * k_dim + col0, uint32(v[0]) | (uint32(v[1]) << SH16),
                          uint32(v[2]) | (uint32(v[3]) << SH16), uint32(v[4]) | (uint32(v[5]) << SH16),
                          uint32(v[6]) | (uint32(v[7]) << SH16))


def dequant_grid(n_bytes: int) -> int:
    """Blocks of dequant_tiled_bf16_kernel for n_bytes of codes (a warp per 512-byte K-tile)."""
    return max(1, min(4096, -(-n_bytes // (TILE_WORDS * 4 * (DEQUANT_THREADS // 32)))))


@kernel((u32_1,), sim=True)
def fp8_finite_codes_kernel(codes):
    """codes &= 0xBF per byte: random e4m3 codes with exponent < 8 (|value| < 2), never NaN
    (random fp8 weights for benchmarks)."""
    for i in range(cuda.grid(1), codes.shape[0], cuda.gridsize(1)):
        codes[i] = codes[i] & np.uint32(0xBFBFBFBF)


# Builds registered at import so that the compile tests see them: one per code path (int4
# symmetric, int8, fp8 with the norm and SwiGLU fused, MoE down); each is a large unrolled
# function (20-40 s of numba compile on a 2-core machine), so the others are built on first use.
BUILDS = (("i4", False, False, "plain", 1, 4, 4, 3),
          ("i8", False, False, "plain", 1, 2, 4, 3, "", 128),
          ("fp8", False, False, "normed_swiglu", 1, 1, 4, 3, "", 128),
          ("i4", False, False, "plain", 1, 8, 8, 1, "down"))
for _build in BUILDS:
    gemv_tiled(*_build)


EMBED_THREADS = 256


@kernel((u32_1, u32_1, u32_1, i32, i32, i32, i32, i32_1, f32_2), sim=True, launch_bounds=(EMBED_THREADS, 4))
def embedding_tiled_kernel(codes, scales, zeros, kind, zp, gshift, n_rows, ids, out):
    """out[t, c] = W[ids[t], c] of a tiled weight [N, K] (the embedding lookup of a quantized
    table; out [T, K] fp32). grid (ceil(K / 256), T), block 256: a thread per column, which
    finds its code in the row's K-tile through quant/tiled.py's lane map."""
    t_i = cuda.blockIdx.y
    c = cuda.blockIdx.x * EMBED_THREADS + cuda.threadIdx.x
    k_dim = out.shape[1]
    if c >= k_dim:
        return
    r = ids[t_i]
    ktw = 64 if kind == 0 else 32
    kts = k_dim // ktw
    rt = r >> 4
    rl = r & 15
    g = rl & 7
    hr = rl >> 3
    kt = c // ktw
    ci = c - kt * ktw
    if kind == 0:
        h = ci >> 5
        rem = ci & 31
        t = rem >> 3
        q = rem & 7
        j = 2 * h + (q >> 2)
    else:
        t = ci >> 3
        q = ci & 7
        j = q >> 2
    e = q & 3
    rr = 2 * (e >> 1) + hr
    hi = e & 1
    lane = 4 * g + t
    base = (rt * kts + kt) * TILE_WORDS + lane * 4
    if kind == 0:
        word = codes[base + j]
        v = int32((word >> uint32(4 * (rr + 4 * hi))) & uint32(15))
    else:
        word = codes[base + 2 * j + (rr >> 1)]
        v = int32((word >> uint32(8 * (2 * (rr & 1) + hi))) & uint32(255))
    if kind == 2:
        f = as_f32(uint32((v & 0x80) << 24) | uint32((v & 0x7F) << 20)) * float32(2.0 ** 120)
        out[t_i, c] = f * as_f32(scales[rt * (k_dim >> 7) + (c >> 7)])
    else:
        si = (rt * (k_dim >> gshift) + (c >> gshift)) * 8 + g
        s0, s1 = f16x2_to_f32(scales[si])
        s = s1 if hr == 1 else s0
        zf = float32(8.0 if kind == 0 else 128.0)
        if zp != 0:
            zw = zeros[si]
            zh = (zw >> SH16) if hr == 1 else (zw & LO16)
            if kind == 0:
                zf = -as_f32(uint32(zh) << SH16) - float32(128.0)
            else:
                zf = float32(zh)
        out[t_i, c] = s * (float32(v) - zf)


# ---------------------------------------------------------------- one-token builds (gemv_t1)
# The decode step's GEMVs (T = 1, dense): fp16 tensor cores, weights streamed through a
# per-warp shared-memory ring of cp.async copies (no registers held by loads in flight), x
# staged once per block as fp16 (times a power of two that keeps it in range) with the sums
# the code offsets need. See gemv_t1 for the scheme.

def _t1_lds(n: int) -> Any:
    """ld.shared.v{n}.u32 at a 32-bit shared address (n = 1: a uint32; else an n-tuple)."""
    def typer(typingctx, saddr):
        if not isinstance(saddr, nbtypes.Integer):
            return None
        ret = nbtypes.uint32 if n == 1 else nbtypes.UniTuple(nbtypes.uint32, n)

        def codegen(context, builder, sig, args):
            a = context.cast(builder, args[0], sig.args[0], nbtypes.uint32)
            if n == 1:
                return _asm(builder, "ld.shared.u32 $0, [$1];", "=r,r,~{memory}", _I32, [a])
            regs = ",".join(f"${i}" for i in range(n))
            r = _asm(builder, f"ld.shared.v{n}.u32 {{{regs}}}, [${n}];", ",".join(["=r"] * n) + ",r,~{memory}",
                     ir.LiteralStructType([_I32] * n), [a])
            return context.make_tuple(builder, ret, [builder.extract_value(r, j) for j in range(n)])

        return ret(saddr), codegen

    typer.__name__ = f"lds{32 * n}"
    return intrinsic(typer)


def _t1_prmt(sel: int) -> Any:
    """prmt.b32 d, a, b, sel (a constant selector): bytes of (b:a) picked per nibble of sel."""
    def typer(typingctx, a, b):
        if not isinstance(a, nbtypes.Integer) or not isinstance(b, nbtypes.Integer):
            return None

        def codegen(context, builder, sig, args):
            av = context.cast(builder, args[0], sig.args[0], nbtypes.uint32)
            bv = context.cast(builder, args[1], sig.args[1], nbtypes.uint32)
            return _asm(builder, f"prmt.b32 $0, $1, $2, {sel:#x};", "=r,r,r", _I32, [av, bv], side_effect=False)

        return nbtypes.uint32(a, b), codegen

    typer.__name__ = f"prmt_{sel:x}"
    return intrinsic(typer)


@intrinsic
def _t1_lop3_or(typingctx, a, b, c):
    """(a & b) | c in one lop3.b32 (LLVM would split or reassociate the pair)."""
    if not all(isinstance(v, nbtypes.Integer) for v in (a, b, c)):
        return None

    def codegen(context, builder, sig, args):
        v = [context.cast(builder, args[i], sig.args[i], nbtypes.uint32) for i in range(3)]
        return _asm(builder, "lop3.b32 $0, $1, $2, $3, 0xEA;", "=r,r,r,r", _I32, v, side_effect=False)

    return nbtypes.uint32(a, b, c), codegen


@intrinsic
def _t1_f32_bits(typingctx, v):
    """The bits of an fp32 as uint32 (mov.b32)."""
    if not isinstance(v, nbtypes.Float):
        return None

    def codegen(context, builder, sig, args):
        f = context.cast(builder, args[0], sig.args[0], nbtypes.float32)
        return builder.bitcast(f, _I32)

    return nbtypes.uint32(v), codegen


@intrinsic
def _t1_e4m3x4(typingctx, w):
    """Four e4m3 bytes -> two f16x2 words (bytes 0, 1 -> the first; 2, 3 -> the second), exact:
    cvt.rn.f16x2.e4m3x2 on cc >= 8.9, else by bit moves and a multiplication by 2^8."""
    if not isinstance(w, nbtypes.Integer):
        return None

    def codegen(context, builder, sig, args):
        from numba.cuda.core import targetconfig

        x = context.cast(builder, args[0], sig.args[0], nbtypes.uint32)
        cc = targetconfig.ConfigStack().top().compute_capability
        if cc is not None and tuple(cc[:2]) >= (8, 9):
            asm = ("{ .reg .b16 l, h; mov.b32 {l, h}, $2; cvt.rn.f16x2.e4m3x2 $0, l; "
                   "cvt.rn.f16x2.e4m3x2 $1, h; }")
        else:
            asm = ("{ .reg .b32 a, b, c, d; "
                   "prmt.b32 a, $2, 0, 0x7170; prmt.b32 b, $2, 0, 0x7372; "
                   "and.b32 c, a, 0x007F007F; shl.b32 c, c, 7; and.b32 d, a, 0x00800080; shl.b32 d, d, 8; "
                   "or.b32 c, c, d; mul.rn.f16x2 $0, c, 0x5C005C00; "
                   "and.b32 c, b, 0x007F007F; shl.b32 c, c, 7; and.b32 d, b, 0x00800080; shl.b32 d, d, 8; "
                   "or.b32 c, c, d; mul.rn.f16x2 $1, c, 0x5C005C00; }")
        r = _asm(builder, asm, "=r,=r,r", ir.LiteralStructType([_I32, _I32]), [x], side_effect=False)
        return context.make_tuple(builder, nbtypes.UniTuple(nbtypes.uint32, 2),
                                  [builder.extract_value(r, 0), builder.extract_value(r, 1)])

    return nbtypes.UniTuple(nbtypes.uint32, 2)(w), codegen


mma_f16 = _make_mma(
    "mma_f16", "m16n8k16.row.col.f32.f16.f16.f32", lambda t: isinstance(t, nbtypes.Integer),
    "c += A(16x16 fp16, 4 regs) . B(16x8 fp16, 2 regs), fp32 accumulators (4-tuple).")
lds32 = _t1_lds(1)
lds64 = _t1_lds(2)
lds128 = _t1_lds(4)
prmt_lo = _t1_prmt(0x4140)          # bytes 0, 1 of a -> low bytes of the halves, b's byte 0 above
prmt_hi = _t1_prmt(0x4342)          # bytes 2, 3 of a likewise
cp_async4 = cp_async4_l2
cp_async16w = cp_async16_l2
lop3_or = _t1_lop3_or
f32_bits = _t1_f32_bits
e4m3x4 = _t1_e4m3x4
T1_WAITS = {n: _make_noarg(f"cp_async_wait{n}", f"cp.async.wait_group {n};") for n in range(8)}

if config.ENABLE_CUDASIM:          # the simulator's stand-ins (addresses are host addresses there)
    import ctypes

    from ninfer_nb.kernels.common import ptx_sim as _sim

    def _sim_words(addr: int, n: int) -> np.ndarray:
        return np.frombuffer(ctypes.string_at(int(addr), 4 * n), np.uint32)

    def lds32(saddr):  # type: ignore[no-redef]
        return np.uint32(_sim_words(saddr, 1)[0])

    def lds64(saddr):  # type: ignore[no-redef]
        w = _sim_words(saddr, 2)
        return np.uint32(w[0]), np.uint32(w[1])

    def lds128(saddr):  # type: ignore[no-redef]
        w = _sim_words(saddr, 4)
        return np.uint32(w[0]), np.uint32(w[1]), np.uint32(w[2]), np.uint32(w[3])

    def _sim_prmt(a, b, sel: int) -> np.uint32:
        src = int(a) & 0xFFFFFFFF | ((int(b) & 0xFFFFFFFF) << 32)
        r = 0
        for i in range(4):
            r |= ((src >> (8 * ((sel >> (4 * i)) & 7))) & 0xFF) << (8 * i)
        return np.uint32(r)

    def prmt_lo(a, b):  # type: ignore[no-redef]
        return _sim_prmt(a, b, 0x4140)

    def prmt_hi(a, b):  # type: ignore[no-redef]
        return _sim_prmt(a, b, 0x4342)

    def lop3_or(a, b, c):  # type: ignore[no-redef]
        return np.uint32((int(a) & int(b)) | int(c))

    def cp_async4(saddr, gaddr) -> None:  # type: ignore[no-redef]
        ctypes.memmove(int(saddr), int(gaddr), 4)

    cp_async16w = _sim.cp_async16

    def pack_f16x2(hi, lo):  # type: ignore[no-redef]
        h = np.array([lo, hi], np.float32).astype(np.float16).view(np.uint16).astype(np.uint32)
        return np.uint32(h[0] | (h[1] << 16))

    def f32_bits(v):  # type: ignore[no-redef]
        return np.float32(v).view(np.uint32)

    def _e4m3(b: int) -> float:
        e, m = (b >> 3) & 15, b & 7
        v = m * 2.0 ** -9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        return -v if b & 0x80 else v

    def _f16_word(lo: float, hi: float) -> np.uint32:
        h = np.array([lo, hi], np.float32).astype(np.float16).view(np.uint16).astype(np.uint32)
        return np.uint32(h[0] | (h[1] << 16))

    def e4m3x4(w):  # type: ignore[no-redef]
        w = int(w)
        b = [(w >> (8 * i)) & 0xFF for i in range(4)]
        return _f16_word(_e4m3(b[0]), _e4m3(b[1])), _f16_word(_e4m3(b[2]), _e4m3(b[3]))

    def mma_f16(a, b0, b1, c):  # type: ignore[no-redef]
        """ptx_sim.mma_bf16 with fp16 operands."""
        dep, barrier, lane = _sim._slot()
        dep.a[lane] = [int(v) & 0xFFFFFFFF for v in a]
        dep.b[lane] = [int(b0) & 0xFFFFFFFF, int(b1) & 0xFFFFFFFF]
        barrier.wait()
        amat = np.zeros((16, 16), np.float64)
        bmat = np.zeros((16, 8), np.float64)
        ah = dep.a.astype(np.uint32)
        amat[_sim._A_ROW, _sim._A_COL] = (ah & 0xFFFF).astype(np.uint16).view(np.float16)
        amat[_sim._A_ROW, _sim._A_COL + 1] = (ah >> 16).astype(np.uint16).view(np.float16)
        bh = dep.b.astype(np.uint32)
        bmat[_sim._B_ROW, _sim._B_COL] = (bh & 0xFFFF).astype(np.uint16).view(np.float16)
        bmat[_sim._B_ROW + 1, _sim._B_COL] = (bh >> 16).astype(np.uint16).view(np.float16)
        g, t = lane >> 2, lane & 3
        r = amat[[g, g + 8]] @ bmat[:, 2 * t: 2 * t + 2]
        return (np.float32(c[0] + r[0, 0]), np.float32(c[1] + r[0, 1]),
                np.float32(c[2] + r[1, 0]), np.float32(c[3] + r[1, 1]))

    T1_WAITS = {n: _sim.cp_async_noop for n in range(8)}


if config.ENABLE_CUDASIM:
    def _gp(a):
        """A global address as the kernels compute with it (the simulator: a host address)."""
        return np.int64(gptr(a))

    def _saddr(v):
        """A shared address as the kernels compute with it (the simulator: a host address)."""
        return np.int64(v)
else:
    _gp = gptr

    @cuda.jit(device=True, **_INLINE)
    def _saddr(v):
        """A shared address as the kernels compute with it: 32 bits."""
        return uint32(v)


H1024 = np.uint32(0x64006400)       # f16x2 (1024, 1024); | a nibble (bits 0..3): 1024 + code, (bits 4..7): 1024 + 16 code
M0F = np.uint32(0x000F000F)
MF0 = np.uint32(0x00F000F0)
H64 = np.uint32(0x64646464)         # prmt source: the high byte of f16 1024
SH7 = np.uint32(7)
T1_ZF = (float32(0.0), float32(0.0), float32(0.0), float32(0.0))
T1_SMEM_MAX = 226 * 1024           # dynamic shared memory a block may ask for (227 KB less the static part)


def t1_words(kind: str, zp: bool, split: bool) -> int:
    """Scale / zero words per lane of a ring stage: (a, b) per group of the K-tile, the zero words alike."""
    return 2 * (2 if split else 1) * (2 if zp else 1)


def t1_stage_bytes(kind: str, zp: bool, split: bool) -> int:
    """Bytes of one ring stage (a K-tile of a tile pair): 1024 code bytes + the lanes' words."""
    return 1024 + 32 * 4 * t1_words(kind, zp, split)


def t1_x_bytes(k: int) -> int:
    """Shared bytes of the staged x: K fp16 values and K / 32 fp32 sums, 128-byte aligned."""
    return (2 * k + 4 * (k // 32) + 127) // 128 * 128


def t1_smem(kind: str, zp: bool, split: bool, warps: int, stages: int, k: int) -> int:
    """Dynamic shared memory of a gemv_t1 launch for K = k (+ 128: the kernel aligns its base)."""
    return 128 + t1_x_bytes(k) + warps * stages * t1_stage_bytes(kind, zp, split)


_T1: dict[tuple[Any, ...], Any] = {}


def gemv_t1(kind: str, zp: bool, split: bool, mode: str, ways: int, warps: int, stages: int, min_blocks: int,
            group: int = 64, experts: str = "") -> Any:
    """The one-token build (registered on first use): y[1, N] = x[1, K] @ W^T on the tiled layout,
    same signature and grid as `gemv_tiled` (grid (ceil(pairs / (warps / ways)), 1), block
    32 * warps), launched with t1_smem(...) bytes of dynamic shared memory.

    Each block first issues its warps' first `stages - 1` K-tiles of weight copies (cp.async,
    before the grid-dependency wait), then stages x: every thread reads x (times the norm weight
    in normed modes; the sum of squares on the side), the block takes max |x|, and stores x *
    2^-e as fp16 (|x * 2^-e| < 2^15) and the fp32 sum of each 32 stored values. A warp owns a
    tile pair and a K slice; per K-tile it waits for the oldest copy group, reads its lane's 16
    code bytes of each tile and its scale words from the ring, issues the copies of the K-tile
    `stages - 1` ahead into the slot it just read, and runs fp16 mmas whose A registers are
    built from the codes with one LOP3 each (int4: 1024 + code, or 1024 + 16 code for the rows
    g + 8 nibbles; int8: one PRMT per register, 1024 + code; fp8: cvt e4m3x2). B is the staged
    x in every column (all 8 mma columns alike: no selects), so each lane's c[0], c[2] are its
    rows g, g + 8. Offsets leave through the sums: acc += s * c, cr += s * X (X = the sum of x
    over the group's columns), y = (acc - off * cr) (* 1/16 for int4 rows g + 8) * 2^e (* 1 /
    rms). K slices of a pair meet in shared memory in a fixed order.
    experts "gate_up" (mode swiglu) / "down" (plain): the MoE builds with gemv_tiled's grid and
    arguments (one x row per block); down folds the slot weights into the staged x and finds
    each K-tile's expert; both wait for the router at entry and copy after staging."""
    if kind == "fp8":
        group = 128
    key = (kind, zp, split, mode, ways, warps, stages, min_blocks, group, experts)
    if key not in _T1:
        if (kind not in KINDS or mode not in MODES or ways not in (1, 2, 4, 8, 16) or warps not in (2, 4, 8, 16)
                or ways > warps or not 2 <= stages <= 8 or not 1 <= min_blocks * warps <= 64
                or (split and kind != "i4") or (zp and kind == "fp8") or group not in (32, 64, 128)
                or split != (kind == "i4" and group == 32) or experts not in ("", "gate_up", "down")
                or (experts == "gate_up" and mode != "swiglu") or (experts == "down" and mode != "plain")):
            raise ValueError(f"gemv_t1: no build {key}")
        _T1[key] = _make_t1(*key)
    return _T1[key]


def t1_name(kind: str, zp: bool, split: bool, mode: str, ways: int, warps: int, stages: int, min_blocks: int,
            group: int = 64, experts: str = "") -> str:
    fmt = kind + ("" if kind == "fp8" else f"g{group}") + ("zp" if zp else "")
    moe = f"_moe_{experts}" if experts else ""
    return f"gemv_t1_{fmt}_{mode}{moe}_w{ways}_x{warps}_s{stages}_b{min_blocks}_kernel"


def _make_t1(kind: str, zp: bool, split: bool, mode: str, ways: int, warps: int, stages: int, min_blocks: int,
             group: int, experts: str) -> Any:
    KIND = KINDS.index(kind)
    KTW = 64 if kind == "i4" else 32
    GSHIFT = group.bit_length() - 1
    ZP = zp
    SPLIT = split
    WAYS = ways
    WARPS = warps
    TB = 32 * warps
    PAIRS = warps // ways
    S = stages
    NWD = t1_words(kind, zp, split)           # words per lane per stage
    WB = int32(4 * NWD)
    STAGE = int32(t1_stage_bytes(kind, zp, split))
    KTW32 = int32(KTW)
    I1 = int32(1)
    I2, I3, I4, I8, I12, I16, I512, I1024 = (int32(v) for v in (2, 3, 4, 8, 12, 16, 512, 1024))
    SM1 = int32(stages - 1)
    KPG = (group // KTW - 1) if group > KTW else 0             # K-tiles per group - 1 (a mask)
    GSTEP = (KTW // group) * 32 if group <= KTW else 0
    GATE_UP = experts == "gate_up"
    DOWN = experts == "down"
    MOE = experts != ""
    SWIGLU = mode in ("swiglu", "normed_swiglu")
    NORMED = mode in ("normed", "normed_swiglu")
    WAIT = T1_WAITS[S - 2]
    OFF0 = float32(1032.0 if KIND == 0 else 1152.0)      # symmetric: 1024 + midpoint (int4 rows g, int8)
    OFF1 = float32(1024.0 + 16 * 8 if KIND == 0 else 1152.0)
    R1 = float32(1.0 / 16.0 if KIND == 0 else 1.0)       # int4 rows g + 8 came out 16 x

    @cuda.jit(device=True, **_INLINE)
    def issue(slot, lane, pa, pb, psa, psb, pza, pzb):
        """The copies of a K-tile into ring slot `slot`: the lane's 16 code bytes of the two tiles
        (pa, pb) and its scale (zero) words of their group(s) (psa, psb (pza, pzb))."""
        cp_async16w(slot + lane * I16, pa)
        cp_async16w(slot + I512 + lane * I16, pb)
        wp = slot + I1024 + lane * WB
        cp_async4(wp, psa)
        cp_async4(wp + I4, psb)
        if SPLIT:
            cp_async4(wp + I8, psa + 32)
            cp_async4(wp + I12, psb + 32)
        if ZP:
            zo = int32(4 * (2 if SPLIT else 1) * 2)
            cp_async4(wp + zo, pza)
            cp_async4(wp + zo + I4, pzb)
            if SPLIT:
                cp_async4(wp + zo + I8, pza + 32)
                cp_async4(wp + zo + I12, pzb + 32)

    @cuda.jit(device=True, **_INLINE)
    def slot_ptrs(kt, kt_exp, eids, nt, ta, tb, lane, g, k_exp, codes, scales, zeros):
        """MoE down: the pointers of K-tile kt of the slots' concatenated K (slot kt // kt_exp,
        its expert from eids), as issue takes them."""
        s_i = kt // kt_exp
        kl = kt - s_i * kt_exp
        e = int64(eids[s_i])
        tea = e * nt + ta
        teb = e * nt + tb
        pa = _gp(codes) + (tea * kt_exp + kl) * 512 + lane * 16
        pb = _gp(codes) + (teb * kt_exp + kl) * 512 + lane * 16
        if KIND == 2:
            nb = k_exp >> 7
            oa = (tea * nb + ((kl * KTW) >> 7)) * 4
            ob = (teb * nb + ((kl * KTW) >> 7)) * 4
        else:
            ng = k_exp >> GSHIFT
            oa = ((tea * ng + ((kl * KTW) >> GSHIFT)) * 8 + g) * 4
            ob = ((teb * ng + ((kl * KTW) >> GSHIFT)) * 8 + g) * 4
        return pa, pb, _gp(scales) + oa, _gp(scales) + ob, _gp(zeros) + oa, _gp(zeros) + ob

    @cuda.jit(device=True, **_INLINE)
    def sstep(kt):
        """Bytes from K-tile kt's scale word to K-tile kt + 1's (a row pair's words of the next group)."""
        if KIND == 2:
            return int32(4) if ((kt + 1) & 3) == 0 else int32(0)      # fp8: a word per 128 columns
        if KPG == 0:
            return int32(GSTEP)                                     # a group or two per K-tile
        return int32(32) if ((kt + 1) & KPG) == 0 else int32(0)    # groups longer than a K-tile

    @cuda.jit(device=True, **_INLINE)
    def a_i4(w, m0f, mf0, h1024):
        """(masks as run-time values: ptxas keeps them in registers for the LOP3s)"""
        w8 = w >> SH8
        return (lop3_or(w, m0f, h1024), lop3_or(w, mf0, h1024), lop3_or(w8, m0f, h1024), lop3_or(w8, mf0, h1024))

    @cuda.jit(device=True, **_INLINE)
    def a_b8(w0, w1):
        if KIND == 2:
            r0, r1 = e4m3x4(w0)
            r2, r3 = e4m3x4(w1)
            return (r0, r1, r2, r3)
        return (prmt_lo(w0, H64), prmt_hi(w0, H64), prmt_lo(w1, H64), prmt_hi(w1, H64))

    @cuda.jit(device=True, **_INLINE)
    def offs(zw):
        """(row g, row g + 8) offsets of a zero word: int4 bf16 -(128 + z) -> 1024 + z, 1024 + 16 z;
        int8 z | z' << 16 -> 1024 + z."""
        if KIND == 0:
            v0 = as_f32(zw << SH16)
            v1 = as_f32(zw & HI16)
            return float32(896.0) - v0, float32(-1024.0) - float32(16.0) * v1
        return float32(1024.0) + float32(zw & LO16), float32(1024.0) + float32(zw >> SH16)

    def gemv_t1_build(x, nw, eps, codes, scales, zeros, gshift, n_rows, k_exp, bias, out, has_bias, ids, ew):
        smem = cuda.shared.array(0, uint32)
        red = cuda.shared.array(64, float32)
        eids = cuda.shared.array(32, int32)
        tid = cuda.threadIdx.x
        lane = int32(tid & 31)
        warp = int32(tid >> 5)
        g = lane >> I2
        t = lane & I3
        pair = warp // WAYS
        sl = warp - pair * WAYS
        k_dim = x.shape[1]                              # DOWN: the slots' rows of h concatenated
        nt = (n_rows + 15) >> 4
        kt_all = k_dim // KTW
        kt_exp = k_exp // KTW                           # K-tiles of one expert (dense: of the matrix)
        n_pairs = nt >> 1 if SWIGLU else (nt + 1) >> 1
        top_k = ids.shape[1]
        by = cuda.blockIdx.y                            # gate_up: routed pair t * k + s; down: token t
        tq = by // top_k if GATE_UP else by             # the token whose x row the block reads
        ebase = 0
        if GATE_UP:
            ebase = ids[tq, by - tq * top_k]          # (MoE builds wait at entry: ids are the router's)
        p = cuda.blockIdx.x * PAIRS + pair
        live = p < n_pairs
        p = p if live else 0
        if SWIGLU:
            ta = p
            tb = p + (nt >> 1)
            has_b = True
        else:
            ta = 2 * p
            has_b = ta + 1 < nt
            tb = ta + 1 if has_b else ta
        kt_len = (kt_all + WAYS - 1) // WAYS
        kt0 = sl * kt_len
        n_k = min(kt_all, kt0 + kt_len) - kt0 if live else 0
        xw = k_dim >> 1                                 # words of fp16 x
        sraw = smem_u32(smem)
        sbase = _saddr((sraw + 127) & -128)             # (the dynamic base is only 4-byte aligned by declaration)
        w0 = (sbase - sraw) >> 2                        # smem[] index of sbase
        xsum_b = sbase + 4 * xw                         # fp32 sums of 32 columns
        ring = sbase + ((2 * k_dim + 4 * (k_dim >> 5) + 127) >> 7) * 128 + warp * (S * STAGE)
        kt0 = int32(kt0)
        n_k = int32(n_k)
        ring = _saddr(ring)
        tea = int64(ebase) * nt + ta
        teb = int64(ebase) * nt + tb
        pa = _gp(codes) + (tea * kt_exp + kt0) * 512 + lane * 16
        pb = _gp(codes) + (teb * kt_exp + kt0) * 512 + lane * 16
        if KIND == 2:
            nb = k_exp >> 7
            sa0 = _gp(scales) + (tea * nb) * 4
            sb0 = _gp(scales) + (teb * nb) * 4
        else:
            ng = k_exp >> GSHIFT
            sa0 = _gp(scales) + ((tea * ng) * 8 + g) * 4
            sb0 = _gp(scales) + ((teb * ng) * 8 + g) * 4
        za0 = sa0
        zb0 = sb0
        if ZP:
            za0 = _gp(zeros) + (sa0 - _gp(scales))
            zb0 = _gp(zeros) + (sb0 - _gp(scales))
        rz = uint32(n_rows >> 31)                       # 0, unknown to ptxas
        m0f = M0F | rz
        mf0 = MF0 | rz
        h1024 = H1024 | rz
        if KIND == 2:
            so0 = (kt0 * KTW >> 7) * 4
        else:
            so0 = (kt0 * KTW >> GSHIFT) * 32
        psa = sa0 + so0
        psb = sb0 + so0
        pza = za0 + so0
        pzb = zb0 + so0
        if not MOE:
            for i in range(S - 1):                      # the ring's first K-tiles: weights, before the wait
                if i < n_k:
                    issue(ring + int32(i) * STAGE, lane, pa, pb, psa, psb, pza, pzb)
                    pa += 512
                    pb += 512
                    d = sstep(int32(kt0 + i))
                    psa += d
                    psb += d
                    pza += d
                    pzb += d
                cp_async_commit()
        grid_dependency_sync()                          # x is the previous kernel's output
        xr = tq * k_dim                                 # x row tq (dense: 0)
        if DOWN and tid < top_k:
            eids[tid] = ids[tq, tid]
        # stage x: max |x (* nw)| and the sum of squares, then fp16 x * 2^-e and 32-column sums
        m = float32(0.0)
        ss = float32(0.0)
        for c in range(4 * tid, k_dim, 4 * TB):
            v = ldg_v4_f32(x, xr + c)
            if DOWN:                                    # the slot weight folded into x
                sw = ew[tq, c // k_exp]
                v = (v[0] * sw, v[1] * sw, v[2] * sw, v[3] * sw)
            if NORMED:
                ss += v[0] * v[0] + v[1] * v[1] + v[2] * v[2] + v[3] * v[3]
                n4 = ldg_v4_f32(nw, c)
                v = (v[0] * n4[0], v[1] * n4[1], v[2] * n4[2], v[3] * n4[3])
            m = max(m, max(max(abs(v[0]), abs(v[1])), max(abs(v[2]), abs(v[3]))))
        for sh in (16, 8, 4, 2, 1):
            m = max(m, shfl_xor(m, sh))
        if NORMED:
            ss = warp_sum(ss)
        if lane == 0:
            red[warp] = m
            red[32 + warp] = ss
        cuda.syncthreads()
        m = float32(0.0)
        ss = float32(0.0)
        for j in range(WARPS):
            m = max(m, red[j])
            ss += red[32 + j]
        e = int32(f32_bits(m) >> SH16 >> SH7) - 141      # |x| < 2^(e + 15)
        e = max(-100, min(100, e))
        xsc = as_f32(uint32(127 - e) << SH16 << SH7)     # 2^-e
        mult = as_f32(uint32(127 + e) << SH16 << SH7)    # 2^e
        if NORMED:
            mult = mult / math.sqrt(ss / float32(k_dim) + eps)
        for c0 in range(warp * 256, k_dim + 255 - (k_dim + 255) % 256, 256 * WARPS):
            c = c0 + 8 * lane
            sx = float32(0.0)
            if c < k_dim:
                va = ldg_v4_f32(x, xr + c)
                vb = ldg_v4_f32(x, xr + c + 4)
                if DOWN:
                    sw = ew[tq, c // k_exp]
                    va = (va[0] * sw, va[1] * sw, va[2] * sw, va[3] * sw)
                    vb = (vb[0] * sw, vb[1] * sw, vb[2] * sw, vb[3] * sw)
                if NORMED:
                    na = ldg_v4_f32(nw, c)
                    nb8 = ldg_v4_f32(nw, c + 4)
                    va = (va[0] * na[0], va[1] * na[1], va[2] * na[2], va[3] * na[3])
                    vb = (vb[0] * nb8[0], vb[1] * nb8[1], vb[2] * nb8[2], vb[3] * nb8[3])
                h0 = pack_f16x2(va[1] * xsc, va[0] * xsc)
                h1 = pack_f16x2(va[3] * xsc, va[2] * xsc)
                h2 = pack_f16x2(vb[1] * xsc, vb[0] * xsc)
                h3 = pack_f16x2(vb[3] * xsc, vb[2] * xsc)
                smem[w0 + (c >> 1)] = h0
                smem[w0 + (c >> 1) + 1] = h1
                smem[w0 + (c >> 1) + 2] = h2
                smem[w0 + (c >> 1) + 3] = h3
                f0, f1 = f16x2_to_f32(h0)
                f2, f3 = f16x2_to_f32(h1)
                f4, f5 = f16x2_to_f32(h2)
                f6, f7 = f16x2_to_f32(h3)
                sx = ((f0 + f1) + (f2 + f3)) + ((f4 + f5) + (f6 + f7))
            sx += shfl_xor(sx, 1)
            sx += shfl_xor(sx, 2)
            if c < k_dim and (lane & 3) == 0:
                smem[w0 + xw + (c >> 5)] = f32_bits(sx)
        cuda.syncthreads()
        if MOE:                                         # the ring's first K-tiles (the experts known now)
            for i in range(S - 1):
                if i < n_k:
                    if DOWN:
                        pa, pb, psa, psb, pza, pzb = slot_ptrs(int32(kt0 + i), kt_exp, eids, nt, ta, tb, lane, g,
                                                               k_exp, codes, scales, zeros)
                    issue(ring + int32(i) * STAGE, lane, pa, pb, psa, psb, pza, pzb)
                    pa += 512
                    pb += 512
                    d = sstep(int32(kt0 + i))
                    psa += d
                    psb += d
                    pza += d
                    pzb += d
                cp_async_commit()
        # the stream: per K-tile wait for the oldest group, read the slot, refill it S - 1 ahead
        aa0 = aa1 = ab0 = ab1 = float32(0.0)            # sum of s * c: tile a rows g, g + 8, tile b
        ra0 = ra1 = rb0 = rb1 = float32(0.0)            # sum of s * X (times the offset with zero points)
        i = int32(0)
        rs = ring                                       # the slot K-tile i is read from
        ws = _saddr(ring + SM1 * STAGE)                 # the slot K-tile i + S - 1 is copied to
        rend = _saddr(ring + S * STAGE)
        while i < n_k:
            WAIT()
            slot = rs
            wa = lds128(slot + lane * 16)
            wb = lds128(slot + 512 + lane * 16)
            wp = slot + 1024 + lane * WB
            col = int32((kt0 + i) * KTW32)
            xa = lds128(sbase + 2 * col + 16 * t)
            if KIND == 0:
                xb = lds128(sbase + 2 * col + 64 + 16 * t)
                xs2 = lds64(xsum_b + 4 * (col >> 5))
                xs0 = as_f32(xs2[0])
                xs1 = as_f32(xs2[1])
            else:
                xs0 = as_f32(lds32(xsum_b + 4 * (col >> 5)))
            if NWD == 2:
                sw = lds64(wp)
                swa, swb = sw
            else:
                sw4 = lds128(wp)
                swa, swb = sw4[0], sw4[1]
                zw4 = sw4
                if NWD == 8:
                    zw4 = lds128(wp + 16)
            j = int32(i + SM1)
            if j < n_k:
                if DOWN:
                    pa, pb, psa, psb, pza, pzb = slot_ptrs(int32(kt0 + j), kt_exp, eids, nt, ta, tb, lane, g, k_exp,
                                                           codes, scales, zeros)
                issue(ws, lane, pa, pb, psa, psb, pza, pzb)
                pa += 512
                pb += 512
                d = sstep(int32(kt0 + j))
                psa += d
                psb += d
                pza += d
                pzb += d
            cp_async_commit()
            i = int32(i + I1)
            rs = _saddr(rs + STAGE)
            rs = ring if rs == rend else rs
            ws = _saddr(ws + STAGE)
            ws = ring if ws == rend else ws
            if KIND == 2:
                s_a = as_f32(swa)
                s_b = as_f32(swb)
                ca4 = mma_f16(a_b8(wa[0], wa[1]), xa[0], xa[1], T1_ZF)
                ca4 = mma_f16(a_b8(wa[2], wa[3]), xa[2], xa[3], ca4)
                cb4 = mma_f16(a_b8(wb[0], wb[1]), xa[0], xa[1], T1_ZF)
                cb4 = mma_f16(a_b8(wb[2], wb[3]), xa[2], xa[3], cb4)
                aa0 += s_a * ca4[0]
                aa1 += s_a * ca4[2]
                ab0 += s_b * cb4[0]
                ab1 += s_b * cb4[2]
            else:
                sa_0, sa_1 = f16x2_to_f32(swa)
                sb_0, sb_1 = f16x2_to_f32(swb)
                if KIND == 0:
                    ca4 = mma_f16(a_i4(wa[0], m0f, mf0, h1024), xa[0], xa[1], T1_ZF)
                    ca4 = mma_f16(a_i4(wa[1], m0f, mf0, h1024), xa[2], xa[3], ca4)
                    cb4 = mma_f16(a_i4(wb[0], m0f, mf0, h1024), xa[0], xa[1], T1_ZF)
                    cb4 = mma_f16(a_i4(wb[1], m0f, mf0, h1024), xa[2], xa[3], cb4)
                    if SPLIT:                           # groups of 32: the halves' own scales
                        xsum = xs0
                        ha_0, ha_1 = f16x2_to_f32(sw4[2])
                        hb_0, hb_1 = f16x2_to_f32(sw4[3])
                        aa0 += sa_0 * ca4[0]
                        aa1 += sa_1 * ca4[2]
                        ab0 += sb_0 * cb4[0]
                        ab1 += sb_1 * cb4[2]
                        if ZP:
                            oa0, oa1 = offs(zw4[0])
                            ob0, ob1 = offs(zw4[1])
                            ra0 += (sa_0 * oa0) * xs0
                            ra1 += (sa_1 * oa1) * xs0
                            rb0 += (sb_0 * ob0) * xs0
                            rb1 += (sb_1 * ob1) * xs0
                        else:
                            ra0 += sa_0 * xs0
                            ra1 += sa_1 * xs0
                            rb0 += sb_0 * xs0
                            rb1 += sb_1 * xs0
                        ca4 = mma_f16(a_i4(wa[2], m0f, mf0, h1024), xb[0], xb[1], T1_ZF)
                        ca4 = mma_f16(a_i4(wa[3], m0f, mf0, h1024), xb[2], xb[3], ca4)
                        cb4 = mma_f16(a_i4(wb[2], m0f, mf0, h1024), xb[0], xb[1], T1_ZF)
                        cb4 = mma_f16(a_i4(wb[3], m0f, mf0, h1024), xb[2], xb[3], cb4)
                        sa_0, sa_1, sb_0, sb_1 = ha_0, ha_1, hb_0, hb_1
                        xsum = xs1
                        if ZP:
                            oa0, oa1 = offs(zw4[2])
                            ob0, ob1 = offs(zw4[3])
                    else:
                        ca4 = mma_f16(a_i4(wa[2], m0f, mf0, h1024), xb[0], xb[1], ca4)
                        ca4 = mma_f16(a_i4(wa[3], m0f, mf0, h1024), xb[2], xb[3], ca4)
                        cb4 = mma_f16(a_i4(wb[2], m0f, mf0, h1024), xb[0], xb[1], cb4)
                        cb4 = mma_f16(a_i4(wb[3], m0f, mf0, h1024), xb[2], xb[3], cb4)
                        xsum = xs0 + xs1
                        if ZP:
                            oa0, oa1 = offs(sw4[2])
                            ob0, ob1 = offs(sw4[3])
                else:
                    ca4 = mma_f16(a_b8(wa[0], wa[1]), xa[0], xa[1], T1_ZF)
                    ca4 = mma_f16(a_b8(wa[2], wa[3]), xa[2], xa[3], ca4)
                    cb4 = mma_f16(a_b8(wb[0], wb[1]), xa[0], xa[1], T1_ZF)
                    cb4 = mma_f16(a_b8(wb[2], wb[3]), xa[2], xa[3], cb4)
                    xsum = xs0
                    if ZP:
                        oa0, oa1 = offs(sw4[2])
                        ob0, ob1 = offs(sw4[3])
                aa0 += sa_0 * ca4[0]
                aa1 += sa_1 * ca4[2]
                ab0 += sb_0 * cb4[0]
                ab1 += sb_1 * cb4[2]
                if ZP:
                    ra0 += (sa_0 * oa0) * xsum
                    ra1 += (sa_1 * oa1) * xsum
                    rb0 += (sb_0 * ob0) * xsum
                    rb1 += (sb_1 * ob1) * xsum
                else:
                    ra0 += sa_0 * xsum
                    ra1 += sa_1 * xsum
                    rb0 += sb_0 * xsum
                    rb1 += sb_1 * xsum
        if KIND == 2:
            ya0, ya1, yb0, yb1 = aa0, aa1, ab0, ab1
        elif ZP:
            ya0, ya1, yb0, yb1 = aa0 - ra0, (aa1 - ra1) * R1, ab0 - rb0, (ab1 - rb1) * R1
        else:
            ya0, ya1 = aa0 - OFF0 * ra0, (aa1 - OFF1 * ra1) * R1
            yb0, yb1 = ab0 - OFF0 * rb0, (ab1 - OFF1 * rb1) * R1
        if WAYS > 1:                                    # the slices meet in their own ring areas, in order
            cuda.syncthreads()
            rw = w0 + ((ring - sbase) >> 2)
            if t == 0:
                smem[rw + 4 * g] = f32_bits(ya0)
                smem[rw + 4 * g + 1] = f32_bits(ya1)
                smem[rw + 4 * g + 2] = f32_bits(yb0)
                smem[rw + 4 * g + 3] = f32_bits(yb1)
            cuda.syncthreads()
            if sl == 0 and t == 0:
                ya0 = ya1 = yb0 = yb1 = float32(0.0)
                for j in range(WAYS):
                    q = rw + j * ((S * STAGE) >> 2) + 4 * g
                    ya0 += as_f32(smem[q])
                    ya1 += as_f32(smem[q + 1])
                    yb0 += as_f32(smem[q + 2])
                    yb1 += as_f32(smem[q + 3])
        if live and sl == 0 and t == 0:
            ya0 *= mult
            ya1 *= mult
            yb0 *= mult
            yb1 *= mult
            if SWIGLU:
                orow = by if GATE_UP else 0
                out[orow, ta * 16 + g] = ya0 / (float32(1.0) + math.exp(-ya0)) * yb0
                out[orow, ta * 16 + g + 8] = ya1 / (float32(1.0) + math.exp(-ya1)) * yb1
            else:
                for h in range(4):
                    r = (ta if h < 2 else tb) * 16 + g + 8 * (h & 1)
                    v = ya0 if h == 0 else ya1 if h == 1 else yb0 if h == 2 else yb1
                    if r < n_rows and (h < 2 or has_b):
                        out[tq, r] = v + (bias[tq * n_rows + r] if has_bias != 0 else float32(0.0))

    gemv_t1_build.__name__ = t1_name(kind, zp, split, mode, ways, warps, stages, min_blocks, group, experts)
    return kernel((f32_2, f32_1, f32, u32_1, u32_1, u32_1, i32, i32, i32, f32_1, f32_2, i32, i32_2, f32_2),
                  sim=True, fastmath=True, launch_bounds=(TB, min_blocks), dynamic_smem=T1_SMEM_MAX,
                  self_sync=not MOE)(gemv_t1_build)


# The one-token build the 27B's down projection takes, registered at import for the compile tests
# (the others are built on first use).
T1_BUILDS = (("i4", False, False, "plain", 8, 8, 7, 3),)
for _t1 in T1_BUILDS:
    gemv_t1(*_t1)
