"""Norms, elementwise ops and the embedding lookup (kernels/norm.py, elementwise.py,
embedding.py) through CudaOps vs ops.cpu: one body per case, run on small shapes under the
CUDA simulator (tests/support/sim_runner.py) and on real model shapes on the GPU (-m gpu).
Scratch starts as NaN, so an unwritten output element fails `close`."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer_nb.kernels import norm as K_norm
from ninfer_nb.ops import cpu
from tests.kernels.device import DEVICE_MARKS, shapes
from tests.kernels.gpu_util import BF16, close, rnd

pytestmark = DEVICE_MARKS
TOL32 = 1e-5


@pytest.mark.parametrize("t,h", shapes(sim=[(3, 37)], gpu=[(1, 5120), (7, 2048), (33, 5120)]))
def test_elementwise(dev, rng, t, h):
    ops = dev.fresh()
    x, y = rnd(rng, t, h), rnd(rng, t, h)
    X, Y = dev.up(x), dev.up(y)
    close(dev.host(ops.add(X, Y)), cpu.add(x, y), TOL32)
    close(dev.host(ops.silu(X)), cpu.silu(x), TOL32)
    close(dev.host(ops.sigmoid(X)), cpu.sigmoid(x), TOL32)
    close(dev.host(ops.sigmoid_mul(X, Y)), cpu.sigmoid_mul(x, y), TOL32)


@pytest.mark.parametrize("t,inter,sizes", shapes(
    sim=[(3, 19, (5, 7, 2, 9)), (3, 300, (10, 13)), (2, 19, (100, 200, 50)), (1, 19, (4, 6, 3))],
    gpu=[(2048, 17408, (2048, 2048, 6144)), (17, 17408, (2048, 2048, 6144)), (3, 17408, (2048, 2048, 6144))]))
def test_row_elementwise(dev, rng, t, inter, sizes):
    """swiglu (flat grid-stride kernel: short and long rows) and split (2-D grid: one and two
    256-column blocks, 2-4 parts; one token: views into x); on the GPU the 27B MLP (2 x 17408)
    and GDN conv-output split (2048 | 2048 | 6144) shapes, times printed for T = 2048 (-s)."""
    ops = dev.fresh()
    gu, x = rnd(rng, t, 2 * inter), rnd(rng, t, sum(sizes))
    GU, X = dev.up(gu), dev.up(x)
    t_swiglu, o = dev.best_time(lambda: ops.swiglu(GU), reps=5, graph=True)
    close(dev.host(o), cpu.swiglu(gu), TOL32)
    t_split, parts = dev.best_time(lambda: ops.split(X, sizes), reps=5, graph=True)
    want = cpu.split(x, sizes)
    assert len(parts) == len(want)
    for got, w in zip(parts, want):
        np.testing.assert_array_equal(dev.host(got), w)
    if t == 2048:
        print(f"\nrow elementwise T=2048: swiglu {t_swiglu * 1e6:.1f} us, split {t_split * 1e6:.1f} us")


@pytest.mark.parametrize("v,h", shapes(sim=[(50, 40)], gpu=[(1000, 2048)]))
@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_embedding(dev, rng, v, h, dtype):
    """Rows of an fp32 or bf16 table, the first and last ids among them; exact."""
    ops = dev.fresh()
    table = rnd(rng, v, h).astype(dtype)
    ids = rng.integers(0, v, 9).astype(np.int32)
    ids[:2] = [0, v - 1]
    close(dev.host(ops.embedding(dev.up(table), dev.up(ids))), cpu.embedding(table.astype(np.float32), ids), 0)


@pytest.mark.parametrize("shape", shapes(
    sim=[(2, 3, 300), (1, 2500)],
    gpu=[(1, 5120), (1, 2048), (9, 2048), (3, 48, 128), (2, 24, 256), (4, 6, 64), (2, 3, 32), (2, 8192),
         (3, 20), (1, 3000), (2048, 5120), (64, 2048), (100, 8192)]))
def test_norms(dev, rng, shape):
    """rms_norm, add_rms_norm (new buffers, then in place as the decoder layers call it) and
    gated_rms_norm; on the GPU, the rows kernel against the 1024-thread block kernel for the
    27B prefill chunk and decode rows (times with -s)."""
    ops = dev.fresh()
    x, r, z = rnd(rng, *shape), rnd(rng, *shape), rnd(rng, *shape)
    w = rnd(rng, shape[-1])
    X, R, Z, W = dev.up(x), dev.up(r), dev.up(z), dev.up(w)
    close(dev.host(ops.rms_norm(X, W, 1e-6)), cpu.rms_norm(x, w, 1e-6), TOL32)
    o, res = ops.add_rms_norm(X, R, W, 1e-6)
    close(dev.host(res), x + r, TOL32)
    close(dev.host(o), cpu.rms_norm(x + r, w, 1e-6), TOL32)
    close(dev.host(ops.gated_rms_norm(X, Z, W, 1e-6)), cpu.gated_rms_norm(x, z, w, 1e-6), TOL32)
    ops.add_rms_norm(X, R, W, 1e-6, out=(X, R))            # in place: normed over x, sum over residual
    close(dev.host(R), x + r, TOL32)
    close(dev.host(X), cpu.rms_norm(x + r, w, 1e-6), TOL32)
    if dev.on_gpu and shape in ((2048, 5120), (1, 5120), (1, 2048)):
        X2, R2 = dev.up(x), dev.up(r)
        floor = K_norm.ROWS_MIN_R
        try:
            K_norm.ROWS_MIN_R = 1
            rows = dev.best_time(lambda: ops.add_rms_norm(X2, R2, W, 1e-6), graph=True)[0]
            o_rows = dev.host(ops.add_rms_norm(X2, R2, W, 1e-6)[0])
            K_norm.ROWS_MIN_R = 1 << 30
            block = dev.best_time(lambda: ops.add_rms_norm(X2, R2, W, 1e-6), graph=True)[0]
        finally:
            K_norm.ROWS_MIN_R = floor
        close(o_rows, cpu.rms_norm(x + r, w, 1e-6), TOL32)
        gbs = 4 * x.size * 4 / 1e9
        print(f"\nadd rms norm {shape[0]}x{shape[1]}: rows kernel {rows * 1e6:.1f} us ({gbs / rows:.0f} GB/s), "
              f"1024-thread block {block * 1e6:.1f} us ({gbs / block:.0f} GB/s)")


@pytest.mark.parametrize("rows,d", shapes(sim=[(2, 1024), (1, 2048)], gpu=[(2, 1024), (1, 2048), (64, 5120)]))
def test_add_rms_norm_rows(dev, rng, rows, d):
    """The rows add_rms_norm (float4 per thread, a block per row, every row count: ROWS_MIN_R
    is 1) with one and two float4 per thread, new buffers and in place."""
    assert K_norm.ROWS_MIN_R == 1 and d % (4 * K_norm.ROWS_THREADS) == 0
    ops = dev.fresh()
    x, r, w = rnd(rng, rows, d), rnd(rng, rows, d), rnd(rng, d)
    X, R, W = dev.up(x), dev.up(r), dev.up(w)
    o, res = ops.add_rms_norm(X, R, W, 1e-6)
    close(dev.host(res), x + r, TOL32)
    close(dev.host(o), cpu.rms_norm(x + r, w, 1e-6), TOL32)
    ops.add_rms_norm(X, R, W, 1e-6, out=(X, R))
    close(dev.host(R), x + r, TOL32)
    close(dev.host(X), cpu.rms_norm(x + r, w, 1e-6), TOL32)


@pytest.mark.parametrize("rows,d", shapes(
    sim=[(11, 128), (3, 100), (2, K_norm.WARP_ROW_MAX_D), (2, 300)],
    gpu=[(2048 * 48, 128), (48, 128), (13, 100), (5, 256), (7, 300), (3, 2500)]))
def test_gated_rms_norm_rows(dev, rng, rows, d):
    """The GDN output norm: one warp per row up to WARP_ROW_MAX_D (a ragged last block, D % 32
    != 0, the widest row it takes), one block per row above it; on the GPU a 2048-token 27B
    chunk's rows too, its time printed (-s)."""
    ops = dev.fresh()
    x, z, w = rnd(rng, rows, d), rnd(rng, rows, d), rnd(rng, d)
    X, Z, W = dev.up(x), dev.up(z), dev.up(w)
    secs, o = dev.best_time(lambda: ops.gated_rms_norm(X, Z, W, 1e-6), reps=5, graph=True)
    close(dev.host(o), cpu.gated_rms_norm(x, z, w, 1e-6), TOL32)
    if rows > 10000:
        gb = 3 * x.nbytes / 1e9
        print(f"\ngated rms norm {rows}x{d}: {secs * 1e6:.1f} us ({gb / secs:.0f} GB/s)")
