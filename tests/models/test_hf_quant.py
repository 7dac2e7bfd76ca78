"""Quantized Hugging Face checkpoints load as records of the project's formats, exactly: tiny
synthetic shards written (by safetensors' own writer) in each format's documented layout, their
dequantized weights checked against the format's formula computed here from the unpacked
codes (shared/reference/quantized-formats.md §1.2-1.3)."""
from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from ninfer_nb.errors import UnsupportedModelError
from ninfer_nb.models.loader import CheckpointTensors
from ninfer_nb.models.safetensors_io import SafetensorsFile
from ninfer_nb.models.weights import DenseWeight, QuantizedWeight
from ninfer_nb.quant.rows import values

X = "model.layers.0.mlp.up_proj"
N, K, G = 48, 256, 64
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def _pack(codes: np.ndarray, axis: int, order: list[int] | None = None) -> np.ndarray:
    """Unsigned 4-bit codes -> int32 words, 8 per word along `axis`, element j of a word in
    bits 4*pos(j) (pos = identity, or AWQ's interleave)."""
    c = np.moveaxis(codes.astype(np.uint32), axis, -1)
    c = c.reshape(*c.shape[:-1], -1, 8)
    shifts = 4 * np.arange(8, dtype=np.uint32)
    if order is not None:            # nibble p holds element order[p]
        c = c[..., order]
    words = (c << shifts).sum(axis=-1, dtype=np.uint32)
    return np.ascontiguousarray(np.moveaxis(words, -1, axis)).view(np.int32)


def _load(tmp_path: Path, tensors: dict[str, np.ndarray], qc: dict) -> CheckpointTensors:
    save_file(tensors, str(tmp_path / "model.safetensors"))
    raw = {"model_type": "llama", "quantization_config": qc}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    return CheckpointTensors(tmp_path, [SafetensorsFile(tmp_path / "model.safetensors")], raw)


