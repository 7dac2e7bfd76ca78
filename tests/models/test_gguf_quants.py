"""Dequantization of block formats against encoders written here from ggml's block layouts.

Each encoder draws random codes and scales, packs them into ggml's byte layout (block_q8_0,
block_q4_1, block_q4_K, block_q5_K, block_q6_K as defined in ggml-common.h) and computes the
values those codes stand for. The loader must decode the packed bytes to exactly those values.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

from ninfer_nb.models.gguf_loader import load_gguf
from ninfer_nb.quant.rows import values as record_values

ROWS, COLS = 8, 512            # two 256-element super-blocks per row
Encoded = tuple[np.ndarray, np.ndarray]   # (block bytes [n, type_size], values [n, block_size])


def _f16(rng: np.random.Generator, n: int, lo: float, hi: float) -> np.ndarray:
    return rng.uniform(lo, hi, n).astype(np.float16)


def _bytes(*parts: np.ndarray) -> np.ndarray:
    return np.concatenate([np.ascontiguousarray(p).view(np.uint8) for p in parts], axis=1)


def encode_q8_0(rng: np.random.Generator, n: int) -> Encoded:
    d = _f16(rng, n, 1e-3, 2e-2)
    q = rng.integers(-127, 128, (n, 32)).astype(np.int8)
    return _bytes(d[:, None], q), d.astype(np.float32)[:, None] * q


def encode_q4_1(rng: np.random.Generator, n: int) -> Encoded:
    d, m = _f16(rng, n, 1e-3, 2e-2), _f16(rng, n, -0.2, 0.0)
    q = rng.integers(0, 16, (n, 32)).astype(np.uint8)
    qs = q[:, :16] | (q[:, 16:] << 4)                      # element j low nibble, j+16 high
    values = d.astype(np.float32)[:, None] * q + m.astype(np.float32)[:, None]
    return _bytes(d[:, None], m[:, None], qs), values


def _pack_k_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """8 six-bit scales and mins -> ggml's 12-byte packing (get_scale_min_k4 inverts it)."""
    out = np.zeros((sc.shape[0], 12), np.uint8)
    out[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 0xF) | ((mn[:, 4:] & 0xF) << 4)
    return out


def _k_values(d: np.ndarray, dmin: np.ndarray, sc: np.ndarray, mn: np.ndarray,
              q: np.ndarray) -> np.ndarray:
    sub = np.arange(256) // 32                             # 8 sub-blocks of 32
    scale = d.astype(np.float32)[:, None] * sc[:, sub].astype(np.float32)
    offset = dmin.astype(np.float32)[:, None] * mn[:, sub].astype(np.float32)
    return scale * q - offset


def encode_q4_k(rng: np.random.Generator, n: int) -> Encoded:
    d, dmin = _f16(rng, n, 1e-4, 2e-3), _f16(rng, n, 1e-4, 2e-3)
    sc = rng.integers(0, 64, (n, 8)).astype(np.uint8)
    mn = rng.integers(0, 64, (n, 8)).astype(np.uint8)
    q = rng.integers(0, 16, (n, 256)).astype(np.uint8)
    chunks = q.reshape(n, 4, 2, 32)                        # 64-element chunk: 32 low, 32 high
    qs = (chunks[:, :, 0] | (chunks[:, :, 1] << 4)).reshape(n, 128)
    return _bytes(d[:, None], dmin[:, None], _pack_k_scales(sc, mn), qs), _k_values(d, dmin, sc, mn, q)


def encode_q5_k(rng: np.random.Generator, n: int) -> Encoded:
    d, dmin = _f16(rng, n, 1e-4, 2e-3), _f16(rng, n, 1e-4, 2e-3)
    sc = rng.integers(0, 64, (n, 8)).astype(np.uint8)
    mn = rng.integers(0, 64, (n, 8)).astype(np.uint8)
    q = rng.integers(0, 32, (n, 256)).astype(np.uint8)
    low, high = (q & 0xF).reshape(n, 4, 2, 32), (q >> 4).reshape(n, 4, 2, 32)
    qs = (low[:, :, 0] | (low[:, :, 1] << 4)).reshape(n, 128)
    qh = np.zeros((n, 32), np.uint8)
    for c in range(4):                                    # bit 2c: first half, 2c+1: second
        qh |= (high[:, c, 0] << (2 * c)) | (high[:, c, 1] << (2 * c + 1))
    return _bytes(d[:, None], dmin[:, None], _pack_k_scales(sc, mn), qh, qs), _k_values(d, dmin, sc, mn, q)


def encode_q6_k(rng: np.random.Generator, n: int) -> Encoded:
    d = _f16(rng, n, 1e-4, 2e-3)
    sc = rng.integers(-128, 128, (n, 16)).astype(np.int8)  # one signed scale per 16 values
    q = rng.integers(0, 64, (n, 256)).astype(np.uint8)
    ql = np.zeros((n, 128), np.uint8)
    qh = np.zeros((n, 64), np.uint8)
    for half in range(2):
        g = q[:, 128 * half:128 * (half + 1)].reshape(n, 4, 32)   # four groups of 32
        lo, hi = g & 0xF, g >> 4
        ql[:, 64 * half:64 * half + 32] = lo[:, 0] | (lo[:, 2] << 4)
        ql[:, 64 * half + 32:64 * half + 64] = lo[:, 1] | (lo[:, 3] << 4)
        qh[:, 32 * half:32 * half + 32] = hi[:, 0] | (hi[:, 1] << 2) | (hi[:, 2] << 4) | (hi[:, 3] << 6)
    scale = d.astype(np.float32)[:, None] * sc[:, np.arange(256) // 16].astype(np.float32)
    values = scale * (q.astype(np.float32) - 32)
    return _bytes(ql, qh, sc, d[:, None]), values


ENCODERS: dict[Q, Callable[[np.random.Generator, int], Encoded]] = {
    Q.Q8_0: encode_q8_0, Q.Q4_1: encode_q4_1,
    Q.Q4_K: encode_q4_k, Q.Q5_K: encode_q5_k, Q.Q6_K: encode_q6_k,
}


@pytest.mark.parametrize("qtype", list(ENCODERS), ids=lambda q: q.name)
def test_block_format_decodes_to_encoded_values(tmp_path: Path, write_gguf, qtype: Q) -> None:
    block, type_size = GGML_QUANT_SIZES[qtype]
    n_blocks = ROWS * COLS // block
    packed, values = ENCODERS[qtype](np.random.default_rng(int(qtype)), n_blocks)
    assert packed.shape == (n_blocks, type_size)          # our layout has ggml's block size
    meta = {
        "qwen3.embedding_length": COLS, "qwen3.block_count": 1, "qwen3.feed_forward_length": 64,
        "qwen3.attention.head_count": 4,
    }
    tensors = {
        "token_embd.weight": (packed.reshape(ROWS, -1), qtype),
        "output_norm.weight": (np.ones(COLS, np.float32), None),
        # one layer (a config has at least one): the attention shapes the loader checks
        **{f"blk.0.attn_{p}.weight": (np.zeros((COLS, COLS), np.float32), None) for p in "qkv"},
    }
    ckpt = load_gguf(write_gguf(tmp_path / "q.gguf", "qwen3", meta, tensors))
    got = record_values(ckpt.weights["model.embed_tokens.weight"])
    assert got.shape == (ROWS, COLS) and got.dtype == np.float32
    np.testing.assert_allclose(got, values.reshape(ROWS, COLS), rtol=2e-6, atol=1e-9)
    assert ckpt.config.vocab_size == ROWS
