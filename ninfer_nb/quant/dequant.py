"""NumPy reference of the quantized formats: dequantize (what every kernel must match) and a
round-to-nearest quantize (for tests and conversion). Host arrays only.

Layouts are documented in `quant/formats.py`. Symmetric formats take scale = amax / (2^(b-1) - 1)
per group and codes rint(w / scale) + 2^(b-1); formats with zero points take
scale = (max - min) / (2^b - 1) and zero = rint(-min / scale), so both ends of a group's range
are representable; "groupwise-min" takes scale = (max - min) / (2^b - 1) and min = the group's
minimum; "fp8-block" takes scale = amax / 448 per 128 x 128 block and rounds w / scale to the
nearest e4m3fn value. Knows nothing about models or devices.
"""
from __future__ import annotations

import ml_dtypes
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
    if fmt.layout == "fp8-block":
        return _quantize_fp8(np.asarray(w, dtype=np.float32), fmt)
    if fmt.layout == "groupwise-min":
        return _quantize_min(np.asarray(w, dtype=np.float32), fmt)
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


def _quantize_min(w: np.ndarray, fmt: QuantFormat) -> QuantizedWeight:
    """groupwise-min: scale = (max - min) / max_code, min = the group's minimum (fp16 both)."""
    g = _groups(w, fmt.group_size)
    lo = g.min(axis=-1).astype(np.float16)
    scale = ((g.max(axis=-1) - lo.astype(np.float32)) / fmt.max_code).astype(np.float16)
    s = scale.astype(np.float32)
    inv = np.divide(1.0, s, out=np.zeros_like(s), where=s > 0)
    codes = np.clip(np.rint((g - lo.astype(np.float32)[..., None]) * inv[..., None]), 0, fmt.max_code)
    codes = codes.astype(np.uint8).reshape(w.shape)
    return QuantizedWeight(fmt, tuple(w.shape), {
        "codes": pack_int4(codes) if fmt.bits == 4 else np.ascontiguousarray(codes),
        "scales": np.ascontiguousarray(scale), "mins": np.ascontiguousarray(lo)})


FP8_MAX = 448.0          # the largest finite float8 e4m3fn value


def _block_expand(scales: np.ndarray, shape: tuple[int, ...], block: int) -> np.ndarray:
    """Block scales [..., ceil(N/b), ceil(K/b)] -> one per element [..., N, K]."""
    n, k = shape[-2:]
    return np.repeat(np.repeat(scales, block, axis=-2)[..., :n, :], block, axis=-1)[..., :k]


def _quantize_fp8(w: np.ndarray, fmt: QuantFormat) -> QuantizedWeight:
    """fp8-block: one float32 scale per 128 x 128 block (amax / 448), e4m3fn codes."""
    b = fmt.group_size
    n, k = w.shape[-2:]
    nb, kb = -(-n // b), -(-k // b)
    padded = np.zeros(w.shape[:-2] + (nb * b, kb * b), np.float32)
    padded[..., :n, :k] = np.abs(w)
    amax = padded.reshape(*w.shape[:-2], nb, b, kb, b).max(axis=(-3, -1))
    scales = np.where(amax > 0, amax / FP8_MAX, 1.0).astype(np.float32)
    codes = (w / _block_expand(scales, w.shape, b)).astype(ml_dtypes.float8_e4m3fn)
    return QuantizedWeight(fmt, tuple(w.shape), {"codes": codes.view(np.uint8), "scales": scales})


def codes_of(q: QuantizedWeight) -> np.ndarray:
    """The unsigned codes [..., N, K] of a groupwise weight (4-bit codes unpacked)."""
    c = np.asarray(q.arrays["codes"])
    return unpack_int4(c) if q.format.bits == 4 else c


def dequantize(q: QuantizedWeight) -> np.ndarray:
    """The float32 values [..., N, K] of a quantized weight: scale * (code - zero) per group
    (groupwise-min: scale * code + min; fp8-block: e4m3(code) * block scale)."""
    fmt = q.format
    if fmt.layout == "fp8-block":
        codes = np.asarray(q.arrays["codes"]).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
        return codes * _block_expand(np.asarray(q.arrays["scales"], np.float32), q.shape, fmt.group_size)
    if fmt.layout not in ("groupwise", "groupwise-min"):
        raise ValueError(f"no NumPy dequantization for {fmt.name}")
    g = _groups(codes_of(q).astype(np.float32), fmt.group_size)              # [..., K/g, g]
    if fmt.layout == "groupwise-min":
        scale = np.asarray(q.arrays["scales"]).astype(np.float32)
        low = np.asarray(q.arrays["mins"]).astype(np.float32)
        return (g * scale[..., None] + low[..., None]).reshape(q.shape)
    zero = (np.asarray(q.arrays["zeros"]).astype(np.float32) if fmt.zero_points
            else np.float32(fmt.midpoint))
    scale = np.asarray(q.arrays["scales"]).astype(np.float32)
    return ((g - np.broadcast_to(zero, scale.shape)[..., None]) * scale[..., None]).reshape(q.shape)


def dequantize_rows(q: QuantizedWeight, rows: np.ndarray) -> np.ndarray:
    """dequantize(q)[rows] of a matrix [N, K] without dequantizing the others (embedding
    lookups): [len(rows), K] float32."""
    if q.format.layout == "fp8-block":
        return dequantize(q)[rows]
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
