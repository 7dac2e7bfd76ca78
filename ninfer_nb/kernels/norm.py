"""Row norms (fp32): rms_norm, add + rms_norm (fused residual), gated_rms_norm (GDN output
norm: rmsnorm * silu(z)). One block per row with a block reduction, except gated_rms_norm on
rows up to WARP_ROW_MAX_D (256) wide: one warp per row (gated_rms_norm_warp_kernel), the
GDN heads' 128-wide rows (4x faster there than a block per row). Wider rows keep
gated_rms_norm_kernel (one block per row).

Rows are [R, D] fp32; weights [D] fp32. The block size is the launcher's choice
(`threads_for`): a decode step normalises one hidden-size row, so wide rows get 1024 threads
(few dependent loads each), narrow head rows no more threads than elements. The block sum is
warp shuffles plus one shared exchange (2 barriers); under the CUDA simulator, which has no
shuffles, it is a shared tree. add_rms_norm_rows_kernel takes every row count
(>= ROWS_MIN_R = 1) whose width is a multiple of 1024 and whose arrays are 16-byte aligned:
256 threads per row and float4 loads / stores. add_rms_norm (always a hidden-size row) keeps
each thread's (at most PER_THREAD) elements in registers and issues all its loads before any
store (the arrays may alias, so the compiler may not reorder loads past stores itself).
Its rows may not exceed PER_THREAD x 1024 = 8192 (CudaOps checks); launch_bounds(1024, 1)
keeps it at <= 64 registers, so a 1024-thread block can launch (a register-array
gated_rms_norm at 1024 threads failed with CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES without it).
"""
from __future__ import annotations

import math

from numba import config, cuda, float32

from ninfer_nb.kernels.common.nbtypes import f32, f32_1, f32_2, i32
from ninfer_nb.kernels.common.ptx import ldg_v4_f32, st_v4_f32
from ninfer_nb.kernels.common.registry import kernel
from ninfer_nb.kernels.common.warp import warp_sum

BLOCK = 256             # threads per row for rows up to WIDE_D
MAX_BLOCK = 1024        # threads per row above it (and the reduction buffer's size)
WIDE_D = 2048


def threads_for(d: int) -> int:
    """Threads per row: a power of two (the reduction needs one), no more than the row has
    elements (q/k norms run 128/256-wide head rows), 1024 above WIDE_D."""
    if d > WIDE_D:
        return MAX_BLOCK
    n = 32
    while n < d and n < BLOCK:
        n *= 2
    return n


if config.ENABLE_CUDASIM:
    @cuda.jit(device=True)
    def _block_sum(red, v):
        """Sum of v over a power-of-two block; every thread gets the result (shared tree)."""
        tid = cuda.threadIdx.x
        red[tid] = v
        cuda.syncthreads()
        s = cuda.blockDim.x // 2
        while s > 0:
            if tid < s:
                red[tid] += red[tid + s]
            cuda.syncthreads()
            s //= 2
        total = red[0]
        cuda.syncthreads()
        return total
else:
    @cuda.jit(device=True)
    def _block_sum(red, v):
        """Sum of v over a block of whole warps; every thread gets the result. `red`: shared
        [MAX_BLOCK] (its first 32 slots hold the warps' partial sums)."""
        tid = cuda.threadIdx.x
        lane = tid & 31
        v = warp_sum(v)
        if lane == 0:
            red[tid >> 5] = v
        cuda.syncthreads()
        part = red[lane] if lane < (cuda.blockDim.x >> 5) else float32(0.0)
        total = warp_sum(part)                  # every warp sums the partials itself
        cuda.syncthreads()                      # red is free again for a next call
        return total


PER_THREAD = 8          # row elements a thread keeps in registers
MAX_D = PER_THREAD * MAX_BLOCK


@kernel((f32_2, f32_1, f32_2, f32))
def rms_norm_kernel(x, w, out, eps):
    """grid R, block threads_for(D): out[r] = x[r] / rms(x[r]) * w. A plain strided loop: its
    rows are mostly narrow (q / k norms over 128- or 256-wide heads), where a register-array
    version's 64 registers halved the occupancy of a prefill's ~100K small blocks."""
    red = cuda.shared.array(MAX_BLOCK, float32)
    r = cuda.blockIdx.x
    d = x.shape[1]
    acc = float32(0.0)
    for i in range(cuda.threadIdx.x, d, cuda.blockDim.x):
        v = x[r, i]
        acc += v * v
    ss = _block_sum(red, acc)
    inv = float32(1.0) / math.sqrt(ss / float32(d) + eps)
    for i in range(cuda.threadIdx.x, d, cuda.blockDim.x):
        out[r, i] = (x[r, i] * inv) * w[i]


