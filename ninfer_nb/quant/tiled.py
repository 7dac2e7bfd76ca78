"""The device layout of quantized weights: the canonical arrays (quant/formats.py) repacked,
losslessly, into the order the tensor-core decode GEMVs (kernels/linear/gemv_tiled.py) read with
one 16-byte load per lane. NumPy only: `tile` (at upload), `untile` (its exact inverse, the
tests' and the CPU's way back to the reference) and the index tables both use.

A matrix [N, K] is cut into row tiles of 16 rows (N padded with zero codes to a multiple of
16) and K-tiles of 512 code bytes: 64 columns of 4-bit codes or 32 columns of 8-bit codes
(int8, fp8). K-tile (r, kt) is 512 contiguous bytes at ((r * KT) + kt) * 512; lane l = 4g + t
of a warp reads bytes [16 l, 16 l + 16): rows g and g + 8 of the tile, the columns that the
mma.m16n8k16 A fragments of that lane need, for 4 (4-bit) or 2 (8-bit) k16 sub-blocks.
K inside a K-tile is permuted (the dot product does not care, the activations are read in
the same order): sub-block j, fragment element e (k = 2t, 2t + 1, 2t + 8, 2t + 9 -> e = 0..3)
is column 32 (j >> 1) + 8t + 4 (j & 1) + e (4-bit) or 8t + 4j + e (8-bit), so lane t reads
its activations as 8 (or 2 x 8) consecutive columns.

Byte order inside a lane's 16 bytes: register r (0..3) of sub-block j is rows g + 8 (r & 1),
elements 2 (r >> 1) and 2 (r >> 1) + 1 (the low / high half of a bf16x2).
- 4-bit: word j (little-endian u32 j of the 16 bytes), nibble p = register p & 3, half p >> 2,
  so ((w >> 4r) & 0x000F000F) yields register r's two codes in its two 16-bit halves.
- 8-bit: word q holds registers 2 (q & 1) and 2 (q & 1) + 1 of sub-block q >> 1 in its low
  and high 16 bits, each as (low element byte, high element byte).

Scales, per row tile and group, for rows (g, g + 8) in one 32-bit word:
- groupwise: `scales` uint32 [NT, K / group, 8] = float16 bits of row g | row g + 8 << 16;
  `zeros` (formats with zero points) uint32 [NT, K / group, 8]: int4 the bf16x2 pair
  -(128 + z) (what the kernel adds to 128 + code), int8 z_g | z_(g+8) << 16;
- fp8-block: `scales` float32 [NT, K / 128], the 128 x 128 block's scale (repeated for each
  of the block's 8 row tiles).
Expert stacks [E, N, K] carry a leading E axis on every array. Knows nothing about devices.
"""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np

from ..models.weights import QuantizedWeight
from .dequant import pack_int4, unpack_int4
from .formats import QuantFormat

TILE_ROWS = 16
TILE_BYTES = 512
TILED = {"groupwise": "groupwise-tiled", "fp8-block": "fp8-block-tiled"}
CANONICAL = {v: k for k, v in TILED.items()}


def tile_cols(bits: int) -> int:
    """Columns per K-tile: 64 of 4-bit codes, 32 of 8-bit ones (512 bytes of 16 rows)."""
    return 64 if bits == 4 else 32


def is_tiled(fmt: QuantFormat) -> bool:
    return fmt.layout in CANONICAL


def tileable(fmt: QuantFormat, shape: tuple[int, ...]) -> bool:
    """True when `tile` takes a weight of this format and shape: groupwise int4 / int8 (zero
    points or not) and fp8-block, K a multiple of the K-tile (and of 128 for fp8)."""
    k = shape[-1]
    if fmt.layout == "groupwise":
        return k % tile_cols(fmt.bits) == 0 and k % fmt.group_size == 0
    if fmt.layout == "fp8-block":
        return k % 128 == 0 and fmt.group_size == 128
    return False


