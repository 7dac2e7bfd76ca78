"""Quantized Hugging Face checkpoints -> QuantizedWeight records, kept quantized.

Reads one logical weight `X.weight` from the tensors a quantizer left beside it (layouts from
`shared/reference/quantized-formats.md` §1.2-1.3) and repacks it, losslessly, into a format
of quant/formats.py:

- FP8 with 128 x 128 block scales (`quant_method: fp8`, Qwen's `-FP8` releases): `X.weight`
  F8_E4M3 [N, K] and `X.weight_scale_inv` [ceil(N/128), ceil(K/128)] (bf16 / fp16 / fp32; a
  multiplier despite the name) -> `fp8` (codes = the e4m3 bits, scales float32).
- GPTQ (`quant_method: gptq`): `X.qweight` int32 [K/pf, N] packed along K, `X.qzeros` int32
  [K/G, N/pf] packed along N, `X.scales` fp16 [K/G, N], `X.g_idx`. The zero-point convention
  is read from the stored zeros, not the metadata (Qwen's own GPTQ-Int4 stores v2 zeros under
  `checkpoint_format: gptq`): symmetric files store 2^(b-1) - 1 (v1, zero = stored + 1) or
  2^(b-1) (v2, zero = stored); others follow `checkpoint_format`. -> `int{b}-g{G}` (symmetric)
  or `int{b}-g{G}-zp`.
- AWQ (`quant_method: awq`, GEMM packing): `X.qweight` int32 [K, N/8] packed along N in the
  order [0, 2, 4, 6, 1, 3, 5, 7], `X.qzeros` likewise [K/G, N/8], `X.scales` [K/G, N]
  -> `int4-g{G}-zp`.
- compressed-tensors `pack-quantized`: `X.weight_packed` int32 [N, ceil(K/8)] packed along K,
  codes offset by 2^(b-1), `X.weight_scale` [N, K/G], optional `X.weight_zero_point` (packed
  along N), `X.weight_shape` -> `int{b}-g{G}` or `-zp`.

A tensor whose layout has no exact counterpart (act-order `g_idx`, groups other than 32 / 64 /
128, scales that float16 cannot hold) comes back as float32 values (exact, larger). Knows
nothing about model names beyond the `X.weight` suffix convention.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import ModelFormatError, UnsupportedModelError
from ..quant.dequant import pack_int4
from ..quant.formats import FP8_BLOCK, GROUP_SIZES, groupwise
from .weights import DenseWeight, LinearWeight, QuantizedWeight

Read = Callable[[str], np.ndarray]              # a checkpoint tensor by its name, stored dtype
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)            # AutoAWQ's packing: nibble i holds column AWQ_ORDER[i]

# tensors that belong to a quantized weight X.weight, by the suffix that replaces ".weight"
SUFFIXES: dict[str, tuple[str, ...]] = {
    "fp8": (".weight_scale_inv", ".input_scale"),
    "gptq": (".qweight", ".qzeros", ".scales", ".g_idx"),
    "awq": (".qweight", ".qzeros", ".scales"),
    "compressed-tensors": (".weight_packed", ".weight_scale", ".weight_zero_point", ".weight_shape",
                           ".weight_g_idx", ".input_scale"),
}
# the tensor whose presence marks X as quantized (X + this suffix)
MARKERS = {"fp8": ".weight_scale_inv", "gptq": ".qweight", "awq": ".qweight",
           "compressed-tensors": ".weight_packed"}


def quant_method(config: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """The checkpoint's quantization method and its config (None: not quantized)."""
    qc = config.get("quantization_config") or config.get("compression_config")
    if not isinstance(qc, dict):
        return None, {}
    method = str(qc.get("quant_method", "")).lower()
    if method in ("fp8", "gptq", "awq", "compressed-tensors"):
        if method == "fp8":
            block = qc.get("weight_block_size")
            if list(block or []) != [128, 128]:
                raise UnsupportedModelError(f"fp8 checkpoints with weight_block_size {block} are not "
                                            "supported (only [128, 128])")
        if method == "awq" and str(qc.get("version", "gemm")).lower() != "gemm":
            raise UnsupportedModelError(f"AWQ version {qc.get('version')!r} is not supported (only gemm)")
        return method, qc
    raise UnsupportedModelError(f"quantization method {qc.get('quant_method')!r} is not supported "
                                "(fp8, gptq, awq, compressed-tensors)")


