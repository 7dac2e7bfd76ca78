"""GPTQ-style rounding for the symmetric groupwise formats (`ninfer convert --method gptq`).

Rounding every weight to its nearest code (quant/search.py picks only the scales) ignores that
the layer's output error is dW @ x, so errors in correlated input columns can cancel. GPTQ
(Frantar et al. 2022, the algorithm AutoGPTQ / GPTQModel run) quantizes the columns one at a
time and moves each column's rounding error onto the columns not yet quantized, weighted by
the inverse of H = E[x x^T] (quant/calibrate.py records it from calibration text). Each
group's scale is chosen when its first column is reached, by the scale search on the
error-updated weights. The output is an ordinary QuantizedWeight: nothing changes at load or in
the kernels. Knows nothing about models or devices.
"""
from __future__ import annotations

import numpy as np

from ..models.weights import QuantizedWeight
from .dequant import pack_int4
from .formats import QuantFormat
from .search import _search

BLOCK = 128                # columns updated together (the lazy batch update of the paper)


def quantize_gptq(w: np.ndarray, fmt: QuantFormat, hessian: np.ndarray, *, damp: float = 0.01
                  ) -> QuantizedWeight:
    """w [N, K] with H = E[x x^T] [K, K] -> a symmetric groupwise QuantizedWeight of `fmt`."""
    if fmt.layout != "groupwise" or fmt.zero_points or w.ndim != 2:
        raise ValueError(f"gptq rounding covers symmetric groupwise matrices, not {fmt.name} {w.shape}")
    w = np.array(w, dtype=np.float64)
    n, k = w.shape
    g = fmt.group_size
    h = np.array(hessian, dtype=np.float64)
    dead = np.diag(h) <= 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    h += np.eye(k) * damp * float(np.mean(np.diag(h)))
    # upper Cholesky factor of H^-1: row i holds how column i's error spreads to later columns
    hinv = np.linalg.cholesky(np.linalg.inv(h)).T
    codes = np.empty((n, k), np.uint8)
    scales = np.empty((n, k // g), np.float16)
    mid = fmt.midpoint
    importance = np.diag(h).astype(np.float32)
    for b0 in range(0, k, BLOCK):
        b1 = min(b0 + BLOCK, k)
        err = np.zeros((n, b1 - b0))
        for i in range(b0, b1):
            if i % g == 0:                     # this group's scale, on the updated weights
                _, s16 = _search(w[:, i:i + g].astype(np.float32), fmt, importance[i:i + g])
                scales[:, i // g] = s16[:, 0]
                s = s16[:, 0].astype(np.float64)
                inv = np.divide(1.0, s, out=np.zeros_like(s), where=s != 0)
            q = np.clip(np.rint(w[:, i] * inv) + mid, 0, fmt.max_code)
            codes[:, i] = q
            e = (w[:, i] - (q - mid) * s) / hinv[i, i]
            w[:, i + 1:b1] -= np.outer(e, hinv[i, i + 1:b1])
            err[:, i - b0] = e
        w[:, b1:] -= err @ hinv[b0:b1, b1:]
    return QuantizedWeight(fmt, (n, k), {"codes": pack_int4(codes) if fmt.bits == 4 else codes,
                                         "scales": scales})
