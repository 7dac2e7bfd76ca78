"""bfloat16 <-> float32 bit conversions for uint16-stored bf16 (no cuda.bf16 shims).

Keeping bf16 as uint16 avoids linked C++ shims, so kernels stay disk-cacheable.
`widen(v)`: uint16 (bf16 bits) or float32 element -> float32, resolved at compile time.
`from_f32(arr, v)`: float32 -> the element type of `arr` (bf16 bits for uint16 arrays).
`f32_bits` / `bits_f32`: float32 <-> int32 bit casts.
Under the CUDA simulator (NUMBA_ENABLE_CUDASIM=1) the same names are NumPy functions.
Rounding: round-to-nearest-even, NaN stays NaN (quiet), like ml_dtypes.
"""
from __future__ import annotations

import numpy as np
from numba import config, cuda

if config.ENABLE_CUDASIM:

    def _bf16_to_f32(u):
        return np.uint32(int(u) << 16).view(np.float32)

    def _f32_to_bf16(x):
        b = int(np.float32(x).view(np.uint32))
        if (b & 0x7FFFFFFF) > 0x7F800000:
            return np.uint16((b >> 16) | 0x40)
        return np.uint16(((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF)

    def _widen(v):
        return _bf16_to_f32(v) if isinstance(v, np.uint16) else np.float32(v)

    def _from_f32(arr, v):
        return _f32_to_bf16(v) if arr.dtype == np.uint16 else v

    def _f32_bits(x):
        return np.float32(x).view(np.int32)

    def _bits_f32(i):
        return np.int32(i).view(np.float32)

    f32_bits = cuda.jit(device=True)(_f32_bits)
    bits_f32 = cuda.jit(device=True)(_bits_f32)
    bf16_to_f32 = cuda.jit(device=True)(_bf16_to_f32)
    f32_to_bf16 = cuda.jit(device=True)(_f32_to_bf16)
    widen = cuda.jit(device=True)(_widen)
    from_f32 = cuda.jit(device=True)(_from_f32)
else:
    from numba import float32, int32, int64, uint16
    from numba.cuda import libdevice, types
    from numba.cuda.extending import overload

    @cuda.jit(device=True)
    def f32_bits(x):
        return libdevice.float_as_int(x)

    @cuda.jit(device=True)
    def bits_f32(i):
        return libdevice.int_as_float(int32(i))

    @cuda.jit(device=True)
    def bf16_to_f32(u):
        return libdevice.int_as_float(int32(int64(u) << 16))

    @cuda.jit(device=True)
    def f32_to_bf16(x):
        b = int64(libdevice.float_as_int(x)) & 0xFFFFFFFF
        if (b & 0x7FFFFFFF) > 0x7F800000:
            return uint16((b >> 16) | 0x40)
        return uint16((b + 0x7FFF + ((b >> 16) & 1)) >> 16)

    def widen(v):  # pragma: no cover - replaced by the overload inside kernels
        raise NotImplementedError

    def from_f32(arr, v):  # pragma: no cover
        raise NotImplementedError

    @overload(widen)
    def _widen_ol(v):
        if isinstance(v, types.Integer) and v.bitwidth == 16:
            return lambda v: bf16_to_f32(v)
        if isinstance(v, types.Float):
            return lambda v: float32(v)
        return None

    @overload(from_f32)
    def _from_f32_ol(arr, v):
        if isinstance(arr, types.Array) and arr.dtype == types.uint16:
            return lambda arr, v: f32_to_bf16(v)
        if isinstance(arr, types.Array) and arr.dtype == types.float32:
            return lambda arr, v: float32(v)
        return None
