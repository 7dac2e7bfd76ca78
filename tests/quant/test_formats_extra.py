"""The checkpoint formats beside the canonical layout (fp8 with 128 x 128 block scales,
groupwise-min), the per-group scale search and the row operations on records."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ninfer_nb.models.weights import DenseWeight, QuantizedWeight
from ninfer_nb.quant.dequant import dequantize, pack_int4, quantize
from ninfer_nb.quant.formats import quant_format
from ninfer_nb.quant.rows import concat_rows, stack_experts, take_rows, values
from ninfer_nb.quant.search import quantize_mse


def test_fp8_dequantize_is_code_times_block_scale() -> None:
    rng = np.random.default_rng(0)
    n, k = 130, 260                                   # partial blocks at both edges
    codes = (rng.standard_normal((n, k)) * 50).astype(ml_dtypes.float8_e4m3fn)
    scales = rng.random((2, 3)).astype(np.float32)
    q = QuantizedWeight(quant_format("fp8"), (n, k), {"codes": codes.view(np.uint8), "scales": scales})
    expect = codes.astype(np.float32) * scales[np.arange(n)[:, None] // 128, np.arange(k)[None, :] // 128]
    np.testing.assert_array_equal(dequantize(q), expect)


def test_fp8_quantize_round_trip() -> None:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((3, 140, 300)).astype(np.float32)
    q = quantize(w, quant_format("fp8"))
    assert q.arrays["codes"].dtype == np.uint8 and q.arrays["scales"].shape == (3, 2, 3)
    rel = np.linalg.norm(dequantize(q) - w) / np.linalg.norm(w)
    assert rel < 0.04, rel                            # e4m3: 3 mantissa bits
    np.testing.assert_array_equal(dequantize(q.expert(1)), dequantize(q)[1])


def test_min_format_is_scale_times_code_plus_min() -> None:
    rng = np.random.default_rng(2)
    codes = rng.integers(0, 16, (4, 64)).astype(np.uint8)
    scales = rng.random((4, 2)).astype(np.float16)
    mins = (-rng.random((4, 2))).astype(np.float16)
    q = QuantizedWeight(quant_format("int4-g32-min"), (4, 64),
                        {"codes": pack_int4(codes), "scales": scales, "mins": mins})
    g = np.arange(64) // 32
    expect = codes * scales.astype(np.float32)[:, g] + mins.astype(np.float32)[:, g]
    np.testing.assert_array_equal(dequantize(q), expect)
    w = rng.standard_normal((8, 128)).astype(np.float32)
    assert np.linalg.norm(dequantize(quantize(w, q.format)) - w) / np.linalg.norm(w) < 0.12


@pytest.mark.parametrize("name", ["int4-g64", "int4-g32", "int8-g128"])
def test_scale_search_never_loses_to_round_to_nearest(name: str) -> None:
    """Round to nearest's scale is one of the candidates, so per group the searched error is at
    most its error; on Gaussian weights the 4-bit error drops clearly."""
    fmt = quant_format(name)
    rng = np.random.default_rng(3)
    w = rng.standard_normal((64, 512)).astype(np.float32)
    rtn, mse = quantize(w, fmt), quantize_mse(w, fmt)
    assert mse.format is fmt and mse.arrays["codes"].shape == rtn.arrays["codes"].shape

    def group_err(q: QuantizedWeight) -> np.ndarray:
        return np.square(dequantize(q) - w).reshape(64, -1, fmt.group_size).sum(-1)

    assert np.all(group_err(mse) <= group_err(rtn) * (1 + 1e-6) + 1e-12)
    if fmt.bits == 4:
        assert group_err(mse).sum() < 0.9 * group_err(rtn).sum()


def test_row_operations_keep_the_format() -> None:
    rng = np.random.default_rng(4)
    a, b = (quantize(rng.standard_normal((n, 64)).astype(np.float32), quant_format("int4-g32")) for n in (6, 10))
    both = concat_rows([a, b])
    assert isinstance(both, QuantizedWeight) and both.shape == (16, 64)
    np.testing.assert_array_equal(values(both), np.concatenate([values(a), values(b)]))
    rows = np.array([9, 0, 3])
    picked = take_rows(both, rows)
    assert isinstance(picked, QuantizedWeight)
    np.testing.assert_array_equal(values(picked), values(both)[rows])
    mixed = concat_rows([a, rng.standard_normal((2, 64)).astype(ml_dtypes.bfloat16)])
    assert isinstance(mixed, DenseWeight) and mixed.dtype == "f32" and mixed.shape == (8, 64)
    halves = concat_rows([np.ones((2, 4), np.float16), np.zeros((1, 4), np.float16)])
    assert isinstance(halves, DenseWeight) and halves.dtype == "f16"
    stack = stack_experts([a, a])
    assert isinstance(stack, QuantizedWeight) and stack.shape == (2, 6, 64)
    f8 = quantize(rng.standard_normal((256, 128)).astype(np.float32), quant_format("fp8"))
    assert isinstance(take_rows(f8, np.arange(128, 256)), QuantizedWeight)     # a whole block
    split = take_rows(f8, np.arange(64, 192))                                  # splits blocks
    assert isinstance(split, DenseWeight)
    np.testing.assert_array_equal(values(split), values(f8)[64:192])
