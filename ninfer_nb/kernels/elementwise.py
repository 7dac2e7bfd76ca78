"""Elementwise fp32 kernels: add, silu, sigmoid, swiglu, sigmoid_mul, split (grid-stride loops).

Inputs are flattened C-contiguous fp32 vectors (swiglu: [T, 2I] -> [T, I]). No bf16 here.
"""
from __future__ import annotations

import math

from numba import cuda

from ninfer_nb.kernels.nbtypes import f32_1, f32_2, i32
from ninfer_nb.kernels.registry import kernel

BLOCK = 256


def grid_for(n: int, block: int = BLOCK, cap: int = 65535) -> int:
    return max(1, min(cap, (n + block - 1) // block))


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
        out[i] = v / (1.0 + math.exp(-v))
        i += stride


@kernel((f32_1, f32_1))
def sigmoid_kernel(x, out):
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < out.shape[0]:
        out[i] = 1.0 / (1.0 + math.exp(-x[i]))
        i += stride


@kernel((f32_1, f32_1, f32_1, i32))
def sigmoid_mul_kernel(x, gate, out, group):
    """out[i] = x[i] * sigmoid(gate[i // group]); group > 1 broadcasts a per-row gate [T, 1]."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < out.shape[0]:
        out[i] = x[i] * (1.0 / (1.0 + math.exp(-gate[i // group])))
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
        out[t, j] = (g / (1.0 + math.exp(-g))) * gate_up[t, inter + j]
        i += stride


@kernel((f32_2, f32_1, i32, i32, i32))
def split_kernel(x, out, b1, b2, b3):
    """x [T, N] -> out: the parts x[:, 0:b1], x[:, b1:b2], x[:, b2:b3], x[:, b3:N], each stored
    contiguously ([T, size] row-major) one after another. Grid-stride over T * N."""
    t_rows = x.shape[0]
    n = x.shape[1]
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < t_rows * n:
        r = i // n
        c = i - r * n
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
        out[lo * t_rows + r * (hi - lo) + (c - lo)] = x[r, c]
        i += stride
