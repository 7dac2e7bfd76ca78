"""Warp-level device helpers shared by the kernels (full-mask shuffles, through ptx.shfl_xor so
the CUDA simulator can emulate them)."""
from __future__ import annotations

from numba import cuda

from ninfer_nb.kernels.ptx import shfl_xor

FULL = 0xFFFFFFFF


@cuda.jit(device=True)
def warp_sum(v):
    """Butterfly sum over the 32 lanes; every lane gets the total."""
    v += shfl_xor(v, 16)
    v += shfl_xor(v, 8)
    v += shfl_xor(v, 4)
    v += shfl_xor(v, 2)
    v += shfl_xor(v, 1)
    return v


@cuda.jit(device=True)
def warp_max(v):
    """Butterfly max over the 32 lanes; every lane gets it."""
    v = max(v, shfl_xor(v, 16))
    v = max(v, shfl_xor(v, 8))
    v = max(v, shfl_xor(v, 4))
    v = max(v, shfl_xor(v, 2))
    return max(v, shfl_xor(v, 1))
