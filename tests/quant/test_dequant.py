"""The groupwise int4 / int8 formats: their descriptions, the NumPy quantize / dequantize
reference (layout, error bounds) and the CPU ops running quantized weight records."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer_nb.models.weights import DenseWeight, QuantizedWeight
from ninfer_nb.ops import cpu
from ninfer_nb.quant.dequant import dequantize, dequantize_rows, max_error, pack_int4, quantize, unpack_int4
from ninfer_nb.quant.formats import FORMATS, quant_format


def test_formats_describe_their_bytes_and_arrays() -> None:
    assert quant_format("int4-g64").bytes_per_weight == 0.5 + 2 / 64
    assert quant_format("int8-g128").bytes_per_weight == 1 + 2 / 128
    assert quant_format("int4-g32-zp").bytes_per_weight == 0.5 + 3 / 32
    assert quant_format("int8-g64").arrays == ("codes", "scales")
    assert quant_format("int4-g128-zp").arrays == ("codes", "scales", "zeros")
    assert len(FORMATS) == 14 and {"fp8", "int4-g32-min"} <= set(FORMATS)
    assert quant_format("int4-g32-min").arrays == ("codes", "scales", "mins")
    assert quant_format("fp8").bytes_per_weight == 1 + 4 / 128 ** 2
    with pytest.raises(ValueError, match="int4-g64"):
        quant_format("int3-g64")


def test_int4_packing_puts_even_columns_in_the_low_nibble() -> None:
    codes = np.array([[1, 2, 15, 0]], np.uint8)
    packed = pack_int4(codes)
    assert packed.tolist() == [[0x21, 0x0F]]
    rng = np.random.default_rng(0)
    many = rng.integers(0, 16, (3, 5, 64)).astype(np.uint8)
    assert np.array_equal(unpack_int4(pack_int4(many)), many)


def test_dequantize_follows_the_documented_layout() -> None:
    """Hand-built int4-g32 codes: w = scale * (code - 8) per 32-column group; with zero
    points w = scale * (code - zero)."""
    codes = np.tile(np.arange(16, dtype=np.uint8), 4).reshape(1, 64)          # one row, 2 groups
    scales = np.array([[0.5, 2.0]], np.float16)
    q = QuantizedWeight(quant_format("int4-g32"), (1, 64), {"codes": pack_int4(codes), "scales": scales})
    want = np.concatenate([0.5 * (codes[0, :32] - 8.0), 2.0 * (codes[0, 32:] - 8.0)])
    assert np.array_equal(dequantize(q)[0], want.astype(np.float32))
    zeros = np.array([[3, 12]], np.uint8)
    qz = QuantizedWeight(quant_format("int4-g32-zp"), (1, 64),
                         {"codes": pack_int4(codes), "scales": scales, "zeros": zeros})
    want = np.concatenate([0.5 * (codes[0, :32] - 3.0), 2.0 * (codes[0, 32:] - 12.0)])
    assert np.array_equal(dequantize(qz)[0], want.astype(np.float32))
    c8 = np.arange(256, dtype=np.uint8)[None, :128]
    q8 = QuantizedWeight(quant_format("int8-g128"), (1, 128), {"codes": c8, "scales": np.array([[0.25]], np.float16)})
    assert np.array_equal(dequantize(q8)[0], (0.25 * (c8[0] - 128.0)).astype(np.float32))


@pytest.mark.parametrize("name", sorted(n for n, f in FORMATS.items() if f.layout == "groupwise"))
@pytest.mark.parametrize("shape", [(48, 256), (3, 16, 384)])
def test_quantize_dequantize_error_is_within_half_a_step(name: str, shape: tuple[int, ...]) -> None:
    fmt = quant_format(name)
    rng = np.random.default_rng(1)
    w = rng.standard_normal(shape).astype(np.float32) + (0.7 if fmt.zero_points else 0.0)
    w[..., :fmt.group_size] = 0.0                         # an all-zero group stays exactly zero
    q = quantize(w, fmt)
    assert q.shape == shape and q.format is fmt
    assert q.arrays["codes"].shape == shape[:-1] + (shape[-1] * fmt.bits // 8,)
    assert q.arrays["scales"].dtype == np.float16
    assert q.nbytes == pytest.approx(w.size * fmt.bytes_per_weight)
    back = dequantize(q)
    err = np.abs(back - w).reshape(*shape[:-1], -1, fmt.group_size).max(axis=-1)
    assert np.all(err <= max_error(fmt, w))
    assert np.all(back[..., :fmt.group_size] == 0.0)
    rel = np.linalg.norm(back - w) / np.linalg.norm(w)
    assert rel < (0.01 if fmt.bits == 8 else 0.2), rel


def test_values_on_the_grid_survive_exactly() -> None:
    fmt = quant_format("int8-g64")
    rng = np.random.default_rng(2)
    codes = rng.integers(-127, 128, (8, 128)).astype(np.float32)
    codes[:, ::64] = 127                                   # every group reaches its amax
    w = codes * np.float32(2.0 ** -6)
    assert np.array_equal(dequantize(quantize(w, fmt)), w)


def test_dequantize_rows_equals_the_whole_matrix_rows() -> None:
    rng = np.random.default_rng(3)
    q = quantize(rng.standard_normal((40, 128)).astype(np.float32), quant_format("int4-g64-zp"))
    rows = np.array([3, 0, 39, 3])
    assert np.array_equal(dequantize_rows(q, rows), dequantize(q)[rows])


@pytest.mark.parametrize("name", ["int8-g64", "int4-g32-zp"])
def test_cpu_ops_run_quantized_records_as_their_dequantization(name: str) -> None:
    """Every CPU op that takes a linear weight gives, on a QuantizedWeight, what it gives on
    the DenseWeight of its dequantized values."""
    fmt = quant_format(name)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    q = quantize(rng.standard_normal((96, 64)).astype(np.float32), fmt)
    d = DenseWeight(dequantize(q), "f32")
    assert np.allclose(cpu.linear(x, q), cpu.linear(x, d))
    for a, b in zip(cpu.linear_split(x, q, None, (32, 64)), cpu.linear_split(x, d, None, (32, 64))):
        assert np.allclose(a, b)
    assert np.allclose(cpu.linear_swiglu(x, q), cpu.linear_swiglu(x, d))
    r1, r2 = np.ones((5, 96), np.float32), np.ones((5, 96), np.float32)
    assert np.allclose(cpu.linear_add(x, q, r1), cpu.linear_add(x, d, r2))
    ids = np.array([0, 95, 7])
    assert np.array_equal(cpu.embedding(q, ids), cpu.embedding(d, ids))
    gate_up = quantize(rng.standard_normal((4, 128, 64)).astype(np.float32), fmt)
    down = quantize(rng.standard_normal((4, 64, 64)).astype(np.float32), fmt)
    eids = np.array([[0, 3], [1, 3], [2, 0], [3, 1], [0, 2]], np.int32)
    ew = rng.random((5, 2)).astype(np.float32)
    got = cpu.moe_experts(x, eids, ew, gate_up, down)
    want = cpu.moe_experts(x, eids, ew, DenseWeight(dequantize(gate_up), "f32"), DenseWeight(dequantize(down), "f32"))
    assert np.allclose(got, want, atol=1e-5)