@kernel((f32_2, f32_2, f32_1, f32_2, f32_2, f32), launch_bounds=(MAX_BLOCK, 1))
def add_rms_norm_kernel(x, residual, w, out, new_residual, eps):
    """grid R, block threads_for(D): new_residual = x + residual; out = rms_norm(new_residual) * w.
    out / new_residual may be x / residual (each element is read before it is written)."""
    red = cuda.shared.array(MAX_BLOCK, float32)
    hv = cuda.local.array(PER_THREAD, float32)
    rv = cuda.local.array(PER_THREAD, float32)
    wv = cuda.local.array(PER_THREAD, float32)
    r = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nthr = cuda.blockDim.x
    d = x.shape[1]
    for e in range(PER_THREAD):                  # all loads issued before any store
        i = tid + e * nthr
        hv[e] = x[r, i] if i < d else float32(0.0)
        rv[e] = residual[r, i] if i < d else float32(0.0)
        wv[e] = w[i] if i < d else float32(0.0)
    acc = float32(0.0)
    for e in range(PER_THREAD):
        v = hv[e] + rv[e]
        hv[e] = v
        acc += v * v
    for e in range(PER_THREAD):
        i = tid + e * nthr
        if i < d:
            new_residual[r, i] = hv[e]
    ss = _block_sum(red, acc)
    inv = float32(1.0) / math.sqrt(ss / d + eps)
    for e in range(PER_THREAD):
        i = tid + e * nthr
        if i < d:
            out[r, i] = (hv[e] * inv) * wv[e]


ROWS_THREADS = 256      # add_rms_norm_rows_kernel: block per row
ROWS_MAX_V4 = 8         # float4 per thread: rows up to MAX_D wide
ROWS_REGS = 32          # = 4 * ROWS_MAX_V4 (a literal: local array sizes must be plain constants)
assert ROWS_MAX_V4 * 4 * ROWS_THREADS == MAX_D and ROWS_REGS == 4 * ROWS_MAX_V4
ROWS_MIN_R = 1          # CudaOps: rows from which the rows kernel is used (decode too)


@kernel((f32_1, f32_1, f32_1, f32_1, f32_1, i32, f32), launch_bounds=(ROWS_THREADS, 3))
def add_rms_norm_rows_kernel(x, residual, w, out, new_residual, d, eps):
    """add_rms_norm: grid R, block ROWS_THREADS; rows d wide (d % (4 * ROWS_THREADS) == 0,
    <= MAX_D), flat row-major [R * d] arrays, 16-byte aligned. Each thread keeps d / 1024
    float4 of x + residual in registers (16-byte loads, all issued before any store), so a
    2048-token chunk's rows run several blocks per SM instead of add_rms_norm_kernel's two
    1024-thread blocks.
    Aliasing as add_rms_norm_kernel (every element is read by the thread that writes it)."""
    red = cuda.shared.array(MAX_BLOCK, float32)
    hv = cuda.local.array(ROWS_REGS, float32)
    tid = cuda.threadIdx.x
    n4 = d // (4 * ROWS_THREADS)
    base = cuda.blockIdx.x * d
    acc = float32(0.0)
    for e in range(ROWS_MAX_V4):
        if e < n4:
            i = base + (tid + e * ROWS_THREADS) * 4
            a = ldg_v4_f32(x, i)
            b = ldg_v4_f32(residual, i)
            hv[4 * e] = a[0] + b[0]
            hv[4 * e + 1] = a[1] + b[1]
            hv[4 * e + 2] = a[2] + b[2]
            hv[4 * e + 3] = a[3] + b[3]
    for e in range(ROWS_MAX_V4):
        if e < n4:
            v0, v1, v2, v3 = hv[4 * e], hv[4 * e + 1], hv[4 * e + 2], hv[4 * e + 3]
            acc += v0 * v0 + v1 * v1 + v2 * v2 + v3 * v3
            st_v4_f32(new_residual, base + (tid + e * ROWS_THREADS) * 4, v0, v1, v2, v3)
    ss = _block_sum(red, acc)
    inv = float32(1.0) / math.sqrt(ss / float32(d) + eps)
    for e in range(ROWS_MAX_V4):
        if e < n4:
            j = (tid + e * ROWS_THREADS) * 4
            g = ldg_v4_f32(w, j)
            st_v4_f32(out, base + j, hv[4 * e] * inv * g[0], hv[4 * e + 1] * inv * g[1],
                      hv[4 * e + 2] * inv * g[2], hv[4 * e + 3] * inv * g[3])


