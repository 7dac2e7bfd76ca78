"""Gated DeltaNet kernels (kernels/gdn/) through CudaOps vs ops.cpu, one body per case: small
shapes under the CUDA simulator (tests/support/sim_runner.py), model shapes on the GPU (-m gpu).
So far the causal conv1d (decode, parallel prefill, written split), the gates and the gated
delta rule (recurrent and chunked); the fused decode step, the prepare kernels and the
model-shape timings are still in sim_cases.py / test_kernels_gpu.py."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
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


# TF32 state / prepare products (gdn_chunked_mma.py, gdn_prepare_mma.py): operands rounded to
# 10 mantissa bits; ~5e-4 of the largest value seen
TOL_TF32 = 3e-3
_GPU_GDR = [(1, 16, 48, 128, 128), (64, 16, 48, 128, 128), (1, 16, 32, 128, 128), (37, 2, 4, 64, 96),
            (100, 2, 4, 64, 48), (5, 1, 1, 256, 32)]


@pytest.mark.parametrize("t,hk,hv,dk,dv,kind", shapes(
    sim=[(5, 1, 2, 32, 32, "recurrent"), (64, 1, 2, 32, 32, "simt"), (100, 1, 1, 32, 48, "simt"),
         (20, 1, 1, 32, 32, "simt"), (72, 1, 1, 16, 32, "mma_state"), (72, 1, 1, 16, 16, "mma_prepare")],
    gpu=[shape + (kind,) for kind in ("recurrent", "simt", "mma") for shape in _GPU_GDR]))
def test_gated_delta_rule(dev, rng, t, hk, hv, dk, dv, kind):
    """The recurrent kernel, and the chunked pair (C = 64: exactly one chunk with Hv / Hk = 2, a
    full chunk and a tail with a ragged Dv, one partial chunk; T <= 16 and Dk > 128 fall back to
    the recurrent kernel) from a nonzero state, vs the recurrent NumPy reference. kind "mma":
    state pass and prepare on TF32 tensor cores; "mma_state" / "mma_prepare": one of the two
    (in the simulator one block of Dk = 16, a full chunk then an 8-token tail: the state carries
    over in the accumulators, the tail's rows are masked)."""
    ops = dev.fresh()
    state = "mma" if kind in ("mma", "mma_state") else "simt"
    prepare = "mma" if kind in ("mma", "mma_prepare") else "simt"
    ops.choices = replace(ops.choices, gdn_state=state, gdn_prepare=prepare)
    q, k, v = rnd(rng, t, hk, dk), rnd(rng, t, hk, dk), rnd(rng, t, hv, dv)
    g = -np.abs(rnd(rng, t, hv, scale=0.5))                  # log decay per token, < 0
    beta = (1.0 / (1.0 + np.exp(-rnd(rng, t, hv)))).astype(np.float32)
    st = rnd(rng, hv, dv, dk, scale=0.1)                     # a nonzero initial state
    ST = dev.up(st)
    st_ref = st.copy()
    fn = ops.gated_delta_rule if kind == "recurrent" else ops.gated_delta_rule_chunked
    o = dev.host(fn(dev.up(q), dev.up(k), dev.up(v), dev.up(g), dev.up(beta), ST))
    ref = cpu.gated_delta_rule(q, k, v, g, beta, st_ref)
    tf32 = kind.startswith("mma") and t > 16 and dk <= 128
    close(o, ref, TOL_TF32 if tf32 else TOL32 * 10)
    close(dev.host(ST), st_ref, TOL_TF32 if tf32 else TOL32 * 10)
