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
