"""Gated DeltaNet kernels (kernels/gdn/) through CudaOps vs ops.cpu, one body per case: small
shapes under the CUDA simulator (tests/support/sim_runner.py), model shapes on the GPU (-m gpu).
So far the causal conv1d (decode, parallel prefill, written split) and the gates; the gated
delta rule cases are still in sim_cases.py / test_kernels_gpu.py."""
from __future__ import annotations

import pytest

from ninfer_nb.ops import cpu
from tests.kernels.device import DEVICE_MARKS, shapes
from tests.kernels.gpu_util import close, rnd

pytestmark = DEVICE_MARKS
TOL32 = 1e-5


@pytest.mark.parametrize("t,c,kw", shapes(
    sim=[(5, 70, 4), (40, 70, 4), (35, 70, 2)],
    gpu=[(1, 10240, 4), (100, 10240, 4), (7, 300, 3), (2048, 10240, 4), (33, 300, 2)]))
def test_causal_conv1d(dev, rng, t, c, kw):
    """Decode-sized T (one thread per channel) and prefill chunks (the parallel tokens kernel,
    then the state roll); the conv state is updated in place exactly as NumPy's."""
    ops = dev.fresh()
    x, w, st = rnd(rng, t, c), rnd(rng, c, kw), rnd(rng, kw - 1, c)
    ST = dev.up(st)
    st_ref = st.copy()
    close(dev.host(ops.causal_conv1d(dev.up(x), ST, dev.up(w))), cpu.causal_conv1d(x, st_ref, w), TOL32)
    close(dev.host(ST), st_ref, 0)


@pytest.mark.parametrize("t,sizes", shapes(
    sim=[(40, (16, 16, 38)), (40, (30, 40)), (5, (16, 16, 38))],
    gpu=[(2048, (2048, 2048, 6144)), (100, (100, 100, 100)), (5, (2048, 2048, 6144))]))
def test_causal_conv1d_split(dev, rng, t, sizes):
    """The GDN's conv written straight into its q | k | v parts (part boundaries inside a
    128-channel block too; 5 tokens: conv, then split) vs NumPy; on the GPU timed against
    conv + split for a 2048-token chunk (-s)."""
    ops = dev.fresh()
    c = sum(sizes)
    x, w, st = rnd(rng, t, c), rnd(rng, c, 4), rnd(rng, 3, c)
    X, W, ST = dev.up(x), dev.up(w), dev.up(st)
    st_ref = st.copy()
    got = ops.causal_conv1d_split(X, ST, W, sizes)
    want = cpu.causal_conv1d_split(x, st_ref, w, sizes)
    assert [tuple(g.shape) for g in got] == [(t, n) for n in sizes]
    for g, r in zip(got, want):
        close(dev.host(g), r, TOL32)
    close(dev.host(ST), st_ref, 0)
    if dev.on_gpu and t == 2048:
        fused = dev.best_time(lambda: ops.causal_conv1d_split(X, ST, W, sizes), graph=True)[0]
        pair = dev.best_time(lambda: ops.split(ops.causal_conv1d(X, ST, W), sizes), graph=True)[0]
        print(f"\nconv1d split T={t} C={c}: written split {fused * 1e6:.1f} us, conv + split {pair * 1e6:.1f} us")


@pytest.mark.parametrize("t,hv", shapes(sim=[(4, 6)], gpu=[(1, 48), (100, 32)]))
def test_gdn_gates(dev, rng, t, hv):
    ops = dev.fresh()
    a, b = rnd(rng, t, hv, scale=10.0), rnd(rng, t, hv)
    al, dtb = rnd(rng, hv), rnd(rng, hv)
    g, beta = ops.gdn_gates(dev.up(a), dev.up(b), dev.up(al), dev.up(dtb))
    gr, br = cpu.gdn_gates(a, b, al, dtb)
    close(dev.host(g), gr, TOL32)
    close(dev.host(beta), br, TOL32)
