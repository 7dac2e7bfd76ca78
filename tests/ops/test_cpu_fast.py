"""ops/cpu_fast.py (the CPU backend's few-row linear) against the reference ops.cpu.linear."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer_nb.engine.backend import CpuBackend
from ninfer_nb.models.weights import DenseWeight
from ninfer_nb.ops import cpu, cpu_fast


@pytest.mark.parametrize("t", [1, 2, 3, 4, 5, 8, 11, 16, 17, 40])
def test_fast_linear_equals_reference(t: int) -> None:
    rng = np.random.default_rng([27, t])
    n, k = 4 * 9 + 3, 67              # leftover weight / token rows; t > FAST_MAX_T: the BLAS path
    x = rng.standard_normal((t, k), dtype=np.float32)
    w = DenseWeight(rng.standard_normal((n, k), dtype=np.float32), "f32")
    bias = rng.standard_normal(n, dtype=np.float32)
    want = cpu.linear(x, w, bias)
    got = cpu_fast.linear(x, w, bias)
    assert got.shape == want.shape and got.dtype == np.float32 and got.flags.c_contiguous
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    res, res_ref = np.ones((t, n), np.float32), np.ones((t, n), np.float32)
    assert cpu_fast.linear_add(x, w, res) is res
    np.testing.assert_allclose(res, cpu.linear_add(x, w, res_ref), rtol=1e-5, atol=1e-4)


def test_fast_linear_falls_back_to_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(7)
    w = rng.standard_normal((12, 8), dtype=np.float32)
    many = rng.standard_normal((cpu_fast.FAST_MAX_T + 1, 8), dtype=np.float32)
    np.testing.assert_allclose(cpu_fast.linear(many, w), cpu.linear(many, w), rtol=1e-5, atol=1e-5)
    calls = []
    monkeypatch.setattr(cpu, "linear", lambda x, weight, bias=None: calls.append(x.shape) or np.zeros(1))
    cpu_fast.linear(many[:2], w)                       # a replaced reference (fault injection) wins
    assert calls == [(2, 8)]


def test_cpu_backend_routes_linear_layers_to_the_fast_kernel() -> None:
    b = CpuBackend()
    assert b.ops.linear is cpu_fast.linear and b.ops.linear_swiglu is cpu_fast.linear_swiglu
    assert b.ops.rms_norm is cpu.rms_norm
    w = np.asfortranarray(np.random.default_rng(3).standard_normal((6, 5), dtype=np.float32))
    assert cpu_fast.fast_matrix(w) is None             # a layout the kernel cannot read in place
    assert cpu_fast.fast_matrix(np.ascontiguousarray(w)) is not None


@pytest.mark.parametrize("gated", [False, True])
def test_fast_paged_decode_attention_equals_reference(gated: bool) -> None:
    """One query per sequence through a shuffled page table, GQA (6 query heads on 2 KV heads)."""
    rng = np.random.default_rng([27, int(gated)])
    page = cpu.PAGE_SIZE
    pages, hq, hkv, d = 7, 6, 2, 16
    k_cache = rng.standard_normal((pages * page, hkv, d), dtype=np.float32)
    v_cache = rng.standard_normal((pages * page, hkv, d), dtype=np.float32)
    table = np.stack([rng.permutation(pages)[:3] for _ in range(4)]).astype(np.int32)     # [B=4, P=3]
    positions = np.array([0, page - 1, page + 5, 3 * page - 2], dtype=np.int64)
    q = rng.standard_normal((4, hq, d), dtype=np.float32)
    if gated:
        gate = rng.standard_normal((4, hq * d), dtype=np.float32)
        want = cpu.attention_gated(q, k_cache, v_cache, positions, 0.25, gate, page_table=table)
        got = cpu_fast.attention_gated(q, k_cache, v_cache, positions, 0.25, gate, page_table=table)
    else:
        want = cpu.attention(q, k_cache, v_cache, positions, 0.25, page_table=table)
        got = cpu_fast.attention(q, k_cache, v_cache, positions, 0.25, page_table=table)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