def unpack(packed: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """int32 words -> unsigned codes, 32 / bits per word, lowest bits first, along `axis`."""
    per = 32 // bits
    words = np.asarray(packed).view(np.uint32)
    shifts = (np.arange(per, dtype=np.uint32) * bits)
    codes = (np.expand_dims(words, -1) >> shifts) & np.uint32((1 << bits) - 1)   # [..., per]
    codes = np.moveaxis(codes, -1, axis + 1 if axis >= 0 else axis)
    shape = list(words.shape)
    shape[axis] *= per
    return codes.reshape(shape).astype(np.uint8)


def _record(codes_nk: np.ndarray, scales: np.ndarray, zeros: np.ndarray | None, bits: int,
            group: int, name: str) -> LinearWeight:
    """codes [N, K], scales [N, K/G] (float), zeros [N, K/G] or None (= 2^(b-1)) -> a record of
    the groupwise format (float32 values when the layout does not map exactly)."""
    s16 = np.asarray(scales).astype(np.float16)
    exact = np.array_equal(s16.astype(np.float32), np.asarray(scales).astype(np.float32))
    if group not in GROUP_SIZES or not exact or bits not in (4, 8):
        z = np.float32(1 << (bits - 1)) if zeros is None else zeros.astype(np.float32)
        g = codes_nk.astype(np.float32).reshape(codes_nk.shape[0], -1, group)
        w = (g - np.broadcast_to(z, scales.shape)[..., None]) * np.asarray(scales, np.float32)[..., None]
        return DenseWeight(w.reshape(codes_nk.shape), "f32")
    fmt = groupwise(bits, group, zero_points=zeros is not None)
    arrays = {"codes": pack_int4(codes_nk) if bits == 4 else np.ascontiguousarray(codes_nk),
              "scales": np.ascontiguousarray(s16)}
    if zeros is not None:
        arrays["zeros"] = np.ascontiguousarray(zeros.astype(np.uint8))
    return QuantizedWeight(fmt, tuple(codes_nk.shape), arrays)


def _gptq(read: Read, x: str, qc: Mapping[str, Any], has: Callable[[str], bool]) -> LinearWeight:
    bits = int(qc.get("bits", 4))
    codes = unpack(read(x + ".qweight"), bits, 0).T                 # [N, K]
    n, k = codes.shape
    scales = np.asarray(read(x + ".scales")).T                       # [N, K/G]
    group = k // scales.shape[1]
    stored = unpack(read(x + ".qzeros"), bits, 1)[:, :n].T          # [N, K/G]
    if has(x + ".g_idx"):
        g_idx = np.asarray(read(x + ".g_idx")).astype(np.int64)
        if not np.array_equal(g_idx, np.arange(k) // group):        # act-order: groups not contiguous
            z = _gptq_zero(stored, bits, qc)
            zk = z[:, g_idx].astype(np.float32)
            w = (codes.astype(np.float32) - zk) * np.asarray(scales, np.float32)[:, g_idx]
            return DenseWeight(w, "f32")
    zero = _gptq_zero(stored, bits, qc)
    mid = 1 << (bits - 1)
    return _record(codes, scales, None if np.all(zero == mid) else zero, bits, group, x)


def _gptq_zero(stored: np.ndarray, bits: int, qc: Mapping[str, Any]) -> np.ndarray:
    """The true zero points from GPTQ's stored ones (v1 stores zero - 1; see the module doc)."""
    mid, mask = 1 << (bits - 1), (1 << bits) - 1
    if np.all(stored == mid - 1):
        return np.full(stored.shape, mid, np.uint8)                  # v1, symmetric
    if np.all(stored == mid):
        return stored                                                # v2, symmetric
    v2 = str(qc.get("checkpoint_format", "gptq")).lower() == "gptq_v2"
    return stored if v2 else ((stored.astype(np.int32) + 1) & mask).astype(np.uint8)


def _awq(read: Read, x: str, qc: Mapping[str, Any]) -> LinearWeight:
    bits = int(qc.get("bits", qc.get("w_bit", 4)))
    if bits != 4:
        raise UnsupportedModelError(f"{x}: AWQ with {bits} bits is not supported")
    order = np.argsort(AWQ_ORDER)              # column j of a word sits in nibble order[j]

    def columns(packed: np.ndarray) -> np.ndarray:
        u = unpack(packed, 4, 1)               # [R, C] with nibbles in stored order per word
        r, c = u.shape
        return u.reshape(r, c // 8, 8)[:, :, order].reshape(r, c)

    codes = columns(read(x + ".qweight")).T   # [N, K]
    zeros = columns(read(x + ".qzeros")).T    # [N, K/G]
    scales = np.asarray(read(x + ".scales")).T
    group = codes.shape[1] // scales.shape[1]
    return _record(codes, scales, zeros[: codes.shape[0]], 4, group, x)


def _compressed(read: Read, x: str, qc: Mapping[str, Any], has: Callable[[str], bool]) -> LinearWeight:
    bits = 4
    for group_cfg in (qc.get("config_groups") or {}).values():
        bits = int(((group_cfg or {}).get("weights") or {}).get("num_bits", bits))
    if has(x + ".weight_shape"):
        n, k = (int(v) for v in np.asarray(read(x + ".weight_shape")).reshape(-1)[:2])
    else:
        packed_shape = read(x + ".weight_packed").shape
        n, k = packed_shape[0], packed_shape[1] * 32 // bits
    codes = unpack(read(x + ".weight_packed"), bits, 1)[:, :k]        # [N, K], offset by 2^(b-1)
    scales = np.asarray(read(x + ".weight_scale"))
    scales = scales.reshape(n, -1)
    group = k // scales.shape[1]
    zeros = None
    if has(x + ".weight_zero_point"):
        zp = np.asarray(read(x + ".weight_zero_point"))
        if zp.dtype == np.int32 and zp.shape[0] < n:     # packed: already offset by 2^(b-1)
            zeros = unpack(zp, bits, 0)[:n].reshape(n, -1)
        else:                                           # signed zero points as they are
            zeros = ((zp.astype(np.int32).reshape(n, -1) + (1 << (bits - 1)))
                     & ((1 << bits) - 1)).astype(np.uint8)
        if np.all(zeros == 1 << (bits - 1)):
            zeros = None
    if has(x + ".weight_g_idx"):
        g_idx = np.asarray(read(x + ".weight_g_idx")).astype(np.int64)
        if not np.array_equal(g_idx, np.arange(k) // group):
            raise UnsupportedModelError(f"{x}: compressed-tensors activation ordering is not supported")
    return _record(codes, scales, zeros, bits, group, x)


def _fp8(read: Read, x: str) -> LinearWeight:
    codes = np.asarray(read(x + ".weight"))
    scales = np.asarray(read(x + ".weight_scale_inv")).astype(np.float32)
    n, k = codes.shape
    if scales.shape != (-(-n // 128), -(-k // 128)):
        raise ModelFormatError(f"{x}.weight_scale_inv has shape {scales.shape}, expected "
                               f"{(-(-n // 128), -(-k // 128))} for a weight of {(n, k)}")
    return QuantizedWeight(FP8_BLOCK, (n, k), {"codes": codes.view(np.uint8), "scales": scales})


def load_quantized(method: str, qc: Mapping[str, Any], read: Read, x: str,
                   has: Callable[[str], bool]) -> LinearWeight:
    """The weight `x + ".weight"` of a checkpoint quantized by `method` as a record."""
    if method == "fp8":
        return _fp8(read, x)
    if method == "gptq":
        return _gptq(read, x, qc, has)
    if method == "awq":
        return _awq(read, x, qc)
    return _compressed(read, x, qc, has)
