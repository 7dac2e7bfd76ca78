"""Embedding gather: table [V, H] (bf16 as uint16, or fp32) rows at ids [T] int32 -> fp32 [T, H].

Ids are read from device memory (graph-safe); out-of-range ids are not checked here.
"""
from __future__ import annotations

from numba import cuda

from ninfer_nb.kernels.common.bf16 import bf16_to_f32
from ninfer_nb.kernels.common.nbtypes import f32_2, i32_1, u16_2
from ninfer_nb.kernels.common.registry import kernel

BLOCK = 256


@kernel((u16_2, i32_1, f32_2))
def embedding_bf16_kernel(table, ids, out):
    """grid (ceil(H / 256), T)."""
    t = cuda.blockIdx.y
    h = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if h < out.shape[1]:
        out[t, h] = bf16_to_f32(table[ids[t], h])


@kernel((f32_2, i32_1, f32_2))
def embedding_f32_kernel(table, ids, out):
    t = cuda.blockIdx.y
    h = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if h < out.shape[1]:
        out[t, h] = table[ids[t], h]
