"""Warp-level device helpers shared by the kernels (full-mask shuffles, through ptx.shfl_xor so
the CUDA simulator can emulate them)."""
from __future__ import annotations

from numba import cuda

from ninfer_nb.kernels.common.ptx import shfl_xor

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


@cuda.jit(device=True, inline=True)
def warp_sum2(a, b):
    """warp_sum of two values, their butterflies interleaved (two independent shuffle chains:
    about the latency of one)."""
    a += shfl_xor(a, 16)
    b += shfl_xor(b, 16)
    a += shfl_xor(a, 8)
    b += shfl_xor(b, 8)
    a += shfl_xor(a, 4)
    b += shfl_xor(b, 4)
    a += shfl_xor(a, 2)
    b += shfl_xor(b, 2)
    a += shfl_xor(a, 1)
    b += shfl_xor(b, 1)
    return a, b


@cuda.jit(device=True, inline=True)
def warp_sum4(a, b, c, d):
    """warp_sum of four values, their butterflies interleaved."""
    for off in (16, 8, 4, 2, 1):
        a += shfl_xor(a, off)
        b += shfl_xor(b, off)
        c += shfl_xor(c, off)
        d += shfl_xor(d, off)
    return a, b, c, d


@cuda.jit(device=True)
def warp_max(v):
    """Butterfly max over the 32 lanes; every lane gets it."""
    v = max(v, shfl_xor(v, 16))
    v = max(v, shfl_xor(v, 8))
    v = max(v, shfl_xor(v, 4))
    v = max(v, shfl_xor(v, 2))
    return max(v, shfl_xor(v, 1))