@kernel((f32_2, f32_2, f32_1, f32_2, f32))
def gated_rms_norm_kernel(x, z, w, out, eps):
    """grid R, block threads_for(D): out = rms_norm(x) * w * silu(z). A plain strided loop, for
    the same reason as rms_norm_kernel. CudaOps runs it only for rows wider than
    WARP_ROW_MAX_D; narrower ones (the GDN heads' 128) go to gated_rms_norm_warp_kernel."""
    red = cuda.shared.array(MAX_BLOCK, float32)
    r = cuda.blockIdx.x
    d = x.shape[1]
    acc = float32(0.0)
    for i in range(cuda.threadIdx.x, d, cuda.blockDim.x):
        v = x[r, i]
        acc += v * v
    ss = _block_sum(red, acc)
    inv = float32(1.0) / math.sqrt(ss / float32(d) + eps)
    for i in range(cuda.threadIdx.x, d, cuda.blockDim.x):
        zz = z[r, i]
        out[r, i] = ((x[r, i] * inv) * w[i]) * (zz / (float32(1.0) + math.exp(-zz)))


WARP_ROWS = 8           # gated_rms_norm_warp_kernel: rows (warps) per block
WARP_ROW_MAX_D = 256    # ... and the widest row it takes (8 elements per lane)
WARP_RED = 32 * WARP_ROWS

if config.ENABLE_CUDASIM:
    @cuda.jit(device=True)
    def _row_sum(red, v):
        """Sum of v over the 32 lanes of this warp (the simulator has no shuffles: a shared row
        per warp and block barriers, which every warp of the block reaches)."""
        lane = cuda.threadIdx.x & 31
        warp = cuda.threadIdx.x >> 5
        red[warp * 32 + lane] = v
        cuda.syncthreads()
        total = float32(0.0)
        for i in range(32):
            total += red[warp * 32 + i]
        cuda.syncthreads()
        return total
else:
    @cuda.jit(device=True)
    def _row_sum(red, v):
        """Sum of v over the 32 lanes of this warp (shuffles; `red` unused)."""
        return warp_sum(v)


@kernel((f32_2, f32_2, f32_1, f32_2, f32))
def gated_rms_norm_warp_kernel(x, z, w, out, eps):
    """grid ceil(R / WARP_ROWS), block 32 * WARP_ROWS: out = rms_norm(x) * w * silu(z), one warp
    per row of D <= WARP_ROW_MAX_D (lane: elements lane + 32 e, every load issued before the
    math, the sum of squares by shuffles: no shared memory, no barrier). For the GDN output
    norm's 128-wide rows, where gated_rms_norm_kernel runs one 128-thread block per row with
    two barriers each; CudaOps uses it for every row it fits."""
    red = cuda.shared.array(WARP_RED, float32)             # the simulator's lane exchange only
    xv = cuda.local.array(8, float32)
    zv = cuda.local.array(8, float32)
    wv = cuda.local.array(8, float32)
    lane = cuda.threadIdx.x & 31
    r = cuda.blockIdx.x * WARP_ROWS + (cuda.threadIdx.x >> 5)
    n_rows = x.shape[0]
    d = x.shape[1]
    rc = min(r, n_rows - 1)                                # warps past the last row compute it again
    acc = float32(0.0)
    for e in range(8):
        i = lane + 32 * e
        ok = i < d
        xv[e] = x[rc, i] if ok else float32(0.0)
        zv[e] = z[rc, i] if ok else float32(0.0)
        wv[e] = w[i] if ok else float32(0.0)
    for e in range(8):
        acc += xv[e] * xv[e]
    ss = _row_sum(red, acc)
    inv = float32(1.0) / math.sqrt(ss / float32(d) + eps)
    if r < n_rows:
        for e in range(8):
            i = lane + 32 * e
            if i < d:
                zz = zv[e]
                out[r, i] = ((xv[e] * inv) * wv[e]) * (zz / (float32(1.0) + math.exp(-zz)))
