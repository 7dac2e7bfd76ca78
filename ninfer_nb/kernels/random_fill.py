"""Fill device buffers with reproducible pseudo-random values (benchmark weights built on the GPU).

out[i] = offset + scale * u(i, seed), u uniform in [-1, 1) from an integer hash of (i, seed);
bf16 buffers are written as uint16 bits (round to nearest even); `fill_random_u32_kernel` writes
the hash itself (random bytes). Knows nothing about models.
"""
from __future__ import annotations

from numba import cuda, uint32

from ninfer_nb.kernels.common.nbtypes import f32, f32_1, i64, u16_1
from ninfer_nb.kernels.common.registry import kernel

_MASK = 0xFFFFFFFF
u32_1 = uint32[::1]


@cuda.jit(device=True, inline=True)
def _uniform(i, seed):
    """Hash (i, seed) to a float in [-1, 1) (murmur3 finaliser on 32-bit lanes held in int64)."""
    h = (i * 0x9E3779B1 + seed * 0x85EBCA77) & _MASK
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _MASK
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _MASK
    h ^= h >> 16
    return (h & 0xFFFFFF) * (2.0 / 16777216.0) - 1.0


@kernel((f32_1, i64, f32, f32))
def fill_uniform_f32_kernel(out, seed, scale, offset):
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < out.shape[0]:
        out[i] = offset + scale * _uniform(i, seed)
        i += stride


@kernel((u16_1, i64, f32, f32))
def fill_uniform_bf16_kernel(out, seed, scale, offset):
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < out.shape[0]:
        v = cuda.libdevice.float_as_int(offset + scale * _uniform(i, seed)) & _MASK
        out[i] = ((v + 0x7FFF + ((v >> 16) & 1)) >> 16) & 0xFFFF
        i += stride


@kernel((u32_1, i64))
def fill_random_u32_kernel(out, seed):
    """out[i] = 32 hashed bits of (i, seed): uniform random bytes (random quantized codes)."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < out.shape[0]:
        h = (i * 0x9E3779B1 + seed * 0x85EBCA77) & _MASK
        h ^= h >> 16
        h = (h * 0x85EBCA6B) & _MASK
        h ^= h >> 13
        h = (h * 0xC2B2AE35) & _MASK
        h ^= h >> 16
        out[i] = h
        i += stride
