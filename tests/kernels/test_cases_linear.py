"""Dense decode GEMVs (kernels/linear/linear.py) through CudaOps vs ops.cpu, one body per case:
small shapes under the CUDA simulator (tests/support/sim_runner.py; ptx_sim stands in for the
16-byte loads and shuffles), the 27B / 35B shapes on the GPU (-m gpu), where the cases also check
which kernel ops picks and print times (-s). bf16 weights hold bf16-exact values, so the fp32
reference on them measures the kernel. (`linear` by shape: test_linear.py.)"""
from __future__ import annotations

import numpy as np
import pytest

from ninfer_nb.kernels.linear import linear as K_lin
from ninfer_nb.ops import cpu
from ninfer_nb.ops import cuda as cuda_ops
from ninfer_nb.ops.cuda import linear as cuda_linear
from tests.kernels.case_util import GPU_ONLY, TOL_F32, gpu_only, launched, one_token
from tests.kernels.device import DEVICE_MARKS, SIM, shapes
from tests.kernels.gpu_util import BF16, close, rnd, rnd_bf16

pytestmark = DEVICE_MARKS
TOL32 = 1e-5


# one-token builds (K slices, blocks per SM, warps per block) each case runs besides ops' pick
_BUILDS = {"plain": ((1, 2, 8), (2, 3, 8), (8, 4, 8), (1, 5, 4), (2, 6, 4), (4, 6, 4)) if SIM else
           ((1, 2, 8), (2, 3, 8), (4, 4, 8), (8, 4, 8), (1, 5, 4), (1, 6, 4), (2, 4, 4), (2, 6, 4), (4, 6, 4)),
           "normed": ((1, 2, 8), (4, 2, 8), (1, 4, 4), (2, 8, 2)) if SIM else
           ((1, 2, 8), (2, 4, 8), (4, 2, 8), (8, 4, 8), (2, 4, 4), (4, 8, 4), (1, 8, 2)),
           "swiglu": ((2, 2, 8), (1, 4, 4)) if SIM else ((1, 2, 8), (2, 2, 8), (2, 4, 4), (1, 8, 2))}


@pytest.mark.parametrize("mode,n,k", shapes(
    sim=[("plain", 11, 2312), ("normed", 11, 2312), ("swiglu", 10, 2312)],
    gpu=[("plain", n, k) for n, k in ((5120, 17408), (5120, 6144), (2048, 4096), (257, 2048), (6, 2304), (3, 2048))]
    + [("normed", n, k) for n, k in ((12352, 2048), (16480, 5120), (77, 40 * 8), (5, 2056))]
    + [("swiglu", 2 * i, k) for i, k in ((17408, 5120), (96, 264))]))
