"""Elementwise fp32 kernels: add, silu, sigmoid, sigmoid_mul (grid-stride loops over flat
vectors), swiglu and split (row-wise: [T, N] inputs).

swiglu_kernel walks a flat index and divides it by the row length per element (a 2-D grid
was no faster for it); split_rows_kernel runs on a 2-D grid (column blocks x rows, `row_grid`),
each thread taking its row and column from the block indices, with no 64-bit division. No bf16
here.
"""
from __future__ import annotations

import math

from numba import cuda, float32

from ninfer_nb.kernels.common.nbtypes import f32_1, f32_2, i32
from ninfer_nb.kernels.common.registry import kernel

BLOCK = 256


def grid_for(n: int, block: int = BLOCK, cap: int = 65535) -> int:
    return max(1, min(cap, (n + block - 1) // block))


def row_grid(rows: int, cols: int, block: int = BLOCK) -> tuple[int, int]:
    """(column blocks, row blocks) for the row-wise kernels (rows past 65535 loop)."""
    return max(1, (cols + block - 1) // block), max(1, min(rows, 65535))


@kernel((f32_1, f32_1, f32_1))
def add_kernel(x, y, out):
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < out.shape[0]:
        out[i] = x[i] + y[i]
        i += stride


@kernel((f32_1, f32_1))
def silu_kernel(x, out):
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < out.shape[0]:
        v = x[i]
        out[i] = v / (float32(1.0) + math.exp(-v))
        i += stride


@kernel((f32_1, f32_1))
def sigmoid_kernel(x, out):
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < out.shape[0]:
        out[i] = float32(1.0) / (float32(1.0) + math.exp(-x[i]))
        i += stride


@kernel((f32_1, f32_1, f32_1, i32))
def sigmoid_mul_kernel(x, gate, out, group):
    """out[i] = x[i] * sigmoid(gate[i // group]); group > 1 broadcasts a per-row gate [T, 1]."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < out.shape[0]:
        out[i] = x[i] * (float32(1.0) / (float32(1.0) + math.exp(-gate[i // group])))
        i += stride


@kernel((f32_2, f32_2))
def swiglu_kernel(gate_up, out):
    """gate_up [T, 2I] -> out [T, I] = silu(gate) * up."""
    inter = out.shape[1]
    n = out.shape[0] * inter
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < n:
        t = i // inter
        j = i - t * inter
        g = gate_up[t, j]
        out[t, j] = (g / (float32(1.0) + math.exp(-g))) * gate_up[t, inter + j]
        i += stride


@cuda.jit(device=True, inline=True)
def split_part(c, n, b1, b2, b3):
    """Column c's part [lo, hi) of N columns split at b1 <= b2 <= b3 (shared with conv1d)."""
    lo = 0
    hi = b1
    if c >= b3:
        lo = b3
        hi = n
    elif c >= b2:
        lo = b2
        hi = b3
    elif c >= b1:
        lo = b1
        hi = b2
    return lo, hi


@cuda.jit(device=True, inline=True)
def _split_dest(r, c, t_rows, n, b1, b2, b3):
    """Index in split's output of x[r, c]: its part [lo, hi) stored [T, hi - lo] after the parts
    before it."""
    lo, hi = split_part(c, n, b1, b2, b3)
    return lo * t_rows + r * (hi - lo) + (c - lo)


@kernel((f32_2, f32_1, i32, i32, i32))
def split_rows_kernel(x, out, b1, b2, b3):
    """x [T, N] -> out: the parts x[:, 0:b1], x[:, b1:b2], x[:, b2:b3], x[:, b3:N], each stored
    contiguously ([T, size] row-major) one after another. Grid row_grid(T, N), block BLOCK."""
    t_rows = x.shape[0]
    n = x.shape[1]
    c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if c >= n:
        return
    for r in range(cuda.blockIdx.y, t_rows, cuda.gridDim.y):
        out[_split_dest(r, c, t_rows, n, b1, b2, b3)] = x[r, c]
