"""KV-cache element access for fp32, bf16 (uint16 bits) and int8 caches, resolved per signature.

`kv_load(cache, scales, j, h, d)` -> float32: int8 caches hold codes with one fp32 scale per 64
values (`scales[j, h, d // 64]`); fp32 / bf16 caches ignore `scales`. Int8 codes follow the
NInfer INT8-G64 rule with an fp32 scale: s = amax / 127, code = clamp(rint(x / s), -127, 127),
s = 0 -> codes 0. Under the CUDA simulator the same name is a plain Python function.
"""
from __future__ import annotations

import numpy as np
from numba import config, cuda

from ninfer_nb.kernels.common.bf16 import widen

GROUP = 64

if config.ENABLE_CUDASIM:

    def _kv_load(cache, scales, j, h, d):
        if cache.dtype == np.int8:
            return np.float32(cache[j, h, d]) * scales[j, h, d // GROUP]
        return widen(cache[j, h, d])

    kv_load = cuda.jit(device=True)(_kv_load)
else:
    from numba import float32
    from numba.cuda import types
    from numba.cuda.extending import overload

    def kv_load(cache, scales, j, h, d):  # pragma: no cover - replaced by the overload
        raise NotImplementedError

    @overload(kv_load)
    def _kv_load_ol(cache, scales, j, h, d):
        if isinstance(cache, types.Array) and cache.dtype == types.int8:
            return lambda cache, scales, j, h, d: float32(cache[j, h, d]) * scales[j, h, d // GROUP]
        return lambda cache, scales, j, h, d: widen(cache[j, h, d])
