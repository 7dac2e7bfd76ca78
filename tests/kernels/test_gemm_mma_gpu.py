"""Tensor-core prefill GEMMs (kernels/linear/gemm_mma.py, kernels/linear/gemm_wgmma.py) through
CudaOps.linear, GPU only.

Reference: NumPy fp32 on the bf16-rounded x and W (the kernel converts x to bf16), so the
tolerance measures the kernel, not the rounding: the same bf16 products summed in fp32. The
tensor cores' fp32 accumulation truncates, so the kernels' error grows with K, not sqrt(K):
relative Frobenius error 0.02 K 2^-24 measured on the H200 (1.7e-7 at K = 128, 5.9e-6 at 5120,
2.0e-5 at 17408, mma.sync and wgmma alike); `tol(k)` allows 0.05 K 2^-24. The SwiGLU GEMM's
bf16 output rounds its own fp32 values (1.4e-4 - 2.4e-4 measured): TOL_BF16_OUT. The scratch arena is NaN-filled before each
case, so an unwritten output element fails. `test_gemm_mma_timing` prints TFLOP/s (CUDA events,
best of 5) of mma.sync, wgmma (on cc 9.0) and the old CUDA-core `gemm_kernel`, and writes the
table to $OUT if set.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from ninfer_nb.kernels.linear import gemm_mma as K_mma
from ninfer_nb.kernels.linear import gemm_wgmma as K_wg
from ninfer_nb.kernels.linear import linear as K_lin
from tests.kernels.gpu_util import BF16, GpuEnv, rnd, rnd_bf16

pytestmark = pytest.mark.gpu
TOL_BF16_OUT = 5e-4


def tol(k: int) -> float:
    """The bound on the relative Frobenius error of a K-long fp32-accumulated bf16 product."""
    return 0.05 * k * 2.0 ** -24


@pytest.fixture(scope="module")
def env() -> GpuEnv:
    return GpuEnv(arena_bytes=8 << 30, scratch_bytes=4 << 30)


def _spy(ops) -> list[str]:
    """Record the names of the kernels ops launches (to prove the dispatcher took the MMA path)."""
    names: list[str] = []
    go = type(ops)._go

    def rec(self, spec, *a, **kw):
        names.append(spec.name)
        go(self, spec, *a, **kw)

    ops._go = rec.__get__(ops)
    return names


def _rel_fro(a: np.ndarray, b: np.ndarray) -> float:
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert np.isfinite(a).all(), f"{int((~np.isfinite(a)).sum())} non-finite outputs (unwritten?)"
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.mark.parametrize("m,n,k,with_bias", [
    (17, 1001, 128, True),          # just above GEMV_MAX_T, odd N (scalar-store epilogue)
    (37, 5120, 5120, True),         # ragged M
    (200, 17408, 5120, False),
    (300, 136, 64, True),           # K = 64: two k-tiles, ring shorter than the prologue
    (512, 2 * 4096 + 8, 17408, True),   # ragged N (LM-head-like), long K
])
def test_gemm_mma(env, m, n, k, with_bias):
    ops = env.fresh()
    rng = np.random.default_rng(m * 7 + n * 3 + k)
    w = rnd_bf16(rng, n, k)
    x = rnd(rng, m, k)
    b = rnd(rng, n) if with_bias else None
    W, X = env.up(w), env.up(x)
    B = env.up(b) if with_bias else None
    names = _spy(ops)
    wgmma, ops.use_wgmma = ops.use_wgmma, False           # this test is mma.sync's (wgmma: below)
    try:
        got = env.host(ops.linear(X, W, B))
    finally:
        del ops._go
        ops.use_wgmma = wgmma
    assert "gemm_mma_kernel" in names and "f32_to_bf16_kernel" in names, names
    ref = x.astype(BF16).astype(np.float32) @ w.astype(np.float32).T
    if with_bias:
        ref += b
    err = _rel_fro(got, ref)
    print(f"\ngemm_mma M={m} N={n} K={k} bias={with_bias}: rel_fro_err={err:.2e}")
    assert err <= tol(k)


def _hopper_ops(env):
    from ninfer_nb.runtime import device

    cc = device.select("cuda:0").compute_capability
    if tuple(cc) != (9, 0):
        pytest.skip(f"wgmma needs cc 9.0 (this GPU is {cc})")
    ops = env.fresh()
    assert ops.arch == (9, 0) and ops.use_wgmma           # the default on Hopper, as GpuEnv builds it
    return ops


@pytest.mark.parametrize("m,n,k,with_bias", [
    (256, 1001, 128, True),         # one row tile, odd N (scalar-store epilogue), two k-tiles
    (300, 16480, 5120, True),       # ragged M and N (the fused GDN projection of the 27B)
    (512, 17408, 5120, False),
    (1024, 5120, 17408, True),      # long K
])
def test_gemm_wgmma(env, m, n, k, with_bias):
    ops = _hopper_ops(env)
    assert ops.use_wgmma
    rng = np.random.default_rng(m * 5 + n * 3 + k)
    w = rnd_bf16(rng, n, k)
    x = rnd(rng, m, k)
    b = rnd(rng, n) if with_bias else None
    W, X = env.up(w), env.up(x)
    B = env.up(b) if with_bias else None
    got = env.host(ops.linear(X, W, B))
    ref = x.astype(BF16).astype(np.float32) @ w.astype(np.float32).T
    if with_bias:
        ref += b
    err = _rel_fro(got, ref)
    print(f"\ngemm_wgmma M={m} N={n} K={k} bias={with_bias}: rel_fro_err={err:.2e}")
    assert err <= tol(k)


@pytest.mark.parametrize("m,inter,k", [
    (256, 128, 128),                # one row tile, two column tiles, two k-tiles
    (300, 17408, 5120),             # ragged M at the 27B MLP shape
    (2048, 17408, 5120),            # a 27B prefill chunk (timed)
])
def test_gemm_wgmma_swiglu_mlp(env, m, inter, k):
    """The 27B MLP on a prefill chunk: linear_swiglu's wgmma GEMM with the SwiGLU in its
    epilogue (bf16 h) then the down GEMM, against NumPy on bf16-rounded operands and against
    the unfused GPU path (GEMM to fp32 [M, 2I], swiglu kernel, bf16 conversion in linear), which
    rounds the same fp32 values: equal up to the odd bf16 tie of exp's last ulp."""
    from ninfer_nb.ops import cpu

    ops = _hopper_ops(env)
    rng = np.random.default_rng(m + inter + k)
    gu, dn = rnd_bf16(rng, 2 * inter, k), rnd_bf16(rng, k, inter)
    x = rnd(rng, m, k)
    GU, DN, X = env.up(gu), env.up(dn), env.up(x)
    names = _spy(ops)
    try:
        h = ops.linear_swiglu(X, GU)
        got = env.host(ops.linear(h, DN))
    finally:
        del ops._go
    assert "gemm_wgmma_swiglu_kernel" in names and h.dtype == np.uint16, (names, h.dtype)
    hb = cpu.swiglu(x.astype(BF16).astype(np.float32) @ gu.astype(np.float32).T).astype(BF16)
    err_h = _rel_fro(env.host(h).view(BF16).astype(np.float32), hb.astype(np.float32))
    ref = hb.astype(np.float32) @ dn.astype(np.float32).T
    err = _rel_fro(got, ref)
    ops.use_wgmma = False                       # unfused: mma.sync GEMM + swiglu kernel + linear
    env.scratch.reset()
    unfused = env.host(ops.linear(ops.linear_swiglu(X, GU), DN))
    err_unfused = _rel_fro(got, unfused)
    ops.use_wgmma = True
    timing = ""
    if m >= 2048:
        def fused() -> None:
            env.scratch.reset()
            ops.linear(ops.linear_swiglu(X, GU), DN)

        def pair() -> None:
            env.scratch.reset()
            ops.linear(ops.swiglu(ops.linear(X, GU)), DN)

        timing = f"; MLP fused {_best_ms(env, fused):.2f} ms, GEMM + swiglu + GEMM {_best_ms(env, pair):.2f} ms"
    print(f"\ngemm_wgmma_swiglu MLP M={m} I={inter} K={k}: rel_fro_err h {err_h:.2e}, out {err:.2e}, "
          f"vs unfused {err_unfused:.2e}{timing}")
    assert err_h <= TOL_BF16_OUT and err <= TOL_BF16_OUT and err_unfused <= TOL_BF16_OUT


