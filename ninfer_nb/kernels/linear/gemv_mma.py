"""Decode GEMV for 2..16 tokens on tensor cores: every weight row is read once for all tokens.

Why: linear.py's SIMT GEMVs take the tokens 4 per pass and stream the weight rows again in
each pass, so a decode round of B sequences (T = B rows) reads the weights ceil(T / 4) times
and does T fp32 FMAs per weight. Here a warp's mma.sync m16n8k16 multiplies 16 weight rows by
8 tokens per instruction (two for 16 tokens), so the FLOPs ride on the tensor cores and the
kernel stays bound by one pass over the weights whatever T <= 16 is.

`gemv_mma_kernel`: x [T, K] fp32 (T <= 16), w [N, K] bf16 bits (K % 32 == 0, 16-byte aligned
rows), out [T, N] fp32 (+ bias [N] when has_bias). grid ceil(N / 16), block 256: a block owns 16
rows; its 8 warps split the K dimension into 8 slices of 32-column blocks. Per 32-column block,
lane l = 4g + t (g = l >> 2, t = l & 3) loads 16 bytes of rows g and g + 8 at columns 8t..8t+7
(streaming loads) and the same 8 columns of x for tokens g and g + 8 (rounded to bf16); the
dot product's order is free, so k slots 2t, 2t + 1 / 2t + 8, 2t + 9 of the first mma are
columns 8t + 0, 1 / 8t + 2, 3 and of the second 8t + 4, 5 / 8t + 6, 7 (one 16-byte load feeds
two mma, no shuffles; the decode attention's trick). Tokens past T multiply zeros. UNROLL
blocks' loads are issued before any math. The warps' 16 x 16 partial tiles meet in shared
memory and are summed in a fixed order (deterministic). x enters as two bf16 operands, its
high part and the remainder (x = hi + lo to ~2^-16 relative: twice the mma, which the tensor
cores have to spare), so the result keeps the SIMT GEMVs' fp32-input accuracy; products and
sums are fp32. Simulator-safe (ptx_sim.py emulates the mma and the 16-byte loads).
"""
from __future__ import annotations

from numba import cuda, float32, uint32

from ninfer_nb.kernels.common.bf16 import bits_f32, f32_bits
from ninfer_nb.kernels.common.nbtypes import f32_1, f32_2, i32, u16_2
from ninfer_nb.kernels.common.ptx import (
    grid_dependency_sync,
    ldg_stream_v4_u32,
    ldg_v4_f32,
    mma_bf16,
    pack_bf16x2,
)
from ninfer_nb.kernels.common.registry import kernel

WARPS = 8
THREADS = 32 * WARPS
ROWS = 16                # weight rows per block (the mma's M)
MAX_T = 16               # tokens: two n8 column tiles
UNROLL = 4               # 32-column blocks whose loads a lane issues together
K_ALIGN = 32


def supported(t: int, k: int) -> bool:
    return 2 <= t <= MAX_T and k % K_ALIGN == 0


def grid(n: int) -> int:
    return (n + ROWS - 1) // ROWS


@cuda.jit(device=True, inline=True)
def _split(v):
    """fp32 v -> (bf16(v), bf16(v - bf16(v))) as fp32 values: hi + lo carries v to ~2^-16."""
    hi = bits_f32(f32_bits(v) & -65536)
    return hi, v - hi


@cuda.jit(device=True, inline=True)
def _x_words(x, xi, ok):
    """8 fp32 of x at flat xi as bf16x2 words (element 2j low): 4 words of the high parts and 4
    of the remainders (x = hi + lo to ~2^-16 relative, so two mma keep fp32-like inputs);
    zeros when not ok."""
    z = uint32(0)
    if not ok:
        return (z, z, z, z), (z, z, z, z)
    a = ldg_v4_f32(x, xi)
    b = ldg_v4_f32(x, xi + 4)
    h0, l0 = _split(a[0])
    h1, l1 = _split(a[1])
    h2, l2 = _split(a[2])
    h3, l3 = _split(a[3])
    h4, l4 = _split(b[0])
    h5, l5 = _split(b[1])
    h6, l6 = _split(b[2])
    h7, l7 = _split(b[3])
    return ((pack_bf16x2(h1, h0), pack_bf16x2(h3, h2), pack_bf16x2(h5, h4), pack_bf16x2(h7, h6)),
            (pack_bf16x2(l1, l0), pack_bf16x2(l3, l2), pack_bf16x2(l5, l4), pack_bf16x2(l7, l6)))


