"""Warp-level device helpers shared by the kernels (full-mask shuffles)."""
from __future__ import annotations

from numba import cuda

FULL = 0xFFFFFFFF


@cuda.jit(device=True)
def warp_sum(v):
    """Butterfly sum over the 32 lanes; every lane gets the total."""
    v += cuda.shfl_xor_sync(FULL, v, 16)
    v += cuda.shfl_xor_sync(FULL, v, 8)
    v += cuda.shfl_xor_sync(FULL, v, 4)
    v += cuda.shfl_xor_sync(FULL, v, 2)
    v += cuda.shfl_xor_sync(FULL, v, 1)
    return v
