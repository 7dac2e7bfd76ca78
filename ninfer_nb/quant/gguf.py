"""GGUF quantized blocks -> the project's formats, losslessly (NumPy, host arrays).

Block layouts (ggml-common.h; `shared/reference/quantized-formats.md` §1.5), 32 weights a
block, fp16 `d` / `m`, blocks of a row back to back:

- Q8_0 (34 B): d, qs[32] int8; w = d * q          -> int8-g32  (code = q + 128)
- Q4_0 (18 B): d, qs[16]; low nibble of byte j -> weight j, high -> j + 16; w = d * (q - 8)
                                                  -> int4-g32  (zero 8)
- Q4_1 (20 B): d, m, qs[16] (same nibble order); w = d * q + m
                                                  -> int4-g32-min
The dequantization of the result (quant/dequant.py) equals the `gguf` package's `dequantize`
bit for bit (same float32 products and sums). Other GGUF types have no exact counterpart here.
Knows nothing about files or model names.
"""
from __future__ import annotations

import numpy as np

from ..models.weights import QuantizedWeight
from .dequant import pack_int4
from .formats import INT4_G32_MIN, quant_format

BLOCK = 32
BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}
REPACKED = frozenset(BLOCK_BYTES)


def _blocks(raw: np.ndarray, kind: str) -> tuple[np.ndarray, tuple[int, ...]]:
    """uint8 [..., N, nb * bytes] -> blocks [..., N, nb, bytes] and the logical shape."""
    size = BLOCK_BYTES[kind]
    raw = np.asarray(raw, dtype=np.uint8)
    nb = raw.shape[-1] // size
    return raw.reshape(*raw.shape[:-1], nb, size), (*raw.shape[:-1], nb * BLOCK)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """qs [..., 16] -> codes [..., 32] in ggml order (low nibbles first, then high)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _fp16(b: np.ndarray) -> np.ndarray:
    """[..., 2] bytes -> float16 [...] (little-endian)."""
    return np.ascontiguousarray(b).view("<f2")[..., 0]


def repack(raw: np.ndarray, kind: str) -> QuantizedWeight:
    """A GGUF tensor's raw block bytes ([..., N, bytes per row], numpy order) of type `kind`
    ("Q8_0", "Q4_0", "Q4_1") as a QuantizedWeight of shape [..., N, K]."""
    blocks, shape = _blocks(raw, kind)
    scales = np.ascontiguousarray(_fp16(blocks[..., 0:2]))                   # [..., N, nb]
    if kind == "Q8_0":
        q = blocks[..., 2:].view(np.int8).astype(np.int16) + 128
        codes = np.ascontiguousarray(q.astype(np.uint8).reshape(shape))
        return QuantizedWeight(quant_format("int8-g32"), shape, {"codes": codes, "scales": scales})
    if kind == "Q4_0":
        codes = pack_int4(_nibbles(blocks[..., 2:]).reshape(shape))
        return QuantizedWeight(quant_format("int4-g32"), shape, {"codes": codes, "scales": scales})
    if kind == "Q4_1":
        mins = np.ascontiguousarray(_fp16(blocks[..., 2:4]))
        codes = pack_int4(_nibbles(blocks[..., 4:]).reshape(shape))
        return QuantizedWeight(INT4_G32_MIN, shape, {"codes": codes, "scales": scales, "mins": mins})
    raise ValueError(f"GGUF type {kind} has no exact repack")
