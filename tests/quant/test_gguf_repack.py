"""GGUF Q8_0 / Q4_0 / Q4_1 blocks repacked into the project's formats dequantize to exactly what
the `gguf` package's own `dequantize` gives (bit for bit), for blocks made by its quantizer and
for raw random bytes (every code and scale pattern, negative zero scales included)."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from ninfer_nb.quant.dequant import dequantize, dequantize_rows
from ninfer_nb.quant.gguf import repack

KINDS = ["Q8_0", "Q4_0", "Q4_1"]
FORMATS = {"Q8_0": "int8-g32", "Q4_0": "int4-g32", "Q4_1": "int4-g32-min"}


def _random_blocks(rng: np.random.Generator, qtype: GGMLQuantizationType, rows: int, cols: int) -> np.ndarray:
    """Random block bytes [rows, bytes per row] with finite fp16 scales (and mins)."""
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    halves = 2 if qtype.name == "Q4_1" else 1
    for h in range(halves):
        d = (rng.standard_normal((rows, cols // block)) * 0.01).astype(np.float16)
        raw[..., 2 * h:2 * h + 2] = d[..., None].view(np.uint8).reshape(rows, cols // block, 2)
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("kind", KINDS)
def test_repack_equals_gguf_dequantize_bit_for_bit(kind: str) -> None:
    qtype = GGMLQuantizationType[kind]
    rng = np.random.default_rng(7)
    rows, cols = 24, 160
    for raw in (gguf_quantize(rng.standard_normal((rows, cols)).astype(np.float32), qtype),
                _random_blocks(rng, qtype, rows, cols)):
        q = repack(raw, kind)
        assert q.format.name == FORMATS[kind] and q.shape == (rows, cols)
        want = gguf_dequantize(raw, qtype).reshape(rows, cols)
        got = dequantize(q)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got.view(np.uint32), want.astype(np.float32).view(np.uint32))
        picked = np.array([3, 0, 17])
        np.testing.assert_array_equal(dequantize_rows(q, picked), want[picked])


def test_repack_keeps_expert_stacks() -> None:
    rng = np.random.default_rng(1)
    stack = np.stack([gguf_quantize(rng.standard_normal((8, 64)).astype(np.float32),
                                    GGMLQuantizationType.Q4_0) for _ in range(3)])
    q = repack(stack, "Q4_0")
    assert q.shape == (3, 8, 64)
    np.testing.assert_array_equal(dequantize(q.expert(2)),
                                  gguf_dequantize(stack[2], GGMLQuantizationType.Q4_0).reshape(8, 64))
