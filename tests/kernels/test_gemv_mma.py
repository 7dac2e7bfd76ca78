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


def _gemv(ops, X, W, B, t, n, ks):
    """gemv_mma_kernel (+ the reduce for ks > 1) as CudaOps._gemv_mma_into launches it."""
    out = ops.empty((t, n))
    part = ops.empty((ks, t, n) if ks > 1 else (1, 1, 1))               # unused when ks == 1
    ops._go(K.gemv_mma_kernel, (K.grid(n), ks), K.THREADS, X, W, B, out, part, np.int32(1))
    if ks > 1:
        ops._go(K.gemv_mma_reduce_kernel, 4, 256, part, B, out, np.int32(1))
    return out


@pytest.mark.parametrize("t,n,k,ks", shapes(
    sim=[(2, 20, 320, 1), (9, 17, 352, 3)],
    gpu=[(2, 17408, 5120, 0), (8, 17408, 5120, 0), (16, 17408, 5120, 0), (8, 5120, 17408, 0),
         (16, 5120, 6144, 0), (5, 12288, 5120, 0), (16, 4096, 2048, 0), (3, 40, 320, 3), (16, 248320, 5120, 0)]))
def test_gemv_mma(dev, rng, t, n, k, ks):
    """T tokens x an [N, K] bf16 weight with a bias vs NumPy on fp32 x (x enters as bf16 high
    part + remainder, so the error stays at fp32 accumulation's). Small cases: N not a multiple
    of 16 (rows past N load the last row, store nothing; whole warps past N), 1 or 3 K slices
    (uneven, partial UNROLL rounds), T > 8 (both token tiles). ks 0: CudaOps' choice
    (k_splits), timed on the GPU against the SIMT GEMV it replaces (-s)."""
    ops = dev.fresh()
    ks = ks or K.k_splits(n, k, ops.sm_count)
    w = rnd(rng, n, k).astype(BF16)
    x, bias = rnd(rng, t, k), rnd(rng, n)
    want = cpu.linear(x, w.astype(np.float32), bias)
    X, B = dev.up(x), dev.up(bias)
    W = dev.up(w).view(np.uint16) if dev.on_gpu else w.view(np.uint16)
    close(dev.host(_gemv(ops, X, W, B, t, n, ks)), want, 2e-5)
    if dev.on_gpu and n * k > 1 << 24:
        from ninfer_nb.kernels.linear import linear as K_lin

        def simt():
            o = ops.empty((t, n))
            ops._go(K_lin.gemv_bf16_kernel, (n + K_lin.GEMV_ROWS_PER_BLOCK - 1) // K_lin.GEMV_ROWS_PER_BLOCK,
                    256, X, W, B, o, np.int32(1), np.int32(1))

        tm = dev.best_time(lambda: _gemv(ops, X, W, B, t, n, ks), graph=True)[0]
        ts = dev.best_time(simt, graph=True)[0]
        print(f"\nGEMV T={t} {n}x{k} KS={ks}: tensor cores {tm * 1e6:.1f} us ({n * k * 2 / tm / 1e9:.0f} GB/s), "
              f"SIMT {ts * 1e6:.1f} us")
