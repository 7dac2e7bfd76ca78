"""Dense linear layers (kernels/linear/) through CudaOps vs ops.cpu, one body per case: small
shapes under the CUDA simulator (tests/support/sim_runner.py), model shapes on the GPU (-m gpu).
`linear` itself (GEMV, split-K, tensor-core and SIMT GEMM paths by shape, bf16 and fp32 weights,
with and without bias); the one-token builds, fused and split variants: test_cases_linear.py."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer_nb.ops import cpu
from tests.kernels.device import DEVICE_MARKS, shapes
from tests.kernels.gpu_util import BF16, close, rnd, rnd_bf16

pytestmark = DEVICE_MARKS
TOL32 = 1e-5
_GPU_NK = [(17408, 5120), (5120, 17408), (2048, 4096), (1000, 100), (77, 40),
           (333, 1288), (5, 2056)]   # unrolled GEMV loop + its tail


@pytest.mark.parametrize("n,k,t,wdtype", shapes(
    sim=[(70, 40, 5, np.float32), (70, 40, 5, BF16)],
    gpu=[(n, k, t, BF16) for n, k in _GPU_NK for t in (1, 4, 7, 16, 17, 100)
         if n * k <= 40_000_000 or t in (1, 7, 100)] + [(300, 130, 5, np.float32)]))
def test_linear(dev, rng, n, k, t, wdtype):
    """x [T, K] @ w [N, K]^T (+ b); bf16 weights hold bf16-exact values, so the reference on
    their fp32 copy measures the kernel. Prefill chunks on the tensor cores (T > 16, K % 64 ==
    0) round x to bf16 by design, and the reference does too."""
    ops = dev.fresh()
    w = rnd_bf16(rng, n, k) if wdtype is BF16 else rnd(rng, n, k)
    x, b = rnd(rng, t, k), rnd(rng, n)
    W, X, B = dev.up(w), dev.up(x), dev.up(b)
    tensor_cores = dev.on_gpu and wdtype is BF16 and t > 16 and k % 64 == 0
    xr = x.astype(BF16).astype(np.float32) if tensor_cores else x
    ref = cpu.linear(xr, w.astype(np.float32), b)
    tol = TOL32 * 10 if dev.on_gpu and wdtype is BF16 else TOL32
    close(dev.host(ops.linear(X, W, B)), ref, tol)
    close(dev.host(ops.linear(X, W)), ref - b, tol)