def _best_ms(env, fn, reps: int = 5) -> float:
    from ninfer_nb.runtime.events import Timer

    fn()
    best = 1e30
    for _ in range(reps):
        with Timer(env.stream) as t:
            fn()
        best = min(best, t.ms)
    return best


def _timing_row(env, ops, W, m: int, n: int, k: int, rng: np.random.Generator, wgmma: bool) -> str:
    X = env.up(rnd(rng, m, k))
    flop = 2.0 * m * n * k

    def lin() -> None:
        env.scratch.reset()
        ops.linear(X, W)

    t_lin = _best_ms(env, lin)
    env.scratch.reset()
    xb = ops.empty((m, k), np.uint16)
    out = ops.empty((m, n))
    ops._go(K_mma.f32_to_bf16_kernel, K_mma.cvt_grid(m * k), K_mma.CVT_THREADS, X.reshape(-1), xb.reshape(-1))
    t_mma = _best_ms(env, lambda: ops._go(K_mma.gemm_mma_kernel, K_mma.gemm_grid(m, n), K_mma.THREADS,
                                             xb, W, out.reshape(-1), out, np.int32(0)))
    t_wg = float("nan")
    if wgmma:
        t_wg = _best_ms(env, lambda: K_wg.gemm_wgmma_kernel[K_wg.gemm_grid(m, n), K_wg.THREADS,
                                                            env.stream.numba, K_wg.SMEM_BYTES](
            xb, W, out.reshape(-1), out, np.int32(0)))
    grid = ((n + K_lin.BN - 1) // K_lin.BN, (m + K_lin.BM - 1) // K_lin.BM)
    t_old = _best_ms(env, lambda: ops._go(K_lin.gemm_kernel, grid, 256, X, W, out.reshape(-1), out, np.int32(0)),
                     reps=2 if m >= 8192 else 5)

    def cell(ms: float) -> str:
        return f"{flop / ms / 1e9:7.1f} TF/s {ms * 1e3:9.1f} us"

    return f"{m:5d} {n:6d} {k:5d} | {cell(t_lin)} | {cell(t_mma)} | {cell(t_wg)} | {cell(t_old)}"


def test_gemm_mma_timing(env):
    ops = env.fresh()
    n, k = 17408, 5120
    rng = np.random.default_rng(0)
    W = env.up(rnd_bf16(rng, n, k))
    from ninfer_nb.runtime import device

    wgmma = tuple(device.select("cuda:0").compute_capability) == (9, 0)
    head = f"{'M':>5} {'N':>6} {'K':>5} | {'linear (cvt+mma)':>27} | {'mma kernel only':>27} | "
    rows = [head + f"{'wgmma kernel only':>27} | {'old gemm_kernel':>27}"]
    rows += [_timing_row(env, ops, W, m, n, k, rng, wgmma) for m in (512, 2048, 8192)]
    table = "\n".join(rows)
    print("\n" + table)
    out_dir = os.environ.get("OUT")
    if out_dir:
        with open(os.path.join(out_dir, "gemm_mma_timing.txt"), "w") as f:
            f.write(table + "\n")