@lru_cache(maxsize=None)
def lane_map(bits: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, col) [512 * 8 / bits] of each code position of a K-tile, in storage order (4-bit:
    nibble i = byte i // 2, low nibble first; 8-bit: byte i)."""
    rows, cols = [], []
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        if bits == 4:
            for j in range(4):
                for p in range(8):
                    r, hi = p & 3, p >> 2
                    e = 2 * (r >> 1) + hi
                    rows.append(g + 8 * (r & 1))
                    cols.append(32 * (j >> 1) + 8 * t + 4 * (j & 1) + e)
        else:
            for b in range(16):
                q, bw = b >> 2, b & 3
                j = q >> 1
                r = 2 * (q & 1) + (bw >> 1)
                e = 2 * (r >> 1) + (bw & 1)
                rows.append(g + 8 * (r & 1))
                cols.append(8 * t + 4 * j + e)
    return np.asarray(rows, np.int64), np.asarray(cols, np.int64)


def _pad_rows(a: np.ndarray, n_pad: int, fill: int = 0) -> np.ndarray:
    n = a.shape[-2]
    if n == n_pad:
        return a
    out = np.full(a.shape[:-2] + (n_pad,) + a.shape[-1:], fill, a.dtype)
    out[..., :n, :] = a
    return out


def _tile_codes(codes: np.ndarray, bits: int, fill: int) -> np.ndarray:
    """Unpacked codes [..., N, K] -> tiled bytes [..., NT, KT, 512]."""
    n, k = codes.shape[-2:]
    nt, kc = -(-n // TILE_ROWS), tile_cols(bits)
    c = _pad_rows(codes, nt * TILE_ROWS, fill)
    c = c.reshape(codes.shape[:-2] + (nt, TILE_ROWS, k // kc, kc))
    c = np.moveaxis(c, -2, -3)                                          # [..., NT, KT, 16, kc]
    rows, cols = lane_map(bits)
    flat = c[..., rows, cols]                                           # [..., NT, KT, 512 * 8 / bits]
    if bits == 4:
        flat = pack_int4(flat)
    return np.ascontiguousarray(flat.astype(np.uint8))


def _untile_codes(tiled: np.ndarray, bits: int, n: int, k: int) -> np.ndarray:
    """tiled bytes [..., NT, KT, 512] -> unpacked codes [..., N, K]."""
    lead = tiled.shape[:-3]
    nt, kt = tiled.shape[-3:-1]
    kc = tile_cols(bits)
    flat = unpack_int4(tiled) if bits == 4 else tiled
    rows, cols = lane_map(bits)
    c = np.empty(lead + (nt, kt, TILE_ROWS, kc), np.uint8)
    c[..., rows, cols] = flat
    c = np.moveaxis(c, -3, -2).reshape(lead + (nt * TILE_ROWS, kt * kc))
    return np.ascontiguousarray(c[..., :n, :k])


def _pair_rows(a: np.ndarray, nt: int) -> np.ndarray:
    """[..., N_pad, G] per-row values -> [..., NT, G, 8, 2]: (row g, row g + 8) of each tile."""
    a = a.reshape(a.shape[:-2] + (nt, 2, 8, a.shape[-1]))              # [..., NT, h, g, G]
    lead = tuple(range(a.ndim - 4))
    return a.transpose(lead + tuple(len(lead) + i for i in (0, 3, 2, 1)))   # [..., NT, G, g, h]


def _unpair_rows(a: np.ndarray) -> np.ndarray:
    """_pair_rows' inverse: [..., NT, G, 8, 2] -> [..., NT * 16, G]."""
    lead = tuple(range(a.ndim - 4))
    a = a.transpose(lead + tuple(len(lead) + i for i in (0, 3, 2, 1)))     # [..., NT, h, g, G]
    return a.reshape(a.shape[:-4] + (a.shape[-4] * 16, a.shape[-1]))


def _words(lo_hi: np.ndarray) -> np.ndarray:
    """[..., 2] uint16 -> [...] uint32 (element 0 in the low half)."""
    return np.ascontiguousarray(lo_hi.astype(np.uint32)[..., 0] | (lo_hi.astype(np.uint32)[..., 1] << 16))


def _halves(words: np.ndarray) -> np.ndarray:
    return np.stack([words & 0xFFFF, words >> 16], axis=-1).astype(np.uint16)


def _bf16_neg(v: np.ndarray) -> np.ndarray:
    """-(v) as bf16 bits for small integers v (exact)."""
    return (np.asarray(-v, np.float32).view(np.uint32) >> 16).astype(np.uint16)


def tile(q: QuantizedWeight) -> QuantizedWeight:
    """The device layout of a canonical groupwise or fp8-block weight (see the module doc)."""
    fmt = q.format
    if not tileable(fmt, q.shape):
        raise ValueError(f"no tiled layout for {fmt.name} weights of shape {q.shape}")
    n, k = q.shape[-2:]
    nt = -(-n // TILE_ROWS)
    codes = np.asarray(q.arrays["codes"])
    if fmt.layout == "fp8-block":
        s = np.asarray(q.arrays["scales"], np.float32)                   # [..., ceil(N/128), K/128]
        per_tile = np.repeat(s, 128 // TILE_ROWS, axis=-2)[..., :nt, :]
        arrays = {"codes": _tile_codes(codes, 8, 0), "scales": np.ascontiguousarray(per_tile)}
        return QuantizedWeight(replace(fmt, layout=TILED[fmt.layout]), tuple(q.shape), arrays)
    unpacked = unpack_int4(codes) if fmt.bits == 4 else codes
    n_pad = nt * TILE_ROWS
    scales = _pad_rows(np.asarray(q.arrays["scales"]).view(np.uint16), n_pad)
    arrays = {"codes": _tile_codes(unpacked, fmt.bits, fmt.midpoint),
              "scales": _words(_pair_rows(scales, nt))}
    if fmt.zero_points:
        z = _pad_rows(np.asarray(q.arrays["zeros"]).astype(np.uint16), n_pad, fmt.midpoint)
        zp = _pair_rows(z, nt)
        arrays["zeros"] = _words(_bf16_neg(128 + zp.astype(np.float32)) if fmt.bits == 4 else zp)
    return QuantizedWeight(replace(fmt, layout=TILED[fmt.layout]), tuple(q.shape), arrays)


def untile(q: QuantizedWeight) -> QuantizedWeight:
    """The canonical weight a tiled one came from (tile's exact inverse)."""
    fmt = replace(q.format, layout=CANONICAL[q.format.layout])
    n, k = q.shape[-2:]
    codes = _untile_codes(np.asarray(q.arrays["codes"]), fmt.bits, n, k)
    if fmt.layout == "fp8-block":
        s = np.asarray(q.arrays["scales"], np.float32)[..., :: 128 // TILE_ROWS, :]
        return QuantizedWeight(fmt, tuple(q.shape), {"codes": codes, "scales": np.ascontiguousarray(s)})
    arrays = {"codes": pack_int4(codes) if fmt.bits == 4 else codes,
              "scales": np.ascontiguousarray(_unpair_rows(_halves(np.asarray(q.arrays["scales"])))[..., :n, :]
                                             .view(np.float16))}
    if fmt.zero_points:
        z = _unpair_rows(_halves(np.asarray(q.arrays["zeros"])))[..., :n, :]
        if fmt.bits == 4:
            z = -(z.astype(np.uint32) << 16).view(np.float32) - 128
        arrays["zeros"] = np.ascontiguousarray(z.astype(np.uint8))
    return QuantizedWeight(fmt, tuple(q.shape), arrays)


def device_layout(q: QuantizedWeight) -> QuantizedWeight:
    """What engine/upload_policy.py uploads for a quantized record: the tiled layout where the
    kernels read it (tileable), else the record as stored."""
    return tile(q) if tileable(q.format, q.shape) else q