@kernel((f32_2, u16_2, f32_1, f32_2, i32), sim=True, fastmath=True, launch_bounds=(THREADS, 2), self_sync=True)
def gemv_mma_kernel(x, w, bias, out, has_bias):
    """See the module docstring. The weight loads of a warp's first blocks go out before the
    grid-dependency wait (weights depend on no kernel); x is read after it."""
    red = cuda.shared.array((WARPS, ROWS, MAX_T), float32)
    wa = cuda.local.array((UNROLL, 4), uint32)      # row g: 4 words (8 bf16) per block
    wb = cuda.local.array((UNROLL, 4), uint32)      # row g + 8
    lane = cuda.threadIdx.x & 31
    warp = cuda.threadIdx.x >> 5
    g = lane >> 2
    t4 = lane & 3
    n_rows = w.shape[0]
    k_dim = w.shape[1]
    n_tok = x.shape[0]
    n0 = cuda.blockIdx.x * ROWS
    ra = min(n0 + g, n_rows - 1)                     # rows past N load the last row, store nothing
    rb = min(n0 + g + 8, n_rows - 1)
    n_kb = k_dim // K_ALIGN
    kb = warp * n_kb // WARPS                        # this warp's 32-column blocks [kb, kb_end)
    kb_end = (warp + 1) * n_kb // WARPS
    wa_base = ra * k_dim + 8 * t4
    wb_base = rb * k_dim + 8 * t4
    ok_lo = g < n_tok                                # token g, token g + 8
    ok_hi = g + 8 < n_tok
    xa_base = min(g, n_tok - 1) * k_dim + 8 * t4
    xb_base = min(g + 8, n_tok - 1) * k_dim + 8 * t4
    two = n_tok > 8
    c_lo = (float32(0.0), float32(0.0), float32(0.0), float32(0.0))      # tokens 0..7
    c_hi = (float32(0.0), float32(0.0), float32(0.0), float32(0.0))      # tokens 8..15
    while kb < kb_end:
        for u in range(UNROLL):
            col = K_ALIGN * min(kb + u, kb_end - 1)   # blocks past the slice repeat its last, unused
            p = ldg_stream_v4_u32(w, wa_base + col)
            q = ldg_stream_v4_u32(w, wb_base + col)
            for i in range(4):
                wa[u, i] = p[i]
                wb[u, i] = q[i]
        grid_dependency_sync()                       # x is the previous kernel's output
        for u in range(UNROLL):
            if kb + u < kb_end:
                col = K_ALIGN * (kb + u)
                xh, xl = _x_words(x, xa_base + col, ok_lo)
                a1 = (wa[u, 0], wb[u, 0], wa[u, 1], wb[u, 1])
                a2 = (wa[u, 2], wb[u, 2], wa[u, 3], wb[u, 3])
                c_lo = mma_bf16(a1, xh[0], xh[1], c_lo)
                c_lo = mma_bf16(a2, xh[2], xh[3], c_lo)
                c_lo = mma_bf16(a1, xl[0], xl[1], c_lo)
                c_lo = mma_bf16(a2, xl[2], xl[3], c_lo)
                if two:
                    xh, xl = _x_words(x, xb_base + col, ok_hi)
                    c_hi = mma_bf16(a1, xh[0], xh[1], c_hi)
                    c_hi = mma_bf16(a2, xh[2], xh[3], c_hi)
                    c_hi = mma_bf16(a1, xl[0], xl[1], c_hi)
                    c_hi = mma_bf16(a2, xl[2], xl[3], c_hi)
        kb += UNROLL
    grid_dependency_sync()                           # a warp with no blocks has waited too
    # C fragments: (row g, tokens 2t, 2t + 1), (row g + 8, tokens 2t, 2t + 1)
    red[warp, g, 2 * t4] = c_lo[0]
    red[warp, g, 2 * t4 + 1] = c_lo[1]
    red[warp, g + 8, 2 * t4] = c_lo[2]
    red[warp, g + 8, 2 * t4 + 1] = c_lo[3]
    red[warp, g, 8 + 2 * t4] = c_hi[0]
    red[warp, g, 8 + 2 * t4 + 1] = c_hi[1]
    red[warp, g + 8, 8 + 2 * t4] = c_hi[2]
    red[warp, g + 8, 8 + 2 * t4 + 1] = c_hi[3]
    cuda.syncthreads()
    tid = cuda.threadIdx.x
    row = tid >> 4
    tok = tid & 15
    n = n0 + row
    if tok < n_tok and n < n_rows:
        s = float32(0.0)
        for w_ in range(WARPS):
            s += red[w_, row, tok]
        if has_bias != 0:
            s += bias[n]
        out[tok, n] = s
