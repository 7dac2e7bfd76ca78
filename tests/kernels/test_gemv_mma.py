"""kernels/linear/gemv_mma.py (the decode GEMV of 2..16 tokens on tensor cores) vs ops.cpu.linear:
small shapes in the CUDA simulator, model shapes on the GPU (-m gpu) with its time against the
SIMT multi-token GEMV it replaces (-s)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ninfer_nb.kernels.linear import gemv_mma as K
from ninfer_nb.ops import cpu
from tests.kernels.device import DEVICE_MARKS, shapes
from tests.kernels.gpu_util import close, rnd

pytestmark = DEVICE_MARKS
BF16 = ml_dtypes.bfloat16


def _gemv(ops, X, W, B, t, n):
    """gemv_mma_kernel as CudaOps._gemv_mma_into launches it."""
    out = ops.empty((t, n))
    ops._go(K.gemv_mma_kernel, K.grid(n), K.THREADS, X, W, B, out, np.int32(1))
    return out


@pytest.mark.parametrize("t,n,k", shapes(
    sim=[(2, 20, 320), (9, 17, 96)],
    gpu=[(8, 17408, 5120), (16, 17408, 5120), (8, 5120, 17408), (3, 40, 320), (2, 17408, 5120),
         (16, 5120, 6144), (5, 12288, 5120), (16, 4096, 2048), (16, 248320, 5120)]))
def test_gemv_mma(dev, rng, t, n, k):
    """T tokens x an [N, K] bf16 weight with a bias vs NumPy on fp32 x (x enters as bf16 high
    part + remainder, so the error stays at fp32 accumulation's). Small cases: N not a multiple
    of 16 (the last block's rows past N load the last row and store nothing), K slices of 0-2
    column blocks per warp (partial UNROLL rounds), T > 8 (both token tiles). On the GPU timed
    against the SIMT GEMV it replaces (-s)."""
    ops = dev.fresh()
    w = rnd(rng, n, k).astype(BF16)
    x, bias = rnd(rng, t, k), rnd(rng, n)
    want = cpu.linear(x, w.astype(np.float32), bias)
    X, B = dev.up(x), dev.up(bias)
    W = dev.up(w).view(np.uint16) if dev.on_gpu else w.view(np.uint16)
    close(dev.host(_gemv(ops, X, W, B, t, n)), want, 2e-5)
    if dev.on_gpu and n * k > 1 << 24:
        from ninfer_nb.kernels.linear import linear as K_lin

        def simt():
            o = ops.empty((t, n))
            ops._go(K_lin.gemv_bf16_kernel, (n + K_lin.GEMV_ROWS_PER_BLOCK - 1) // K_lin.GEMV_ROWS_PER_BLOCK,
                    256, X, W, B, o, np.int32(1), np.int32(1))

        tm = dev.best_time(lambda: _gemv(ops, X, W, B, t, n), graph=True)[0]
        ts = dev.best_time(simt, graph=True)[0]
        print(f"\nGEMV T={t} {n}x{k}: tensor cores {tm * 1e6:.1f} us ({n * k * 2 / tm / 1e9:.0f} GB/s), "
              f"SIMT {ts * 1e6:.1f} us")



def _gemv3(ops, build, X, W, B, out, blocks, has_bias=1, accumulate=0):
    """gemv_mma3 `build` (mode, warps, tiles, unroll, min_blocks[, pipe]) on `blocks` blocks;
    also returns the arrival counters (0 again after the launch)."""
    mode, warps, tiles = build[:3]
    t, (n, k) = X.shape[0], W.shape
    ws = ops.empty((K.v3_segments(K.v3_groups(mode, warps, tiles, n), k, blocks), t, n))
    counter = ops.zeros((K.MAX_GROUPS,), np.int32, persistent=True)
    ops._go(K.gemv_mma3(*build), blocks, 32 * warps, X, W, B, out, np.int32(has_bias), np.int32(accumulate), ws,
            counter)
    return out, counter


@pytest.mark.parametrize("build,t,n,k,blocks,accumulate", shapes(
    sim=[(("plain", 2, 2, 2, 2), 3, 72, 320, 2, 0), (("plain", 2, 1, 4, 2), 9, 40, 288, 5, 1),
         (("plain", 2, 2, 1, 2), 16, 70, 96, 4, 0), (("swiglu", 2, 2, 2, 2), 5, 2 * 36, 192, 3, 0),
         (("swiglu", 2, 2, 2, 2), 12, 2 * 20, 160, 1, 0), (("plain", 2, 1, 2, 2, 1), 16, 40, 288, 3, 1),
         (("swiglu", 2, 2, 1, 2, 1), 7, 2 * 40, 224, 4, 0), (("plain", 2, 1, 1, 2, 0, 4), 10, 40, 288, 3, 1),
         (("swiglu", 2, 2, 1, 2, 0, 3), 16, 2 * 40, 224, 4, 0)],
    gpu=[(("plain", 8, 1, 4, 2), 8, 17408, 5120, 264, 0), (("plain", 8, 2, 2, 2), 16, 5120, 17408, 520, 1),
         (("swiglu", 8, 2, 2, 2), 8, 34816, 5120, 272, 0), (("swiglu", 8, 2, 2, 2, 1), 4, 34816, 5120, 264, 0),
         (("plain", 8, 1, 4, 2), 2, 248320, 5120, 264, 0)]))
def test_gemv_mma3(dev, rng, build, t, n, k, blocks, accumulate):
    """The v3 builds (warps over row tiles, K split over blocks) vs NumPy: plain with a bias
    (and the residual added in place when accumulate), swiglu (gate rows, then up rows) into
    [T, I]. Small cases: N not a multiple of the block's rows; grids that give a block several
    whole row groups, part of two groups, or a share of one (the last block of each shared
    group sums the partials and resets its counter); T over 8; the prefetching builds (pipe)
    over odd and even numbers of load rounds; the shared-memory ring builds (stages) over
    segments shorter and longer than the ring."""
    ops = dev.fresh()
    mode = build[0]
    w = rnd(rng, n, k).astype(BF16)
    x, bias = rnd(rng, t, k), rnd(rng, n)
    W = dev.up(w).view(np.uint16) if dev.on_gpu else w.view(np.uint16)
    X, B = dev.up(x), dev.up(bias)
    y = cpu.linear(x, w.astype(np.float32))
    if mode == "swiglu":
        want = cpu.swiglu(y)
        out0 = np.full((t, n // 2), np.nan, np.float32)
    else:
        out0 = rnd(rng, t, n)
        want = y + bias + (out0 if accumulate else 0)
    out, counter = _gemv3(ops, build, X, W, B, dev.up(out0), blocks, int(mode == "plain"), accumulate)
    close(dev.host(out), want, 2e-5)
    assert not dev.host(counter).any()


@pytest.mark.skipif(not DEVICE_MARKS, reason="ops picks gemv_mma3 on the GPU only")
@pytest.mark.parametrize("pick", ["mma3", "mma4"])
@pytest.mark.parametrize("t,n,k", [(8, 17408, 5120), (4, 5120, 17408), (16, 5120, 6144), (2, 1000, 2048)])
def test_ops_gemv_mma3(dev, rng, monkeypatch, t, n, k, pick):
    """ops.linear (+ bias), linear_add (the residual in place) and linear_swiglu on T rows with
    GEMV_MMA3 on, by gemv_mma3 (mma3_plan's build and K splits) or gemv_mma4 (mma4_plan;
    KernelChoices.multi_token_gemv) vs NumPy."""
    from dataclasses import replace

    from ninfer_nb.ops.cuda import linear as L

    monkeypatch.setattr(L, "GEMV_MMA3", True)
    ops = dev.fresh()
    monkeypatch.setattr(ops, "choices", replace(ops.choices, multi_token_gemv=pick))
    ops._mma3_counter = None                   # the persistent arena was reset
    w = rnd(rng, n, k).astype(BF16)
    x, bias, res = rnd(rng, t, k), rnd(rng, n), rnd(rng, t, n)
    W, X = dev.up(w), dev.up(x)
    y = cpu.linear(x, w.astype(np.float32))
    close(dev.host(ops.linear(X, W, dev.up(bias))), y + bias, 2e-5)
    R = dev.up(res)
    ops.linear_add(X, W, R)
    close(dev.host(R), y + res, 2e-5)
    close(dev.host(ops.linear_swiglu(X, W)), cpu.swiglu(y), 2e-5)


def _gemv4(ops, build, X, W, B, out, blocks, has_bias=1, accumulate=0):
    """gemv_mma4 `build` (mode, warps, tiles, kb, stages, min_blocks[, lm[, xs]]) on `blocks` blocks, with
    its dynamic shared memory; also returns the arrival counters (0 again after the launch)."""
    mode, warps, tiles, kb, stages = build[:5]
    xs = build[7] if len(build) > 7 else 0
    t, (n, k) = X.shape[0], W.shape
    ws = ops.empty((K.v3_segments(K.v3_groups(mode, warps, tiles, n), k, blocks, 32 * kb), t, n))
    counter = ops.zeros((K.MAX_GROUPS,), np.int32, persistent=True)
    ops._go(K.gemv_mma4(*build), blocks, 32 * warps, X, W, B, out, np.int32(has_bias), np.int32(accumulate), ws,
            counter, smem=K.v4_smem(warps, tiles, kb, stages, xs))
    return out, counter


@pytest.mark.parametrize("build,t,n,k,blocks,accumulate", shapes(
    sim=[(("plain", 2, 1, 2, 3, 2), 10, 40, 320, 3, 1), (("plain", 2, 2, 4, 2, 2), 3, 72, 384, 2, 0),
         (("swiglu", 2, 2, 2, 3, 2), 16, 2 * 40, 256, 4, 0), (("plain", 2, 1, 8, 3, 2), 5, 36, 512, 1, 0),
         (("plain", 2, 2, 4, 3, 2, 1), 12, 72, 384, 3, 1), (("swiglu", 2, 2, 2, 2, 2, 1), 5, 2 * 40, 256, 2, 0),
         (("plain", 2, 1, 4, 3, 2, 0, 1), 16, 40, 384, 3, 1), (("swiglu", 2, 2, 2, 3, 2, 1, 1), 9, 2 * 40, 320, 3, 0),
         (("plain", 2, 2, 2, 2, 2, 1, 1), 3, 70, 192, 2, 0), (("plain", 2, 1, 16, 3, 2), 6, 40, 1536, 3, 1),
         (("plain", 2, 1, 16, 2, 2, 1), 11, 36, 1024, 2, 0), (("plain", 2, 1, 4, 3, 2, 1, 1), 2, 40, 256, 2, 1)],
    gpu=[(("plain", 4, 1, 8, 3, 2), 8, 17408, 5120, 264, 0), (("plain", 4, 2, 4, 3, 2), 16, 5120, 17408, 264, 1),
         (("swiglu", 4, 2, 4, 3, 2), 8, 34816, 5120, 264, 0), (("plain", 4, 1, 4, 4, 3), 4, 248320, 5120, 396, 0),
         (("plain", 4, 2, 4, 3, 2, 1, 1), 16, 17408, 5120, 264, 1), (("swiglu", 4, 2, 2, 4, 3, 1, 1), 12, 34816, 5120, 396, 0),
         (("plain", 2, 1, 16, 3, 2, 1), 5, 5120, 17408, 264, 1)]))
def test_gemv_mma4(dev, rng, build, t, n, k, blocks, accumulate):
    """The v4 builds (weights through per-warp cp.async rings of wide stages) vs NumPy: plain
    with a bias (and the residual when accumulate), swiglu into [T, I]. Small cases: N not a
    multiple of the block's rows, segments shorter and longer than the ring, groups shared by
    blocks and whole, T over 8, stages of 2, 4, 8 and 16 column blocks (4, 2, 1, 1/2 rows per copy), the
    ldmatrix builds (lm), the staged-x builds (xs: x split once per block, a barrier per stage)."""
    ops = dev.fresh()
    mode = build[0]
    w = rnd(rng, n, k).astype(BF16)
    x, bias = rnd(rng, t, k), rnd(rng, n)
    W = dev.up(w).view(np.uint16) if dev.on_gpu else w.view(np.uint16)
    X, B = dev.up(x), dev.up(bias)
    y = cpu.linear(x, w.astype(np.float32))
    if mode == "swiglu":
        want = cpu.swiglu(y)
        out0 = np.full((t, n // 2), np.nan, np.float32)
    else:
        out0 = rnd(rng, t, n)
        want = y + bias + (out0 if accumulate else 0)
    out, counter = _gemv4(ops, build, X, W, B, dev.up(out0), blocks, int(mode == "plain"), accumulate)
    close(dev.host(out), want, 2e-5)
    assert not dev.host(counter).any()
