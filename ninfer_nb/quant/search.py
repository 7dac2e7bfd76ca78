"""Error-minimising scales for the symmetric groupwise formats (`ninfer convert --method mse`).

Round to nearest (dequant.quantize) takes scale = amax / (2^(b-1) - 1) and so never uses the
lowest code (0: -2^(b-1) steps) and lets one outlier set every group's step. Here each group
tries scales s = -c * x / 2^(b-1), x the group's value of largest magnitude (the sign puts x on
the side with the extra code, as GGUF's Q4_0 does; c = 1 is Q4_0's choice,
c = 2^(b-1) / (2^(b-1) - 1) round to nearest's step, smaller c clips x for a finer step),
rounds codes with the float16 scale the format stores, clamps them to 0 .. 2^b - 1 and keeps
the scale with the least squared error. The result is an
ordinary QuantizedWeight of the same format: the search costs time at conversion only.
Knows nothing about models or devices.
"""
from __future__ import annotations

import numpy as np

from ..models.weights import QuantizedWeight
from .dequant import pack_int4, quantize
from .formats import QuantFormat

# candidate multipliers c of amax / 2^(b-1); includes round to nearest's 8/7 (4 bits), 128/127
CANDIDATES_4 = tuple(float(c) for c in np.linspace(0.70, 1.0, 13)) + (8 / 7,)
CANDIDATES_8 = tuple(float(c) for c in np.linspace(0.90, 1.0, 6)) + (128 / 127,)


def quantize_mse(w: np.ndarray, fmt: QuantFormat, rows_per_chunk: int = 4096,
                 importance: np.ndarray | None = None) -> QuantizedWeight:
    """w [..., N, K] -> a symmetric groupwise QuantizedWeight whose per-group scale minimises
    the squared error over the candidate grid, each column's error weighted by `importance`
    [K] (quant/calibrate.py: E[x_k^2]; None: all 1). Other formats: round to nearest."""
    if fmt.layout != "groupwise" or fmt.zero_points:
        return quantize(w, fmt)
    w = np.asarray(w, dtype=np.float32)
    shape = w.shape
    flat = w.reshape(-1, shape[-1])
    codes = np.empty(flat.shape, np.uint8)
    scales = np.empty((flat.shape[0], shape[-1] // fmt.group_size), np.float16)
    for lo in range(0, flat.shape[0], rows_per_chunk):
        c, s = _search(flat[lo:lo + rows_per_chunk], fmt, importance)
        codes[lo:lo + len(c)], scales[lo:lo + len(c)] = c, s
    full = codes.reshape(shape)
    arrays = {"codes": pack_int4(full) if fmt.bits == 4 else full,
              "scales": scales.reshape(*shape[:-1], -1)}
    return QuantizedWeight(fmt, tuple(shape), arrays)


def _search(rows: np.ndarray, fmt: QuantFormat, importance: np.ndarray | None
            ) -> tuple[np.ndarray, np.ndarray]:
    """rows [R, K] -> (codes uint8 [R, K], scales float16 [R, K / g])."""
    g = rows.reshape(rows.shape[0], -1, fmt.group_size)                     # [R, G, g]
    mid, top = fmt.midpoint, fmt.max_code
    imp = (np.ones((1, 1, 1), np.float32) if importance is None
           else np.asarray(importance, np.float32).reshape(1, -1, fmt.group_size) + np.float32(1e-8))
    # the signed extreme: a negative multiple of it is the step, so it lands near code 0
    extreme = np.take_along_axis(g, np.abs(g).argmax(axis=-1)[..., None], -1)[..., 0]
    best_err = np.full(extreme.shape, np.inf, np.float32)
    best_scale = np.zeros(extreme.shape, np.float16)
    for c in (CANDIDATES_4 if fmt.bits == 4 else CANDIDATES_8):
        scale = (-c * extreme / mid).astype(np.float16)
        s = scale.astype(np.float32)
        inv = np.divide(1.0, s, out=np.zeros_like(s), where=s != 0)
        q = np.clip(np.rint(g * inv[..., None]) + mid, 0, top) - mid
        err = (imp * np.square(q * s[..., None] - g)).sum(axis=-1)
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_scale = np.where(better, scale, best_scale)
        if importance is not None:       # the weighted least-squares step for these codes
            den = (imp * q * q).sum(axis=-1)
            ls = np.where(den > 0, (imp * q * g).sum(axis=-1) / np.maximum(den, 1e-30), s)
            ls16 = ls.astype(np.float16)
            s2 = ls16.astype(np.float32)
            inv2 = np.divide(1.0, s2, out=np.zeros_like(s2), where=s2 != 0)
            q2 = np.clip(np.rint(g * inv2[..., None]) + mid, 0, top) - mid
            err2 = (imp * np.square(q2 * s2[..., None] - g)).sum(axis=-1)
            better = err2 < best_err
            best_err = np.where(better, err2, best_err)
            best_scale = np.where(better, ls16, best_scale)
    s = best_scale.astype(np.float32)
    inv = np.divide(1.0, s, out=np.zeros_like(s), where=s != 0)
    q = np.clip(np.rint(g * inv[..., None]) + mid, 0, top).astype(np.uint8)
    return q.reshape(rows.shape), best_scale
