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

import math
from typing import Any

from numba import config, cuda, float32, int32, int64, uint32
from numba import types as nbtypes
from numba.core.extending import intrinsic

from ninfer_nb.kernels.common.bf16 import bits_f32, f32_bits
from ninfer_nb.kernels.common.nbtypes import f32_1, f32_2, f32_3, i32, i32_1, u16_2
from ninfer_nb.kernels.common.ptx import (
    _element_address,
    cp_async_commit,
    fence_acq_rel_gpu,
    gptr,
    grid_dependency_sync,
    ldg_stream_v4_u32,
    ldg_v4_f32,
    ldsm_x4,
    mma_bf16,
    pack_bf16x2,
    smem_u32,
)
from ninfer_nb.kernels.common.registry import kernel
from ninfer_nb.kernels.linear.gemv_tiled import T1_WAITS, cp_async16w, lds128

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
def _x_split(x, xi):
    """8 fp32 of x at flat xi as bf16x2 words (element 2j low): 4 words of the high parts and 4
    of the remainders (x = hi + lo to ~2^-16 relative, so two mma keep fp32-like inputs). v4
    reads a valid token row for every lane; tokens past T fill C columns that are not stored."""
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


@cuda.jit(device=True, inline=True)
def _x_words(x, xi, ok):
    """_x_split of 8 fp32 of x at flat xi, or zeros when not ok."""
    z = uint32(0)
    if not ok:
        return (z, z, z, z), (z, z, z, z)
    return _x_split(x, xi)


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


# ---- v3: warps over rows, x shared through L1, work split evenly over the blocks (stream-K) ---
# v1's 8 warps split K, so every block (16 rows) reads all of x: T * K * 4 bytes per 16 rows,
# as much as the weight itself at T = 8 and twice at T = 16 (x of 8-16 tokens outgrows L1, so
# it comes from L2). Here a warp owns R row tiles (16 R rows) that share its x fragments, and
# the block's warps walk the same columns together, so x comes from L2 about once per block
# (WARPS * 16 R rows). The work, row groups x 32-column blocks, is cut into gridDim.x equal
# contiguous ranges, one per block (stream-K: any grid size is one even wave, so weights with
# few rows fill the GPU and no tail wave idles it); a block may end one group and start the next.
# Where several blocks share a row group, each writes its partial tile to ws [segments, T, N],
# and the last to arrive (a per-group counter, reset by that block) sums them in block order
# (deterministic) and applies the epilogue. Epilogues: "plain" (out = acc + bias, + out when accumulate: the residual add)
# and "swiglu" (R = 2: tile 0 gate rows j, tile 1 up rows I + j; out [T, I] = silu(g) * u).
V3_MODES = ("plain", "swiglu")
MAX_GROUPS = 4096          # row groups of a launch (the counter's length)
# the simulator runs the blocks one after another on coherent host memory: no fence needed
_fence = grid_dependency_sync if config.ENABLE_CUDASIM else fence_acq_rel_gpu
_V3: dict[tuple[str, int, int, int, int, int, int], Any] = {}


def v3_rows(warps: int, tiles: int) -> int:
    """Weight rows per block of a v3 build (swiglu: gate rows; the block also reads their up rows)."""
    return warps * 16 * tiles


_CARVED: set[str] = set()


def prefer_shared(spec: Any, force: bool = False) -> None:
    """Ask for the largest shared-memory carveout for a ring build (v3 stages > 0: 24-40 KB of ring
    per block, 4-6 blocks per SM; force: any build, v4's) so the driver does not trade its
    occupancy for L1; once per build, GPU only (the attribute is set on every compiled overload's
    CUkernel)."""
    if spec.name in _CARVED or config.ENABLE_CUDASIM or (not force and "_s" not in spec.name.rsplit("_b", 1)[-1]):
        return
    _CARVED.add(spec.name)
    try:
        from numba.cuda.cudadrv.driver import binding, driver

        attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
        for overload in spec.get().overloads.values():
            f = overload._codelibrary.get_cufunc()
            driver.cuKernelSetAttribute(attr, 100, f.handle, f.device.id)
    except Exception as exc:                # a hint: the kernel runs without it
        print(f"gemv_mma3: no shared-memory carveout for {spec.name}: {exc}")