def test_gemv_one_token(dev, rng, mode, n, k, monkeypatch):
    """gemv_one_token, the decode step's GEMVs, at several builds vs NumPy. plain adds into its
    bias, aliased as out (the residual stream); normed and swiglu fuse the RMSNorm. Simulator:
    K = 2312 is two full passes of 1024 columns, then the tail loop's 256-column chunk and, for
    lane 0 only, 8 columns; 2, 4 and 8 slices are uneven (8: the last three empty); N = 11 (a
    lone last row; swiglu: I = 5) leaves dead row pairs in the last block. GPU: the 27B / 35B
    shapes, an uneven last slice (K = 2304), dead row pairs (N = 3, 5, 6); the build ops picks
    (one_token_build) through ops.linear / linear_add / linear_swiglu; build times (-s)."""
    ops = dev.fresh()
    n_out = n // 2 if mode == "swiglu" else n
    w = rnd_bf16(rng, n, k)
    x, nw, r = rnd(rng, 1, k), rnd(rng, k), rnd(rng, 1, n_out)
    wf = w.astype(np.float32)
    X, NW, W = dev.up(x), dev.up(nw), dev.up(w)
    if mode == "plain":
        ref = r + cpu.linear(x, wf)
    elif mode == "normed":
        ref = cpu.linear(cpu.rms_norm(x, nw, 1e-6), wf)
    else:
        ref = cpu.linear_swiglu(cpu.rms_norm(x, nw, 1e-6), wf)
    times = {}
    for ways, blocks, warps in _BUILDS[mode]:
        O = dev.up(r if mode == "plain" else np.full((1, n_out), np.nan, np.float32))
        one_token(ops, mode, ways, blocks, X, NW, W, O.reshape(-1), O, mode == "plain", warps)
        close(dev.host(O), ref, TOL_F32)
        if dev.on_gpu and mode == "plain":
            B = dev.up(r.reshape(-1))
            times[ways, blocks, warps], _ = dev.best_time(
                lambda: one_token(ops, mode, ways, blocks, X, NW, W, B, O, True, warps), reps=5, graph=True)
    if not dev.on_gpu:                      # ops' own picks take the GEMV paths on the GPU only
        return
    names = launched(ops, monkeypatch)
    pick = K_lin.gemv_one_token(*cuda_ops.one_token_build(mode, n, k, ops.sm_count)).name
    if mode == "plain":
        close(dev.host(ops.linear(X, W, dev.up(r.reshape(-1)))), ref, TOL_F32)
        assert names == [pick]
        print(f"\nGEMV {n}x{k} T=1, us by (K slices, blocks per SM, warps): "
              + ", ".join(f"{key}: {v * 1e6:.1f}" for key, v in times.items()))
    elif mode == "normed":
        close(dev.host(ops.linear(ops.normed(X, NW, 1e-6), W)), ref, TOL_F32)
        assert names == [pick]
        R = dev.up(r)
        assert ops.linear_add(X, W, R) is R
        close(dev.host(R), r + cpu.linear(x, wf), TOL_F32)
        assert "add_kernel" not in names
        if n > 10000:
            pair, _ = dev.best_time(lambda: ops.linear(ops.rms_norm(X, NW, 1e-6), W), reps=5, graph=True)
            fused, _ = dev.best_time(lambda: ops.linear(ops.normed(X, NW, 1e-6), W), reps=5, graph=True)
            print(f"\nnormed GEMV {n}x{k}: norm + GEMV {pair * 1e6:.1f} us, fused {fused * 1e6:.1f} us "
                  f"({w.nbytes / fused / 1e9:.0f} GB/s)")
    else:
        best, o = dev.best_time(lambda: ops.linear_swiglu(ops.normed(X, NW, 1e-6), W), reps=5, graph=True)
        close(dev.host(o), ref, TOL_F32)
        if n_out == 17408:
            pair, _ = dev.best_time(lambda: ops.linear_swiglu(ops.rms_norm(X, NW, 1e-6), W), reps=5, graph=True)
            print(f"\nnormed GEMV + SwiGLU {n}x{k}: norm + GEMV {pair * 1e6:.1f} us, fused {best * 1e6:.1f} us")


@pytest.mark.parametrize("n,k,t", shapes(
    sim=[(11, 2312, 1), (11, 2312, 5)],
    gpu=[(n, k, t) for t in (5, 16)
         for n, k in ((5120, 17408), (5120, 6144), (2048, 4096), (257, 2048), (6, 2304), (3, 2048))]))