def _codes(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.integers(0, 16, shape).astype(np.uint8)


@pytest.mark.parametrize("stored_zero,fmt_flag", [(7, "gptq"), (8, "gptq"), (8, "gptq_v2"), (None, "gptq")])
def test_gptq(tmp_path: Path, stored_zero: int | None, fmt_flag: str) -> None:
    """Symmetric zeros decide the convention by value (7: v1, zero 8; 8: v2, zero 8, whatever
    checkpoint_format says); asymmetric ones follow checkpoint_format (v1: zero = stored + 1)."""
    rng = np.random.default_rng(3)
    q = _codes(rng, (K, N))                                    # [K, N]
    stored = (np.full((K // G, N), stored_zero, np.uint8) if stored_zero is not None
              else _codes(rng, (K // G, N)) % 15)
    scales = (rng.random((K // G, N)) * 0.02 + 0.001).astype(np.float16)
    ct = _load(tmp_path, {
        f"{X}.qweight": _pack(q, 0), f"{X}.qzeros": _pack(stored, 1), f"{X}.scales": scales,
        f"{X}.g_idx": (np.arange(K) // G).astype(np.int32), "model.norm.weight": np.ones(8, np.float32),
    }, {"quant_method": "gptq", "bits": 4, "group_size": G, "checkpoint_format": fmt_flag})
    assert sorted(ct) == [f"{X}.weight", "model.norm.weight"]
    w = ct[f"{X}.weight"]
    zero = 8 if stored_zero is not None else stored.astype(np.float32) + 1
    expect = (scales.astype(np.float32)[np.arange(K) // G] * (q.astype(np.float32) - np.broadcast_to(zero, (K // G, N))[np.arange(K) // G])).T
    assert isinstance(w, QuantizedWeight) and w.shape == (N, K)
    assert w.format.name == ("int4-g64" if stored_zero is not None else "int4-g64-zp")
    np.testing.assert_array_equal(values(w), expect)


def test_gptq_act_order_falls_back_to_exact_values(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    q = _codes(rng, (K, N))
    g_idx = rng.permutation(np.arange(K) // G).astype(np.int32)
    scales = (rng.random((K // G, N)) * 0.02).astype(np.float16)
    ct = _load(tmp_path, {f"{X}.qweight": _pack(q, 0), f"{X}.qzeros": _pack(np.full((K // G, N), 7, np.uint8), 1),
                          f"{X}.scales": scales, f"{X}.g_idx": g_idx},
               {"quant_method": "gptq", "bits": 4, "group_size": G, "desc_act": True})
    w = ct[f"{X}.weight"]
    assert isinstance(w, DenseWeight)
    np.testing.assert_array_equal(values(w), (scales.astype(np.float32)[g_idx] * (q.astype(np.float32) - 8)).T)


def test_awq(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    q, z = _codes(rng, (K, N)), _codes(rng, (K // G, N))
    scales = (rng.random((K // G, N)) * 0.02).astype(np.float16)
    ct = _load(tmp_path, {f"{X}.qweight": _pack(q, 1, AWQ_ORDER), f"{X}.qzeros": _pack(z, 1, AWQ_ORDER),
                          f"{X}.scales": scales},
               {"quant_method": "awq", "bits": 4, "group_size": G, "version": "gemm"})
    w = ct[f"{X}.weight"]
    rows = np.arange(K) // G
    expect = (scales.astype(np.float32)[rows] * (q.astype(np.float32) - z.astype(np.float32)[rows])).T
    assert isinstance(w, QuantizedWeight) and w.format.name == "int4-g64-zp"
    np.testing.assert_array_equal(values(w), expect)


@pytest.mark.parametrize("asymmetric", [False, True])
def test_compressed_tensors_pack_quantized(tmp_path: Path, asymmetric: bool) -> None:
    rng = np.random.default_rng(6)
    signed = rng.integers(-8, 8, (N, K))
    scales = (rng.random((N, K // G)) * 0.02 + 0.001).astype(ml_dtypes.bfloat16)
    tensors = {f"{X}.weight_packed": _pack((signed + 8).astype(np.uint8), 1),
               f"{X}.weight_scale": scales, f"{X}.weight_shape": np.array([N, K], np.int64)}
    zp = np.zeros((N, K // G), np.int64)
    if asymmetric:
        zp = rng.integers(-8, 8, (N, K // G))
        tensors[f"{X}.weight_zero_point"] = _pack((zp + 8).astype(np.uint8), 0)
    ct = _load(tmp_path, tensors, {"quant_method": "compressed-tensors", "format": "pack-quantized",
                                   "config_groups": {"group_0": {"weights": {"num_bits": 4, "group_size": G}}}})
    w = ct[f"{X}.weight"]
    expect = scales.astype(np.float32)[:, np.arange(K) // G] * (signed - zp[:, np.arange(K) // G]).astype(np.float32)
    assert isinstance(w, QuantizedWeight)
    assert w.format.name == ("int4-g64-zp" if asymmetric else "int4-g64")
    np.testing.assert_array_equal(values(w), expect)


@pytest.mark.parametrize("scale_dtype", [ml_dtypes.bfloat16, np.float16, np.float32])
def test_fp8_block_128(tmp_path: Path, scale_dtype: type) -> None:
    """Partial blocks at both edges; scales in any float dtype; bf16 tensors stay bf16."""
    rng = np.random.default_rng(8)
    n, k = 200, 300
    codes = (rng.standard_normal((n, k)) * 40).astype(ml_dtypes.float8_e4m3fn)
    scale_inv = (rng.random((2, 3)) * 0.01 + 1e-4).astype(scale_dtype)
    norm = rng.standard_normal(16).astype(ml_dtypes.bfloat16)
    ct = _load(tmp_path, {f"{X}.weight": codes, f"{X}.weight_scale_inv": scale_inv,
                          "lm_head.weight": rng.standard_normal((8, 16)).astype(ml_dtypes.bfloat16),
                          "model.norm.weight": norm},
               {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": [128, 128]})
    assert sorted(ct) == sorted([f"{X}.weight", "lm_head.weight", "model.norm.weight"])
    w = ct[f"{X}.weight"]
    blocks = scale_inv.astype(np.float32)[np.arange(n)[:, None] // 128, np.arange(k)[None, :] // 128]
    assert isinstance(w, QuantizedWeight) and w.format.name == "fp8" and w.shape == (n, k)
    np.testing.assert_array_equal(values(w), codes.astype(np.float32) * blocks)
    assert ct["lm_head.weight"].dtype == ml_dtypes.bfloat16          # never widened
    assert ct.shape_of("lm_head.weight") == (8, 16)


def test_unknown_quant_method_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedModelError, match="bitsandbytes"):
        _load(tmp_path, {"a": np.zeros(2, np.float32)}, {"quant_method": "bitsandbytes"})