def v3_groups(mode: str, warps: int, tiles: int, n: int) -> int:
    """Row groups (one block's rows) of an [n, K] weight (swiglu: n = 2I)."""
    rows = v3_rows(warps, tiles) // (2 if mode == "swiglu" else 1)
    return (n // (2 if mode == "swiglu" else 1) + rows - 1) // rows


def v3_segments(groups: int, k: int, blocks: int, cols: int = K_ALIGN) -> int:
    """At most how many blocks share one row group when `blocks` blocks split the groups x
    (K / cols) column-block units evenly (the workspace's first dimension); blocks <= units
    (v4: cols = its stage's columns)."""
    kbn = k // cols
    per = groups * kbn // blocks                   # units per block, at least
    return -(-kbn // per) + 1


def v3_name(mode: str, warps: int, tiles: int, unroll: int, min_blocks: int, pipe: int = 0, stages: int = 0) -> str:
    ring = f"_s{stages}" if stages else ""
    return f"gemv_mma3_{mode}_x{warps}_r{tiles}_u{unroll}_b{min_blocks}{'_p' if pipe else ''}{ring}_kernel"


def gemv_mma3(mode: str, warps: int, tiles: int, unroll: int, min_blocks: int, pipe: int = 0,
              stages: int = 0) -> Any:
    """The v3 tensor-core GEMV build: `warps` warps per block, `tiles` 16-row tiles per warp,
    `unroll` 32-column blocks of loads issued together, launch bounds (32 warps, min_blocks);
    pipe: two register buffers, the next `unroll` blocks' loads issued before this one's math;
    stages > 0 (unroll 1, no pipe): the weights stream through a per-warp shared-memory ring of
    that many 32-column blocks by cp.async (stages - 1 in flight, no registers held for them).
    Signature (x [T, K] f32, w [N, K] bf16 bits, bias [N], out [T, N] ([T, N / 2] swiglu),
    has_bias, accumulate, ws [v3_segments(...), T, N] f32, counter [>= groups] int32 kept 0
    between launches). Grid: any number of blocks up to groups x K / 32, block 32 * warps."""
    key = (mode, warps, tiles, unroll, min_blocks, pipe, stages)
    if key not in _V3:
        if mode not in V3_MODES or warps not in (2, 4, 8) or tiles not in (1, 2, 4) or unroll not in (1, 2, 4) \
                or (mode == "swiglu" and tiles != 2) or not 1 <= warps * min_blocks <= 64 \
                or (stages and (unroll != 1 or pipe or not 3 <= stages <= 9
                                or warps * stages * tiles * 1024 >= 48 * 1024)):
            raise ValueError(f"gemv_mma3: no build {key}")
        _V3[key] = _make_v3(*key)
    return _V3[key]


def _make_v3(mode: str, warps: int, tiles: int, unroll: int, min_blocks: int, pipe: int, stages: int) -> Any:
    PIPE = pipe != 0
    RING = stages
    SLOT = tiles * 2 * 512                      # ring bytes per warp per 32-column block
    RING_WORDS = max(1, warps * stages * SLOT // 4)
    WAITR = T1_WAITS[max(stages - 2, 0)]
    R = tiles
    U = unroll
    SWIGLU = mode == "swiglu"
    RB = warps * 16 * tiles                     # w rows per block (swiglu: half gate, half up)

    @cuda.jit(device=True, inline=True)
    def _load(w, wr, kb, kb_end, j0, g, t4, inter, n_rows, k_dim):
        """Issue the weight loads of 32-column blocks kb .. kb + U - 1 (past kb_end: its last
        block again, unused) into wr[u, i]: row g words 0..3, row g + 8 words 4..7 of tile i."""
        for u in range(U):
            col = K_ALIGN * min(kb + u, kb_end - 1)
            for i in range(R):
                if SWIGLU:
                    base = i * inter + min(j0 + g, inter - 1)
                    base2 = i * inter + min(j0 + g + 8, inter - 1)
                else:
                    base = min(j0 + 16 * i + g, n_rows - 1)              # rows past N: the last row, unused
                    base2 = min(j0 + 16 * i + g + 8, n_rows - 1)
                p = ldg_stream_v4_u32(w, base * k_dim + 8 * t4 + col)
                q = ldg_stream_v4_u32(w, base2 * k_dim + 8 * t4 + col)
                for e in range(4):
                    wr[u, i, e] = p[e]
                    wr[u, i, 4 + e] = q[e]

    @cuda.jit(device=True, inline=True)
    def _mma(x, wr, acc, kb, kb_end, xa_base, xb_base, ok_lo, ok_hi, two):
        """acc[i, h] += tile i of blocks kb.. (< kb_end) x tokens 8h..8h + 7 (x as hi + lo)."""
        for u in range(U):
            if kb + u < kb_end:
                col = K_ALIGN * (kb + u)
                for h in range(2):
                    if h == 0 or two:
                        xh, xl = _x_words(x, (xa_base if h == 0 else xb_base) + col, ok_lo if h == 0 else ok_hi)
                        for i in range(R):
                            a1 = (wr[u, i, 0], wr[u, i, 4], wr[u, i, 1], wr[u, i, 5])
                            a2 = (wr[u, i, 2], wr[u, i, 6], wr[u, i, 3], wr[u, i, 7])
                            c = (acc[i, h, 0], acc[i, h, 1], acc[i, h, 2], acc[i, h, 3])
                            c = mma_bf16(a1, xh[0], xh[1], c)
                            c = mma_bf16(a2, xh[2], xh[3], c)
                            c = mma_bf16(a1, xl[0], xl[1], c)
                            c = mma_bf16(a2, xl[2], xl[3], c)
                            for e in range(4):
                                acc[i, h, e] = c[e]

    @cuda.jit(device=True, inline=True)
    def _issue(slot, wp, kb, j0, g, t4, lane, inter, n_rows, k_dim):
        """cp.async of 32-column block kb of the warp's tiles into ring slot `slot` (shared
        address): per tile i, the lane's 16 bytes of row g at slot + 1024 i + 16 lane, of row
        g + 8 at 512 bytes further (each lane reads back only its own copies)."""
        col = K_ALIGN * kb + 8 * t4
        for i in range(R):
            if SWIGLU:
                base = i * inter + min(j0 + g, inter - 1)
                base2 = i * inter + min(j0 + g + 8, inter - 1)
            else:
                base = min(j0 + 16 * i + g, n_rows - 1)
                base2 = min(j0 + 16 * i + g + 8, n_rows - 1)
            cp_async16w(slot + 1024 * i + 16 * lane, wp + 2 * (base * k_dim + col))
            cp_async16w(slot + 1024 * i + 512 + 16 * lane, wp + 2 * (base2 * k_dim + col))

    def gemv_mma3_kernel(x, w, bias, out, has_bias, accumulate, ws, counter):
        wr = cuda.local.array((U, R, 8), uint32)       # per block u, tile i: row g words 0..3, row g + 8 words 4..7
        acc = cuda.local.array((R, 2, 4), float32)     # per tile, token half (0..7, 8..15): the C fragment
        flag = cuda.shared.array(1, int32)
        lane = cuda.threadIdx.x & 31
        warp = cuda.threadIdx.x >> 5
        g = lane >> 2
        t4 = lane & 3
        n_rows = w.shape[0]
        k_dim = w.shape[1]
        n_tok = x.shape[0]
        inter = out.shape[1] if SWIGLU else 0
        rows = inter if SWIGLU else n_rows            # output rows
        rbo = RB // 2 if SWIGLU else RB               # output rows per group
        kbn = k_dim // K_ALIGN
        n_units = int64((rows + rbo - 1) // rbo) * kbn     # (row group, 32-column block) units
        n_blk = int64(cuda.gridDim.x)
        b = int64(cuda.blockIdx.x)
        u = b * n_units // n_blk                       # this block's units [u, u_end): contiguous
        u_end = (b + 1) * n_units // n_blk
        ok_lo = g < n_tok
        ok_hi = g + 8 < n_tok
        xa_base = min(g, n_tok - 1) * k_dim + 8 * t4
        xb_base = min(g + 8, n_tok - 1) * k_dim + 8 * t4
        two = n_tok > 8
        while u < u_end:
            gr = int32(u // kbn)                       # row group, its column blocks [kb, kb_end)
            kb = int32(u - int64(gr) * kbn)
            kb_end = int32(min(int64(kbn), u_end - int64(gr) * kbn))
            j0 = gr * rbo + warp * 16 * (1 if SWIGLU else R)   # swiglu: gate rows j0.., up rows inter + j0..
            for i in range(R):
                for h in range(2):
                    for e in range(4):
                        acc[i, h, e] = float32(0.0)
            if RING:
                ring = cuda.shared.array(RING_WORDS, uint32)
                rbase = int64(smem_u32(ring)) + warp * (RING * SLOT)   # (64-bit: host addresses in the simulator)
                wp = int64(gptr(w))
                for s_ in range(RING - 1):                      # the first RING - 1 blocks in flight
                    if kb + s_ < kb_end:
                        _issue(rbase + s_ * SLOT, wp, kb + s_, j0, g, t4, lane, inter, n_rows, k_dim)
                    cp_async_commit()
                grid_dependency_sync()                          # x is the previous kernel's output
                rs = 0                                          # the slot block kb is in
                while kb < kb_end:
                    WAITR()                                     # block kb's group has landed
                    sa = rbase + rs * SLOT
                    for i in range(R):
                        p = lds128(sa + 1024 * i + 16 * lane)
                        q = lds128(sa + 1024 * i + 512 + 16 * lane)
                        for e in range(4):
                            wr[0, i, e] = p[e]
                            wr[0, i, 4 + e] = q[e]
                    if kb + RING - 1 < kb_end:                  # into the slot read last round
                        _issue(rbase + (rs - 1 if rs > 0 else RING - 1) * SLOT, wp, kb + RING - 1, j0, g, t4,
                               lane, inter, n_rows, k_dim)
                    cp_async_commit()
                    _mma(x, wr, acc, kb, kb_end, xa_base, xb_base, ok_lo, ok_hi, two)
                    kb += 1
                    rs = rs + 1 if rs + 1 < RING else 0
            elif PIPE:
                wr2 = cuda.local.array((U, R, 8), uint32)
                _load(w, wr, kb, kb_end, j0, g, t4, inter, n_rows, k_dim)
                grid_dependency_sync()                          # x is the previous kernel's output
                while kb < kb_end:                              # the next U blocks' loads in flight during the math
                    if kb + U < kb_end:
                        _load(w, wr2, kb + U, kb_end, j0, g, t4, inter, n_rows, k_dim)
                    _mma(x, wr, acc, kb, kb_end, xa_base, xb_base, ok_lo, ok_hi, two)
                    kb += U
                    if kb >= kb_end:
                        break
                    if kb + U < kb_end:
                        _load(w, wr, kb + U, kb_end, j0, g, t4, inter, n_rows, k_dim)
                    _mma(x, wr2, acc, kb, kb_end, xa_base, xb_base, ok_lo, ok_hi, two)
                    kb += U
            else:
                while kb < kb_end:
                    _load(w, wr, kb, kb_end, j0, g, t4, inter, n_rows, k_dim)
                    grid_dependency_sync()                      # x is the previous kernel's output
                    _mma(x, wr, acc, kb, kb_end, xa_base, xb_base, ok_lo, ok_hi, two)
                    kb += U
            grid_dependency_sync()                      # (returns at once: waited above) before the stores
            # the blocks that hold units of group gr: first .. last (block of unit q: ((q + 1) P - 1) // units)
            first = int32(((int64(gr) * kbn + 1) * n_blk - 1) // n_units)
            last = int32((int64(gr + 1) * kbn * n_blk - 1) // n_units)
            done = True
            if last > first:                          # partial sums meet in ws; the last to arrive adds them
                seg = int32(b) - first
                # C fragment element e of tile i, half h: row (g if e < 2 else g + 8), token 8h + 2 t4 + (e & 1)
                for i in range(R):
                    for h in range(2):
                        for e in range(4):
                            tok = 8 * h + 2 * t4 + (e & 1)
                            jj = j0 + 16 * (0 if SWIGLU else i) + g + 8 * (e >> 1)
                            if jj < rows and tok < n_tok:
                                ws[seg, tok, i * inter + jj if SWIGLU else jj] = acc[i, h, e]
                _fence()                                # this block's partials before its arrival
                cuda.syncthreads()
                if cuda.threadIdx.x == 0:
                    flag[0] = int32(cuda.atomic.add(counter, gr, 1) == last - first)
                cuda.syncthreads()
                done = flag[0] != 0
                if done:
                    _fence()                            # every block's partials after the last arrival
                    if cuda.threadIdx.x == 0:
                        counter[gr] = 0
                    for i in range(R):
                        for h in range(2):
                            for e in range(4):
                                tok = 8 * h + 2 * t4 + (e & 1)
                                jj = j0 + 16 * (0 if SWIGLU else i) + g + 8 * (e >> 1)
                                if jj < rows and tok < n_tok:
                                    s = float32(0.0)
                                    for q_ in range(last - first + 1):
                                        s += ws[q_, tok, i * inter + jj if SWIGLU else jj]
                                    acc[i, h, e] = s
            if done:
                for h in range(2):
                    for e in range(4):
                        tok = 8 * h + 2 * t4 + (e & 1)
                        if tok < n_tok:
                            if SWIGLU:
                                jj = j0 + g + 8 * (e >> 1)
                                if jj < inter:
                                    gv = acc[0, h, e]
                                    out[tok, jj] = gv / (float32(1.0) + math.exp(-gv)) * acc[1, h, e]
                            else:
                                for i in range(R):
                                    row = j0 + 16 * i + g + 8 * (e >> 1)
                                    if row < n_rows:
                                        v = acc[i, h, e]
                                        if has_bias != 0:
                                            v += bias[row]
                                        if accumulate != 0:
                                            v += out[tok, row]
                                        out[tok, row] = v
            u = int64(gr) * kbn + kb_end
        grid_dependency_sync()                          # a block with no units has waited too

    gemv_mma3_kernel.__name__ = v3_name(mode, warps, tiles, unroll, min_blocks, pipe, stages)
    return kernel((f32_2, u16_2, f32_1, f32_2, i32, i32, f32_3, i32_1), sim=True, fastmath=True,
                  launch_bounds=(32 * warps, min_blocks), self_sync=True)(gemv_mma3_kernel)


# The v3 builds ops/cuda/linear.py may pick, registered at import for the compile tests; others
# are built on first use (dev/gemv_probe.py --mma sweeps them).
V3_BUILDS = (("plain", 4, 2, 2, 4), ("plain", 4, 1, 4, 4), ("swiglu", 4, 2, 2, 4))
for _b in V3_BUILDS:
    gemv_mma3(*_b)


# ---- v4: the weights through per-warp cp.async rings of wide stages (gemv_mma4) ----------------
# v3 reads each weight row 64 bytes at a time (a lane's 16 bytes feed the mma directly: 4 lanes
# per row), so the memory sees many short runs held in registers. Here a warp copies its
# 16 R rows x 32 KB columns per stage with cp.async, each instruction a contiguous 256-512 byte
# run of one or two rows, into a shared-memory ring of `stages` slots (stages - 1 in flight, no
# registers held for them); lanes then read their mma fragments from the slot (16-byte chunks
# stored XOR-swizzled by row, so the reads are free of bank conflicts): by 16-byte loads, or by
# ldmatrix (lm). With xs the block splits each stage's x into bf16 high parts and remainders
# once, into two shared slots (a block barrier per stage), instead of every warp splitting all
# of it (the T = 16 cost). Same units (row group x stage), stream-K split, partial sums and
# epilogues as v3. ops/cuda/linear.py mma4_plan picks the lm + xs builds.
V4_SMEM_MAX = 227 * 1024
_V4: dict[tuple[str, int, int, int, int, int, int, int], Any] = {}


def v4_stage_bytes(tiles: int, kb: int) -> int:
    """Ring bytes of one stage of a warp: 16 tiles rows x 32 kb bf16 columns."""
    return tiles * 16 * kb * 64


def v4_xrow(kb: int) -> int:
    """Bytes of a token's row of a staged-x slot (xs builds): per 16-byte chunk of the stage,
    16 bytes of high parts and 16 of remainders, + 16 (bank-conflict-free reads)."""
    return 4 * kb * 32 + 16


def v4_smem(warps: int, tiles: int, kb: int, stages: int, xs: int = 0) -> int:
    """Dynamic shared memory of a gemv_mma4 launch (+ 128: the kernel aligns its base; xs: two
    slots of staged x for 16 tokens)."""
    return 128 + warps * stages * v4_stage_bytes(tiles, kb) + (2 * MAX_T * v4_xrow(kb) if xs else 0)


def v4_name(mode: str, warps: int, tiles: int, kb: int, stages: int, min_blocks: int, lm: int = 0, xs: int = 0) -> str:
    return (f"gemv_mma4_{mode}_x{warps}_r{tiles}_k{kb}_s{stages}_b{min_blocks}{'_lm' if lm else ''}"
            f"{'_xs' if xs else ''}_kernel")


def gemv_mma4(mode: str, warps: int, tiles: int, kb: int, stages: int, min_blocks: int, lm: int = 0,
              xs: int = 0) -> Any:
    """The v4 build: `warps` warps per block, `tiles` 16-row tiles per warp, stages of `kb`
    32-column blocks (K % (32 kb) == 0), a ring of `stages` of them per warp, launch bounds
    (32 * warps, min_blocks). v3's signature and workspace (v3_segments with cols = 32 kb);
    launched with v4_smem(...) bytes of dynamic shared memory. lm: the weight fragments by
    ldmatrix (chunks XOR row % 8; x read as fp32 pairs) instead of 16-byte shared loads. xs: the
    block splits each stage's x into bf16 high parts and remainders once, into shared memory
    (two slots, a block barrier per stage), instead of every warp splitting all of it."""
    key = (mode, warps, tiles, kb, stages, min_blocks, lm, xs)
    if key not in _V4:
        if (mode not in V3_MODES or warps not in (2, 4, 8) or tiles not in (1, 2) or kb not in (2, 4, 8, 16)
                or not 2 <= stages <= 8 or (mode == "swiglu" and tiles != 2) or not 1 <= warps * min_blocks <= 64
                or v4_smem(warps, tiles, kb, stages, xs) > V4_SMEM_MAX):
            raise ValueError(f"gemv_mma4: no build {key}")
        _V4[key] = _make_v4(*key)
    return _V4[key]


if config.ENABLE_CUDASIM:
    def _syncwarp() -> None:
        """The simulator: a rendezvous of the warp's 32 lanes (ptx_sim's collective-op barrier)."""
        from ninfer_nb.kernels.common import ptx_sim

        ptx_sim._slot()[1].wait()
else:
    @cuda.jit(device=True, inline=True)
    def _syncwarp():
        cuda.syncwarp()


@intrinsic
def _ldg_v2_f32(typingctx, arr, idx):
    """8-byte read-only load of arr.flat[idx], arr.flat[idx + 1] (float32, 8-byte aligned)."""
    if not isinstance(arr, nbtypes.Array) or not isinstance(idx, nbtypes.Integer):
        return None
    ret = nbtypes.UniTuple(nbtypes.float32, 2)

    def codegen(context, builder, sig, args):
        from llvmlite import ir

        addr = _element_address(context, builder, sig.args[0], args[0], args[1], sig.args[1])
        fnty = ir.FunctionType(ir.LiteralStructType([ir.FloatType()] * 2), [ir.IntType(64)])
        r = builder.call(ir.InlineAsm(fnty, "ld.global.nc.v2.f32 {$0,$1}, [$2];", "=f,=f,l", side_effect=False), [addr])
        return context.make_tuple(builder, ret, [builder.extract_value(r, j) for j in range(2)])

    return ret(arr, idx), codegen


@intrinsic
def _sts128(typingctx, saddr, a, b, c, d):
    """st.shared.v4.u32 of four words at a 32-bit shared address (16-byte aligned)."""
    if not all(isinstance(v, nbtypes.Integer) for v in (saddr, a, b, c, d)):
        return None

    def codegen(context, builder, sig, args):
        from llvmlite import ir

        vs = [context.cast(builder, args[j], sig.args[j], nbtypes.uint32) for j in range(5)]
        fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(32)] * 5)
        builder.call(ir.InlineAsm(fnty, "st.shared.v4.u32 [$0], {$1,$2,$3,$4};", "r,r,r,r,r,~{memory}",
                                  side_effect=True), vs)
        return context.get_dummy_value()

    return nbtypes.void(saddr, a, b, c, d), codegen


if config.ENABLE_CUDASIM:
    def _sts128(saddr, a, b, c, d) -> None:  # type: ignore[no-redef]
        import ctypes

        import numpy as np

        buf = np.array([a, b, c, d], np.uint32)
        ctypes.memmove(int(saddr), buf.ctypes.data, 16)

    def _ldg_v2_f32(arr, idx):  # type: ignore[no-redef]
        flat = arr.reshape(-1)
        return flat[int(idx)], flat[int(idx) + 1]


@cuda.jit(device=True, inline=True)
def _mma_hi_lo(acc, i, h, a1, a2, h0, h1, h2, h3, l0, l1, l2, l3):
    """acc[i, h, 0] += the tile's k-halves a1, a2 x the high words of x (h0..h3), acc[i, h, 1] +=
    the same x the remainder words (l0..l3): two accumulators, summed once at the end."""
    c = (acc[i, h, 0, 0], acc[i, h, 0, 1], acc[i, h, 0, 2], acc[i, h, 0, 3])
    c = mma_bf16(a1, h0, h1, c)
    c = mma_bf16(a2, h2, h3, c)
    d = (acc[i, h, 1, 0], acc[i, h, 1, 1], acc[i, h, 1, 2], acc[i, h, 1, 3])
    d = mma_bf16(a1, l0, l1, d)
    d = mma_bf16(a2, l2, l3, d)
    for e in range(4):
        acc[i, h, 0, e] = c[e]
        acc[i, h, 1, e] = d[e]


def _make_v4(mode: str, warps: int, tiles: int, kb: int, stages: int, min_blocks: int, lm: int, xs: int) -> Any:
    from ninfer_nb.kernels.linear.gemv_tiled import _gp, _saddr

    R = tiles
    KB = kb
    S = stages
    SWIGLU = mode == "swiglu"
    RB = warps * 16 * tiles                     # w rows per group (swiglu: half gate, half up)
    KS = 32 * kb                                # columns per stage
    ROWB = 64 * kb                              # bytes of a row in a stage
    CPR = 4 * kb                                # 16-byte chunks of a row in a stage
    RPI = max(1, 32 // CPR)                     # rows per cp.async instruction of the warp
    NI = 16 // RPI                              # rows a lane copies from per tile and stage
    CPP = max(1, CPR // 32)                     # its copies per row (512-byte runs; kb = 16: 2)
    SLOT = v4_stage_bytes(tiles, kb)
    WAIT = T1_WAITS[S - 2]
    SMEM = v4_smem(warps, tiles, kb, stages, xs)
    LM = lm != 0
    XS = xs != 0
    XROW = v4_xrow(kb)
    XSLOT = MAX_T * XROW
    TB = 32 * warps
    QX = (MAX_T * CPR + TB - 1) // TB           # staged-x items (a token's chunk) per thread
    SWM = 7 if LM else 1                        # chunk c of row r sits at c ^ SWS (r & SWM)
    SWS = 1 if LM else 4

    @cuda.jit(device=True, inline=True)
    def _issue(slot, pc, dsw):
        """cp.async of the next stage into ring slot `slot`: copy m of tile i from pc[i, m] (the
        lane's 16-byte chunk c = lane % CPR (+ 32 v) of row RPI m + lane // CPR of the tile, the rows past
        N clamped; then moved on a stage), stored at chunk c ^ 4 (row & 1) (ldmatrix:
        c ^ (row & 7)) of that row of the slot (dsw[m % 8]: its byte offset from row RPI m)."""
        for i in range(R):
            for m in range(NI):
                for v in range(CPP):
                    cp_async16w(slot + (i * 16 + m * RPI) * ROWB + 512 * v + dsw[m & 7], pc[i, m] + 512 * v)
                pc[i, m] += 2 * KS

    @cuda.jit(device=True, inline=True)
    def _blk(x, sa, co, xc, xb_base, two, acc, wr):
        """One 32-column block of a stage: the lane's fragments of rows g, g + 8 of each tile from
        slot address sa (+ chunk offset co), x of tokens g (flat xc), g + 8 (xb_base + xc - xa)."""
        for i in range(R):
            p = lds128(sa + i * 16 * ROWB + co)
            q = lds128(sa + (i * 16 + 8) * ROWB + co)
            for e in range(4):
                wr[i, e] = p[e]
                wr[i, 4 + e] = q[e]
        for h in range(2):
            if h == 0 or two:
                xh, xl = _x_split(x, xc if h == 0 else xb_base)
                for i in range(R):
                    a1 = (wr[i, 0], wr[i, 4], wr[i, 1], wr[i, 5])
                    a2 = (wr[i, 2], wr[i, 6], wr[i, 3], wr[i, 7])
                    _mma_hi_lo(acc, i, h, a1, a2, xh[0], xh[1], xh[2], xh[3], xl[0], xl[1], xl[2], xl[3])

    @cuda.jit(device=True, inline=True)
    def _pairs(x, xi):
        """x at flat xi + 0, 1 / + 8, 9 as (high, remainder) bf16x2 words: an mma's B registers."""
        pa = _ldg_v2_f32(x, xi)
        pb = _ldg_v2_f32(x, xi + 8)
        ha0, la0 = _split(pa[0])
        ha1, la1 = _split(pa[1])
        hb0, lb0 = _split(pb[0])
        hb1, lb1 = _split(pb[1])
        return pack_bf16x2(ha1, ha0), pack_bf16x2(hb1, hb0), pack_bf16x2(la1, la0), pack_bf16x2(lb1, lb0)

    @cuda.jit(device=True, inline=True)
    def _blk_lm(x, ring_s, j, lrow, lsw, lhc, xc, xd, two, acc, wa):
        """_blk with ldmatrix: mma s of block j takes chunks 4 j + 2 s (k 0..7) and 4 j + 2 s + 1
        (k 8..15) of the tile's 16 rows; lane (g, t) then holds elements 2 t, 2 t + 1 of each, so
        it reads x at columns 32 j + 16 s + 2 t (+ 8) as fp32 pairs."""
        c0 = ((4 * j + lhc) ^ lsw) << 4
        c1 = ((4 * j + 2 + lhc) ^ lsw) << 4
        for i in range(R):
            p = ldsm_x4(ring_s + i * 16 * ROWB + lrow + c0)
            q = ldsm_x4(ring_s + i * 16 * ROWB + lrow + c1)
            for e in range(4):
                wa[i, e] = p[e]
                wa[i, 4 + e] = q[e]
        for h in range(2):
            if h == 0 or two:
                xi = xc + 32 * j + (0 if h == 0 else xd)
                h0, h1, l0, l1 = _pairs(x, xi)
                h2, h3, l2, l3 = _pairs(x, xi + 16)
                for i in range(R):
                    a1 = (wa[i, 0], wa[i, 1], wa[i, 2], wa[i, 3])
                    a2 = (wa[i, 4], wa[i, 5], wa[i, 6], wa[i, 7])
                    _mma_hi_lo(acc, i, h, a1, a2, h0, h1, h2, h3, l0, l1, l2, l3)

    @cuda.jit(device=True, inline=True)
    def _xs_load(x, xr, col0, tid, n_tok, k_dim):
        """The thread's staged-x items of the stage at column col0: item tid + q TB is token
        item // CPR, chunk c = item % CPR: columns 8 c .. 8 c + 7 (ldmatrix: 32 (c // 4) + 8 q'
        + 2 (c % 4) + 0, 1 for q' = 0..3), into xr[q]."""
        for q in range(QX):
            it = tid + q * TB
            tok = it // CPR
            if tok < n_tok:
                c = it - tok * CPR
                if LM:
                    xi = tok * k_dim + col0 + 32 * (c >> 2) + 2 * (c & 3)
                    for e in range(4):
                        v = _ldg_v2_f32(x, xi + 8 * e)
                        xr[q, 2 * e] = v[0]
                        xr[q, 2 * e + 1] = v[1]
                else:
                    xi = tok * k_dim + col0 + 8 * c
                    a = ldg_v4_f32(x, xi)
                    b = ldg_v4_f32(x, xi + 4)
                    for e in range(4):
                        xr[q, e] = a[e]
                        xr[q, 4 + e] = b[e]

    @cuda.jit(device=True, inline=True)
    def _xs_store(xr, xslot, tid, n_tok):
        """xr's items split into bf16 high parts and remainders: token row, chunk c: 16 bytes of
        high words, then 16 of remainder words (the lanes' B registers, in order)."""
        for q in range(QX):
            it = tid + q * TB
            tok = it // CPR
            if tok < n_tok:
                c = it - tok * CPR
                h0, l0 = _split(xr[q, 0])
                h1, l1 = _split(xr[q, 1])
                h2, l2 = _split(xr[q, 2])
                h3, l3 = _split(xr[q, 3])
                h4, l4 = _split(xr[q, 4])
                h5, l5 = _split(xr[q, 5])
                h6, l6 = _split(xr[q, 6])
                h7, l7 = _split(xr[q, 7])
                a = xslot + tok * XROW + c * 32
                _sts128(a, pack_bf16x2(h1, h0), pack_bf16x2(h3, h2), pack_bf16x2(h5, h4), pack_bf16x2(h7, h6))
                _sts128(a + 16, pack_bf16x2(l1, l0), pack_bf16x2(l3, l2), pack_bf16x2(l5, l4),
                        pack_bf16x2(l7, l6))

    @cuda.jit(device=True, inline=True)
    def _blk_xs(xsl, j, t4, g, two, acc, wr, ring_s, sa, swz, lrow, lsw, lhc):
        """One 32-column block with staged x: the A fragments as _blk / _blk_lm read them, B from
        the x slot xsl (token 8 h + g, chunk 4 j + t: high words, remainder words)."""
        if LM:
            c0 = ((4 * j + lhc) ^ lsw) << 4
            c1 = ((4 * j + 2 + lhc) ^ lsw) << 4
            for i in range(R):
                p = ldsm_x4(ring_s + i * 16 * ROWB + lrow + c0)
                q = ldsm_x4(ring_s + i * 16 * ROWB + lrow + c1)
                for e in range(4):
                    wr[i, e] = p[e]
                    wr[i, 4 + e] = q[e]
        else:
            co = ((4 * j + t4) ^ swz) << 4
            for i in range(R):
                p = lds128(sa + i * 16 * ROWB + co)
                q = lds128(sa + (i * 16 + 8) * ROWB + co)
                wr[i, 0] = p[0]
                wr[i, 1] = q[0]
                wr[i, 2] = p[1]
                wr[i, 3] = q[1]
                wr[i, 4] = p[2]
                wr[i, 5] = q[2]
                wr[i, 6] = p[3]
                wr[i, 7] = q[3]
        for h in range(2):
            if h == 0 or two:
                xa = xsl + (8 * h + g) * XROW + (4 * j + t4) * 32
                xh = lds128(xa)
                xl = lds128(xa + 16)
                for i in range(R):
                    a1 = (wr[i, 0], wr[i, 1], wr[i, 2], wr[i, 3])
                    a2 = (wr[i, 4], wr[i, 5], wr[i, 6], wr[i, 7])
                    _mma_hi_lo(acc, i, h, a1, a2, xh[0], xh[1], xh[2], xh[3], xl[0], xl[1], xl[2], xl[3])

    def gemv_mma4_kernel(x, w, bias, out, has_bias, accumulate, ws, counter):
        smem = cuda.shared.array(0, uint32)
        flag = cuda.shared.array(1, int32)
        acc = cuda.local.array((R, 2, 2, 4), float32)  # tile, token half, (x high part, remainder), C fragment
        wr = cuda.local.array((R, 8), uint32)          # tile i: row g words 0..3, row g + 8 words 4..7
        xr = cuda.local.array((QX, 8), float32)        # xs: the thread's x items of the next stage
        pc = cuda.local.array((R, NI), int64)          # the global addresses of the lane's next copies
        dsw = cuda.local.array(8, int32)
        lane = int32(cuda.threadIdx.x & 31)
        warp = int32(cuda.threadIdx.x >> 5)
        g = lane >> 2
        t4 = lane & 3
        n_rows = w.shape[0]
        k_dim = w.shape[1]
        n_tok = x.shape[0]
        inter = out.shape[1] if SWIGLU else 0
        rows = inter if SWIGLU else n_rows
        rbo = RB // 2 if SWIGLU else RB
        nst = k_dim // KS
        n_units = int64((rows + rbo - 1) // rbo) * nst
        n_blk = int64(cuda.gridDim.x)
        b = int64(cuda.blockIdx.x)
        u = b * n_units // n_blk
        u_end = (b + 1) * n_units // n_blk
        xa_base = min(g, n_tok - 1) * k_dim + 8 * t4   # tokens past T read token T - 1: unstored columns
        xd = (min(g + 8, n_tok - 1) - min(g, n_tok - 1)) * k_dim
        two = n_tok > 8
        sraw = smem_u32(smem)
        ring = _saddr(((sraw + 127) & -128) + int64(warp) * (S * SLOT))
        xs0 = _saddr(((sraw + 127) & -128) + int64(warps * S * SLOT))   # xs: the two x slots
        tid = int32(cuda.threadIdx.x)
        wp = _gp(w)
        c_cp = lane % CPR                              # this lane's copy chunk and row within a copy
        r_cp = int32(lane // CPR)
        for q in range(8):
            dsw[q] = int32(r_cp * ROWB + ((c_cp ^ (SWS * ((q * RPI + r_cp) & SWM))) << 4))
        lrow = (lane & 15) * ROWB                      # ldmatrix: this lane's row address, its XOR, chunk of a pair
        lsw = lane & 7
        lhc = lane >> 4
        xp = min(g, n_tok - 1) * k_dim + 2 * t4        # ldmatrix: x pairs of token g
        sa0 = ring + g * ROWB
        swz = 4 * (g & 1)                              # rows g, g + 8: their chunks' XOR
        while u < u_end:
            gr = int32(u // nst)
            st = int32(u - int64(gr) * nst)
            st_end = int32(min(int64(nst), u_end - int64(gr) * nst))
            j0 = int32(gr * rbo + warp * 16 * (1 if SWIGLU else R))
            for i in range(R):
                for m in range(NI):
                    r = j0 + m * RPI + r_cp
                    if SWIGLU:
                        row = i * inter + min(r, inter - 1)
                    else:
                        row = min(r + 16 * i, n_rows - 1)   # rows past N: the last row, unused
                    pc[i, m] = wp + (int64(row) * k_dim + st * KS + 8 * c_cp) * 2
                for h in range(2):
                    for p_ in range(2):
                        for e in range(4):
                            acc[i, h, p_, e] = float32(0.0)
            _syncwarp()                                # every lane is done with the ring
            for s_ in range(S - 1):                    # the first S - 1 stages in flight
                if st + s_ < st_end:
                    _issue(ring + s_ * SLOT, pc, dsw)
                cp_async_commit()
            grid_dependency_sync()                     # x is the previous kernel's output
            xsi = 0                                    # xs: the x slot of stage st
            if XS:
                cuda.syncthreads()                     # every warp is done with the x slots
                _xs_load(x, xr, st * KS, tid, n_tok, k_dim)
                _xs_store(xr, xs0, tid, n_tok)
            rs = 0                                     # the slot stage st is in
            while st < st_end:
                WAIT()                                 # this lane's copies of stage st have landed
                _syncwarp()                            # ... and every lane's; slot rs - 1 is read
                if st + S - 1 < st_end:
                    _issue(ring + (rs - 1 if rs > 0 else S - 1) * SLOT, pc, dsw)
                cp_async_commit()
                sa = sa0 + rs * SLOT
                xc = xa_base + st * KS
                if XS:
                    cuda.syncthreads()                 # stage st's x is staged; the other slot is free
                    nxt = st + 1 < st_end
                    if nxt:
                        _xs_load(x, xr, (st + 1) * KS, tid, n_tok, k_dim)
                    xsl = xs0 + xsi * XSLOT
                    rsl = ring + rs * SLOT
                    _blk_xs(xsl, 0, t4, g, two, acc, wr, rsl, sa, swz, lrow, lsw, lhc)
                    if KB > 1:
                        _blk_xs(xsl, 1, t4, g, two, acc, wr, rsl, sa, swz, lrow, lsw, lhc)
                    if KB > 2:
                        _blk_xs(xsl, 2, t4, g, two, acc, wr, rsl, sa, swz, lrow, lsw, lhc)
                        _blk_xs(xsl, 3, t4, g, two, acc, wr, rsl, sa, swz, lrow, lsw, lhc)
                    if KB > 4:
                        _blk_xs(xsl, 4, t4, g, two, acc, wr, rsl, sa, swz, lrow, lsw, lhc)
                        _blk_xs(xsl, 5, t4, g, two, acc, wr, rsl, sa, swz, lrow, lsw, lhc)
                        _blk_xs(xsl, 6, t4, g, two, acc, wr, rsl, sa, swz, lrow, lsw, lhc)
                        _blk_xs(xsl, 7, t4, g, two, acc, wr, rsl, sa, swz, lrow, lsw, lhc)
                    if KB > 8:
                        _blk_xs(xsl, 8, t4, g, two, acc, wr, rsl, sa, swz, lrow, lsw, lhc)
                        _blk_xs(xsl, 9, t4, g, two, acc, wr, rsl, sa, swz, lrow, lsw, lhc)
                        _blk_xs(xsl, 10, t4, g, two, acc, wr, rsl, sa, swz, lrow, lsw, lhc)
                        _blk_xs(xsl, 11, t4, g, two, acc, wr, rsl, sa, swz, lrow, lsw, lhc)
                        _blk_xs(xsl, 12, t4, g, two, acc, wr, rsl, sa, swz, lrow, lsw, lhc)
                        _blk_xs(xsl, 13, t4, g, two, acc, wr, rsl, sa, swz, lrow, lsw, lhc)
                        _blk_xs(xsl, 14, t4, g, two, acc, wr, rsl, sa, swz, lrow, lsw, lhc)
                        _blk_xs(xsl, 15, t4, g, two, acc, wr, rsl, sa, swz, lrow, lsw, lhc)
                    if nxt:
                        _xs_store(xr, xs0 + (1 - xsi) * XSLOT, tid, n_tok)
                    xsi = 1 - xsi
                elif LM:
                    rsl = ring + rs * SLOT
                    xl_ = xp + st * KS
                    _blk_lm(x, rsl, 0, lrow, lsw, lhc, xl_, xd, two, acc, wr)
                    if KB > 1:
                        _blk_lm(x, rsl, 1, lrow, lsw, lhc, xl_, xd, two, acc, wr)
                    if KB > 2:
                        _blk_lm(x, rsl, 2, lrow, lsw, lhc, xl_, xd, two, acc, wr)
                        _blk_lm(x, rsl, 3, lrow, lsw, lhc, xl_, xd, two, acc, wr)
                    if KB > 4:
                        _blk_lm(x, rsl, 4, lrow, lsw, lhc, xl_, xd, two, acc, wr)
                        _blk_lm(x, rsl, 5, lrow, lsw, lhc, xl_, xd, two, acc, wr)
                        _blk_lm(x, rsl, 6, lrow, lsw, lhc, xl_, xd, two, acc, wr)
                        _blk_lm(x, rsl, 7, lrow, lsw, lhc, xl_, xd, two, acc, wr)
                    if KB > 8:
                        _blk_lm(x, rsl, 8, lrow, lsw, lhc, xl_, xd, two, acc, wr)
                        _blk_lm(x, rsl, 9, lrow, lsw, lhc, xl_, xd, two, acc, wr)
                        _blk_lm(x, rsl, 10, lrow, lsw, lhc, xl_, xd, two, acc, wr)
                        _blk_lm(x, rsl, 11, lrow, lsw, lhc, xl_, xd, two, acc, wr)
                        _blk_lm(x, rsl, 12, lrow, lsw, lhc, xl_, xd, two, acc, wr)
                        _blk_lm(x, rsl, 13, lrow, lsw, lhc, xl_, xd, two, acc, wr)
                        _blk_lm(x, rsl, 14, lrow, lsw, lhc, xl_, xd, two, acc, wr)
                        _blk_lm(x, rsl, 15, lrow, lsw, lhc, xl_, xd, two, acc, wr)
                else:
                    _blk(x, sa, ((0 + t4) ^ swz) << 4, xc, xc + xd, two, acc, wr)
                    if KB > 1:
                        _blk(x, sa, ((4 + t4) ^ swz) << 4, xc + 32, xc + 32 + xd, two, acc, wr)
                    if KB > 2:
                        _blk(x, sa, ((8 + t4) ^ swz) << 4, xc + 64, xc + 64 + xd, two, acc, wr)
                        _blk(x, sa, ((12 + t4) ^ swz) << 4, xc + 96, xc + 96 + xd, two, acc, wr)
                    if KB > 4:
                        _blk(x, sa, ((16 + t4) ^ swz) << 4, xc + 128, xc + 128 + xd, two, acc, wr)
                        _blk(x, sa, ((20 + t4) ^ swz) << 4, xc + 160, xc + 160 + xd, two, acc, wr)
                        _blk(x, sa, ((24 + t4) ^ swz) << 4, xc + 192, xc + 192 + xd, two, acc, wr)
                        _blk(x, sa, ((28 + t4) ^ swz) << 4, xc + 224, xc + 224 + xd, two, acc, wr)
                    if KB > 8:
                        _blk(x, sa, ((32 + t4) ^ swz) << 4, xc + 256, xc + 256 + xd, two, acc, wr)
                        _blk(x, sa, ((36 + t4) ^ swz) << 4, xc + 288, xc + 288 + xd, two, acc, wr)
                        _blk(x, sa, ((40 + t4) ^ swz) << 4, xc + 320, xc + 320 + xd, two, acc, wr)
                        _blk(x, sa, ((44 + t4) ^ swz) << 4, xc + 352, xc + 352 + xd, two, acc, wr)
                        _blk(x, sa, ((48 + t4) ^ swz) << 4, xc + 384, xc + 384 + xd, two, acc, wr)
                        _blk(x, sa, ((52 + t4) ^ swz) << 4, xc + 416, xc + 416 + xd, two, acc, wr)
                        _blk(x, sa, ((56 + t4) ^ swz) << 4, xc + 448, xc + 448 + xd, two, acc, wr)
                        _blk(x, sa, ((60 + t4) ^ swz) << 4, xc + 480, xc + 480 + xd, two, acc, wr)
                st += 1
                rs = rs + 1 if rs + 1 < S else 0
            for i in range(R):
                for h in range(2):
                    for e in range(4):
                        acc[i, h, 0, e] = acc[i, h, 0, e] + acc[i, h, 1, e]
            grid_dependency_sync()
            first = int32(((int64(gr) * nst + 1) * n_blk - 1) // n_units)
            last = int32((int64(gr + 1) * nst * n_blk - 1) // n_units)
            done = True
            if last > first:                          # partial sums meet in ws; the last to arrive adds them
                seg = int32(b) - first
                for i in range(R):
                    for h in range(2):
                        for e in range(4):
                            tok = 8 * h + 2 * t4 + (e & 1)
                            jj = j0 + 16 * (0 if SWIGLU else i) + g + 8 * (e >> 1)
                            if jj < rows and tok < n_tok:
                                ws[seg, tok, i * inter + jj if SWIGLU else jj] = acc[i, h, 0, e]
                _fence()
                cuda.syncthreads()
                if cuda.threadIdx.x == 0:
                    flag[0] = int32(cuda.atomic.add(counter, gr, 1) == last - first)
                cuda.syncthreads()
                done = flag[0] != 0
                if done:
                    _fence()
                    if cuda.threadIdx.x == 0:
                        counter[gr] = 0
                    for i in range(R):
                        for h in range(2):
                            for e in range(4):
                                tok = 8 * h + 2 * t4 + (e & 1)
                                jj = j0 + 16 * (0 if SWIGLU else i) + g + 8 * (e >> 1)
                                if jj < rows and tok < n_tok:
                                    s = float32(0.0)
                                    for q_ in range(last - first + 1):
                                        s += ws[q_, tok, i * inter + jj if SWIGLU else jj]
                                    acc[i, h, 0, e] = s
            if done:
                for h in range(2):
                    for e in range(4):
                        tok = 8 * h + 2 * t4 + (e & 1)
                        if tok < n_tok:
                            if SWIGLU:
                                jj = j0 + g + 8 * (e >> 1)
                                if jj < inter:
                                    gv = acc[0, h, 0, e]
                                    out[tok, jj] = gv / (float32(1.0) + math.exp(-gv)) * acc[1, h, 0, e]
                            else:
                                for i in range(R):
                                    row = j0 + 16 * i + g + 8 * (e >> 1)
                                    if row < n_rows:
                                        v = acc[i, h, 0, e]
                                        if has_bias != 0:
                                            v += bias[row]
                                        if accumulate != 0:
                                            v += out[tok, row]
                                        out[tok, row] = v
            u = int64(gr) * nst + st_end
        grid_dependency_sync()

    gemv_mma4_kernel.__name__ = v4_name(mode, warps, tiles, kb, stages, min_blocks, lm, xs)
    return kernel((f32_2, u16_2, f32_1, f32_2, i32, i32, f32_3, i32_1), sim=True, fastmath=True,
                  launch_bounds=(32 * warps, min_blocks), self_sync=True, dynamic_smem=SMEM)(gemv_mma4_kernel)


# The v4 builds ops/cuda/linear.py may pick (mma4_plan), registered at import for the compile tests.
V4_BUILDS = (("plain", 8, 1, 4, 3, 2, 1, 1), ("swiglu", 4, 2, 4, 3, 2, 1, 1))
for _b4 in V4_BUILDS:
    gemv_mma4(*_b4)
