"""NumPy reference of the quantized formats: dequantize (what every kernel must match) and a
round-to-nearest quantize (for tests and conversion). Host arrays only.

Layouts are documented in `quant/formats.py`. Symmetric formats take scale = amax / (2^(b-1) - 1)
per group and codes rint(w / scale) + 2^(b-1); formats with zero points take
scale = (max - min) / (2^b - 1) and zero = rint(-min / scale), so both ends of a group's range
are representable. Knows nothing about models or devices.
"""
from __future__ import annotations

import numpy as np

from ..models.weights import QuantizedWeight
from .formats import QuantFormat


def pack_int4(codes: np.ndarray) -> np.ndarray:
    """uint8 codes 0..15 [..., K] (K even) -> bytes [..., K / 2], column 2j in the low nibble."""
    c = codes.astype(np.uint8)
    return np.ascontiguousarray(c[..., 0::2] | (c[..., 1::2] << 4))


def unpack_int4(packed: np.ndarray) -> np.ndarray:
    """bytes [..., K / 2] -> uint8 codes [..., K] (pack_int4's inverse)."""
    out = np.empty(packed.shape[:-1] + (2 * packed.shape[-1],), np.uint8)
    out[..., 0::2] = packed & 0x0F
    out[..., 1::2] = packed >> 4
    return out


def _groups(w: np.ndarray, group: int) -> np.ndarray:
    """[..., K] -> [..., K / group, group]."""
    if w.shape[-1] % group:
        raise ValueError(f"{w.shape[-1]} columns do not split into groups of {group}")
    return w.reshape(*w.shape[:-1], w.shape[-1] // group, group)


def quantize(w: np.ndarray, fmt: QuantFormat) -> QuantizedWeight:
    """w [N, K] or [E, N, K] (float) -> a QuantizedWeight of `fmt`, round to nearest."""
    if fmt.layout != "groupwise":
        raise ValueError(f"no quantizer for {fmt.name}")
    g = _groups(np.asarray(w, dtype=np.float32), fmt.group_size)          # [..., K/g, g]
    if fmt.zero_points:
        lo = np.minimum(g.min(axis=-1), 0.0)
        hi = np.maximum(g.max(axis=-1), 0.0)
        scale = ((hi - lo) / fmt.max_code).astype(np.float16)
        s = scale.astype(np.float32)
        inv = np.divide(1.0, s, out=np.zeros_like(s), where=s > 0)
        zero = np.clip(np.rint(-lo * inv), 0, fmt.max_code)
    else:
        scale = (np.abs(g).max(axis=-1) / (fmt.midpoint - 1)).astype(np.float16)
        s = scale.astype(np.float32)
        inv = np.divide(1.0, s, out=np.zeros_like(s), where=s > 0)
        zero = np.full(s.shape, float(fmt.midpoint), np.float32)
    codes = np.clip(np.rint(g * inv[..., None]) + zero[..., None], 0, fmt.max_code).astype(np.uint8)
    codes = codes.reshape(w.shape)
    arrays = {"codes": pack_int4(codes) if fmt.bits == 4 else np.ascontiguousarray(codes),
              "scales": np.ascontiguousarray(scale)}
    if fmt.zero_points:
        arrays["zeros"] = zero.astype(np.uint8)
    return QuantizedWeight(fmt, tuple(w.shape), arrays)


def codes_of(q: QuantizedWeight) -> np.ndarray:
    """The unsigned codes [..., N, K] of a groupwise weight (4-bit codes unpacked)."""
    c = np.asarray(q.arrays["codes"])
    return unpack_int4(c) if q.format.bits == 4 else c


def dequantize(q: QuantizedWeight) -> np.ndarray:
    """The float32 values [..., N, K] of a quantized weight: scale * (code - zero) per group."""
    fmt = q.format
    if fmt.layout != "groupwise":
        raise ValueError(f"no NumPy dequantization for {fmt.name}")
    g = _groups(codes_of(q).astype(np.float32), fmt.group_size)              # [..., K/g, g]
    zero = (np.asarray(q.arrays["zeros"]).astype(np.float32) if fmt.zero_points
            else np.float32(fmt.midpoint))
    scale = np.asarray(q.arrays["scales"]).astype(np.float32)
    return ((g - np.broadcast_to(zero, scale.shape)[..., None]) * scale[..., None]).reshape(q.shape)


def dequantize_rows(q: QuantizedWeight, rows: np.ndarray) -> np.ndarray:
    """dequantize(q)[rows] of a matrix [N, K] without dequantizing the others (embedding
    lookups): [len(rows), K] float32."""
    picked = {k: np.asarray(a)[rows] for k, a in q.arrays.items()}
    return dequantize(QuantizedWeight(q.format, (len(rows),) + tuple(q.shape[1:]), picked))


def max_error(fmt: QuantFormat, w: np.ndarray) -> np.ndarray:
    """Per-group bound on |dequantize(quantize(w)) - w|: half a step, plus the float16
    rounding of the scale over the largest code distance. [..., K / g]."""
    g = _groups(np.asarray(w, dtype=np.float32), fmt.group_size)
    if fmt.zero_points:
        step = (np.maximum(g.max(axis=-1), 0.0) - np.minimum(g.min(axis=-1), 0.0)) / fmt.max_code
        reach = fmt.max_code
    else:
        step = np.abs(g).max(axis=-1) / (fmt.midpoint - 1)
        reach = fmt.midpoint
    return step * (0.5 + reach * 2.0 ** -11) + 1e-30