def test_gemv_multi_token(dev, rng, n, k, t, monkeypatch):
    """The GEMVs for up to 16 tokens (4 per pass; T = 5: a full pass and a one-token one) vs
    NumPy: gemv_bf16_kernel (vectorised and scalar paths), the split-K kernels (2 and 4 K slices
    per row pair, the bias added; simulator K = 2312: uneven slices, the last of 4 holding 8
    columns) and the SwiGLU GEMV on the weight's first 2 * (N // 2) rows. GPU: also the
    tensor-core GEMV ops.linear takes, and the SIMT kernel ops.linear picks by K."""
    ops = dev.fresh()
    w = rnd_bf16(rng, n, k)
    x, b = rnd(rng, t, k), rnd(rng, n)
    X, W, B = dev.up(x), dev.up(w), dev.up(b)
    ref = cpu.linear(x, w.astype(np.float32), b)
    g = K_lin.GEMV_WARPS * 32
    outs = {}
    for vec in (1, 0):
        O = dev.up(np.full((t, n), np.nan, np.float32))
        ops._go(K_lin.gemv_bf16_kernel, -(-n // K_lin.GEMV_ROWS_PER_BLOCK), g, X, W, B, O, np.int32(1), np.int32(vec))
        outs[vec] = dev.host(O)
        close(outs[vec], ref, TOL_F32)
    for spec, ways in ((K_lin.gemv_bf16_splitk2_kernel, 2), (K_lin.gemv_bf16_splitk_kernel, 4)):
        O = dev.up(np.full((t, n), np.nan, np.float32))
        ops._go(spec, -(-n // K_lin.splitk_rows_per_block(ways)), g, X, W, B, O, np.int32(1))
        close(dev.host(O), ref, TOL_F32)
        close(dev.host(O), outs[1], TOL_F32)
    i = n // 2
    if i:
        GU = dev.up(w[:2 * i])
        H = dev.up(np.full((t, i), np.nan, np.float32))
        ops._go(K_lin.gemv_bf16_swiglu_kernel, -(-i // K_lin.GEMV_WARPS), g, X, GU, H)
        close(dev.host(H), cpu.linear_swiglu(x, w[:2 * i].astype(np.float32)), TOL_F32)
    if not dev.on_gpu:
        return
    names = launched(ops, monkeypatch)
    close(dev.host(ops.linear(X, W, B)), ref, TOL_F32)               # the tensor-core GEMV (gemv_mma.py)
    monkeypatch.setattr(cuda_linear, "GEMV_MMA", False)              # the SIMT GEMVs ops picks by K
    for ways in (0, 2, 4):
        monkeypatch.setattr(cuda_linear, "SPLITK_MIN_K", 2048 if ways == 4 else 1 << 30)
        monkeypatch.setattr(cuda_linear, "SPLITK2_MIN_K", 2048 if ways == 2 else 1 << 30)
        close(dev.host(ops.linear(X, W, B)), ref, TOL_F32)
    assert {"gemv_bf16_kernel", "gemv_bf16_splitk_kernel", "gemv_bf16_splitk2_kernel"} <= set(names)


@GPU_ONLY
@pytest.mark.parametrize("i,k,t", gpu_only([(17408, 5120, 1), (512, 2048, 4), (96, 264, 6), (3, 16, 16)]))
def test_linear_swiglu_gemv(dev, rng, i, k, t):
    """ops.linear_swiglu's SwiGLU-epilogue GEMV against the GEMV + swiglu pair and NumPy (the
    27B MLP shape, a ragged last block, 1-4 passes over the tokens); prints both times at the
    27B shape (-s)."""
    ops = dev.fresh()
    w = rnd_bf16(rng, 2 * i, k)
    x = rnd(rng, t, k)
    X, W = dev.up(x), dev.up(w)
    ref = cpu.linear_swiglu(x, w.astype(np.float32))
    times, outs = {}, {}
    calls = {False: lambda: ops.swiglu(ops.linear(X, W)), True: lambda: ops.linear_swiglu(X, W)}
    for fused in (False, True):
        times[fused], o = dev.best_time(calls[fused], reps=5, graph=True)
        outs[fused] = dev.host(o)
    close(outs[True], ref, TOL_F32)
    close(outs[True], outs[False], TOL_F32)
    if i == 17408:
        print(f"\nGEMV + SwiGLU {2 * i}x{k} T={t}: pair {times[False] * 1e6:.1f} us, fused {times[True] * 1e6:.1f} us")


@GPU_ONLY
@pytest.mark.parametrize("t", gpu_only([17, 300]))
@pytest.mark.parametrize("bias", gpu_only([False, True]))
def test_linear_split_gemm_parts(dev, rng, t, bias):
    """ops.linear_split: the fused projection as split(linear) and as ops.linear_split's one
    tensor-core GEMM per part of the weight rows (mma.sync at T = 17, wgmma on cc 9.0 at T = 300
    when the ops take it); both vs NumPy on bf16-rounded x."""
    ops = dev.fresh()
    sizes = (256, 128, 48, 48)
    w = rnd_bf16(rng, sum(sizes), 512)
    x, b = rnd(rng, t, 512), rnd(rng, sum(sizes))
    ref = cpu.split(cpu.linear(x.astype(BF16).astype(np.float32), w.astype(np.float32), b if bias else None),
                    sizes)
    X, W, B = dev.up(x), dev.up(w), dev.up(b) if bias else None
    for parts in (False, True):
        got = [dev.host(p) for p in (ops.linear_split(X, W, B, sizes) if parts
                                     else ops.split(ops.linear(X, W, B), sizes))]
        assert [g.shape for g in got] == [r.shape for r in ref]
        for g, r in zip(got, ref):
            close(g, r, TOL_F32)


@GPU_ONLY
@pytest.mark.parametrize("t", gpu_only([1, 4]))
def test_lm_head_and_embedding_vocab(dev, rng, t):
    """Vocab-size GEMV 248320 x 5120 (2.5 GB bf16) and the tied embedding gather."""
    ops = dev.fresh()
    v, h = 248320, 5120
    w = rnd_bf16(rng, v, h)
    W = dev.up(w)
    x = rnd(rng, t, h)
    y = dev.host(ops.linear(dev.up(x), W))
    assert np.isfinite(y).all()
    rows = rng.choice(v, 4096, replace=False)
    rows[:2] = [0, v - 1]
    close(y[:, rows], x @ w[rows].astype(np.float32).T, TOL_F32)
    ids = rng.integers(0, v, 13).astype(np.int32)
    ids[:2] = [0, v - 1]
    close(dev.host(ops.embedding(W, dev.up(ids))), w[ids].astype(np.float32), 0)
