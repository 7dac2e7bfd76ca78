"""Gated DeltaNet kernels (kernels/gdn/): the fused decode step, the recurrent rule with raw
gates, the chunked WY pair and its TF32 prepare / state kernels, through CudaOps vs ops.cpu, one
body per case: small shapes under the CUDA simulator (tests/support/sim_runner.py), the
Qwen3.6-27B (Hv = 48) / 35B (Hv = 32) shapes on the GPU (-m gpu), times printed (-s). (The conv,
gates and rule by shape: test_gdn.py.)"""
from __future__ import annotations

import numpy as np
import pytest

from ninfer_nb.kernels.gdn import gdn_chunked as K_gdc
from ninfer_nb.kernels.gdn import gdn_decode as K_gdd
from ninfer_nb.kernels.gdn import gdn_prepare_mma as K_gdp
from ninfer_nb.ops import cpu
from ninfer_nb.ops.cuda import gdn as cuda_gdn
from tests.kernels.case_util import (
    GPU_ONLY,
    TOL32,
    TOL_F32,
    TOL_TF32,
    choose,
    gpu_only,
    launched,
    rel_err,
    wall_time,
)
from tests.kernels.device import DEVICE_MARKS, shapes
from tests.kernels.gpu_util import close, rnd

pytestmark = DEVICE_MARKS


def _qkvgb(rng, t, hk, hv, dk, dv):
    q, k, v = rnd(rng, t, hk, dk), rnd(rng, t, hk, dk), rnd(rng, t, hv, dv)
    g = -np.abs(rnd(rng, t, hv, scale=0.5))
    beta = (1.0 / (1.0 + np.exp(-rnd(rng, t, hv)))).astype(np.float32)
    return q, k, v, g, beta


@pytest.mark.parametrize("t,hk,hv,dk,dv", shapes(sim=[(20, 1, 2, 16, 16)],
                                                 gpu=[(2048, 16, 48, 128, 128), (2000, 16, 48, 128, 128)]))
def test_gdr_prepare_mma_vs_simt_kernel(dev, rng, t, hk, hv, dk, dv, monkeypatch):
    """gdc_prepare_mma_kernel's six outputs (W, Q', U, ks, ec, O_intra) against
    gdc_prepare_kernel's (fp32 SIMT): TF32 operands, <= 7e-4 of the largest value seen, bound
    3e-3. Simulator: one partial chunk (T = 20: rows past T zero), Hv / Hk = 2 (the Gram tiles
    kept across the V heads), Dk = Dv = 16 (one n8 tile pair of one column group; the simulated
    mma costs ~25 ms a call). GPU: the 27B GDN shape (T = 2000: a 16-token last chunk), the
    chunked pair with the TF32 kernels against the recurrent NumPy reference, and the GPU time
    of either prepare kernel alone (-s)."""
    ops = dev.fresh()
    q, k, v, g, beta = _qkvgb(rng, t, hk, hv, dk, dv)
    Q, K, V, G, B = dev.up(q), dev.up(k), dev.up(v), dev.up(g), dev.up(beta)
    nc = (t + K_gdc.C - 1) // K_gdc.C

    def prepare(kind):
        bufs = [ops.empty(shape) for shape in                 # NaN-filled scratch
                ((hv, t, dk), (hv, t, dk), (hv, t, dv), (hv, t), (hv, nc), (t, hv, dv))]
        if kind == "mma":
            ops._go(K_gdp.gdc_prepare_mma_kernel, (nc, hk), K_gdp.THREADS, Q, K, V, G, B, *bufs,
                    smem=K_gdp.SMEM_BYTES)
        else:
            ops._go(K_gdc.gdc_prepare_kernel, (nc, hk), K_gdc.PREP_THREADS, Q, K, V, G, B, *bufs)
        return bufs

    outs = {kind: [dev.host(b) for b in prepare(kind)] for kind in ("simt", "mma")}
    errs = []
    for name, a, b in zip(("W", "Q'", "U", "ks", "ec", "O_intra"), outs["mma"], outs["simt"]):
        errs.append(f"{name} {rel_err(a, b):.2e}")
        close(a, b, TOL_TF32)
    if not dev.on_gpu:
        return
    times = {kind: dev.best_time(lambda kind=kind: prepare(kind), graph=True)[0] for kind in ("simt", "mma")}
    choose(ops, monkeypatch, gdn_state="mma", gdn_prepare="mma")
    st = rnd(rng, hv, dv, dk, scale=0.1)
    ST = dev.up(st)
    o = dev.host(ops.gated_delta_rule_chunked(Q, K, V, G, B, ST))
    st_ref = st.copy()
    ref = cpu.gated_delta_rule(q, k, v, g, beta, st_ref)
    print(f"\ngdn prepare T={t} Hv={hv}: SIMT {times['simt'] * 1e3:.3f} ms, TF32 mma {times['mma'] * 1e3:.3f} ms; "
          f"error / max |value| vs the SIMT kernel: {', '.join(errs)}; chunked pair (both TF32) vs recurrent: "
          f"output {rel_err(o, ref):.2e}, state {rel_err(dev.host(ST), st_ref):.2e}")
    close(o, ref, TOL_TF32)
    close(dev.host(ST), st_ref, TOL_TF32)


@GPU_ONLY
@pytest.mark.parametrize("t,hk,hv,dk,dv", gpu_only([(100, 2, 4, 64, 48), (77, 1, 3, 48, 36), (130, 1, 2, 128, 160)]))
def test_gdn_prepare_mma_ragged(dev, rng, t, hk, hv, dk, dv, monkeypatch):
    """The TF32 prepare kernel's edges against the fp32 pair: partial last chunks, Dk < 128 with a
    partial 32-column group (48), Dv not a multiple of 8 (36), Dv > 128 (two V column passes)."""
    ops = dev.fresh()
    q, k, v, g, beta = _qkvgb(rng, t, hk, hv, dk, dv)
    st = rnd(rng, hv, dv, dk, scale=0.1)
    res = {}
    for prep in ("simt", "mma"):
        choose(ops, monkeypatch, gdn_state="simt", gdn_prepare=prep)
        ST = dev.up(st)
        res[prep] = (dev.host(ops.gated_delta_rule_chunked(dev.up(q), dev.up(k), dev.up(v), dev.up(g), dev.up(beta),
                                                           ST)), dev.host(ST))
    st_ref = st.copy()
    ref = cpu.gated_delta_rule(q, k, v, g, beta, st_ref)
    close(res["simt"][0], ref, TOL_F32)
    close(res["mma"][0], ref, TOL_TF32)
    close(res["mma"][1], st_ref, TOL_TF32)


@GPU_ONLY
@pytest.mark.parametrize("t,hk,hv,dk,dv", gpu_only([(1, 16, 48, 128, 128), (3, 16, 32, 128, 128), (2, 2, 4, 64, 96),
                                           (1, 16, 32, 128, 128), (1, 1, 2, 256, 40)]))
def test_gated_delta_rule_raw_gates(dev, rng, t, hk, hv, dk, dv):
    """The decode form: gates computed inside the recurrent kernel from the raw a / b projections
    (including a > 20, where softplus is the identity), against ops.cpu; prints the time at the
    27B / 35B decode shapes (-s)."""
    ops = dev.fresh()
    q, k, v = rnd(rng, t, hk, dk), rnd(rng, t, hk, dk), rnd(rng, t, hv, dv)
    a, b = rnd(rng, t, hv, scale=2.0), rnd(rng, t, hv)
    a[0, 0] = 25.0
    al, dtb = rnd(rng, hv, scale=0.5), rnd(rng, hv)
    st = rnd(rng, hv, dv, dk, scale=0.1)
    ST, st_ref = dev.up(st), st.copy()
    args = (dev.up(q), dev.up(k), dev.up(v), dev.up(a), dev.up(b), dev.up(al), dev.up(dtb))
    o = ops.gated_delta_rule_raw_gates(*args, ST)
    ref = cpu.gated_delta_rule_raw_gates(q, k, v, a, b, al, dtb, st_ref)
    close(dev.host(o), ref, TOL_F32)
    close(dev.host(ST), st_ref, TOL_F32)
    if t == 1 and dk == 128:                       # the state is updated in place by every timed call
        best, _ = dev.best_time(lambda: ops.gated_delta_rule_raw_gates(*args, ST), reps=5, graph=True)
        print(f"\ngated delta rule decode Hv={hv} Dk={dk} Dv={dv}: {best * 1e6:.1f} us")


@GPU_ONLY
@pytest.mark.parametrize("t,hk,hv,dk,dv", gpu_only([(1, 16, 32, 128, 128), (1, 16, 48, 128, 128), (3, 16, 32, 128, 128),
                                           (2, 2, 6, 64, 96), (1, 1, 2, 32, 40), (5, 4, 4, 96, 128),
                                           (1, 1, 8, 32, 128)]))
def test_gdn_decode(dev, rng, t, hk, hv, dk, dv, monkeypatch):
    """ops.gdn_decode (conv + SiLU, gated delta rule with raw gates, gated norm; the decode GDN
    middle) against ops.cpu.gdn_decode: the output, the recurrent state and the conv state. The
    inputs are views into one projection row, as the decoder passes them. Clusters of 4 to 12
    blocks (Hv / Hk = 1-3 heads of 1-4 row slices) share a key head's conv state and each head's
    norm; Hv / Hk = 8 with 4 slices (32 blocks) is past the cluster limit: the three-launch path.
    Prints the fused kernel against the three launches at the 35B / 27B shapes (-s)."""
    ops = dev.fresh()
    qk, vd = hk * dk, hv * dv
    c = 2 * qk + vd
    proj = rnd(rng, t, c + vd + 2 * hv)                           # [T, q | k | v | z | a | b]
    proj[0, c + vd] = 25.0                                        # a > 20: softplus is the identity
    conv_w, conv_st = rnd(rng, c, 4, scale=0.5), rnd(rng, 3, c)
    al, dtb, nw = rnd(rng, hv, scale=0.5), rnd(rng, hv), rnd(rng, dv)
    st = rnd(rng, hv, dv, dk, scale=0.1)
    mixed, z, a, b = (proj[:, :c], proj[:, c:c + vd], proj[:, c + vd:c + vd + hv], proj[:, c + vd + hv:])
    st_ref, conv_ref = st.copy(), conv_st.copy()
    ref = cpu.gdn_decode(mixed.copy(), z.copy(), a.copy(), b.copy(), conv_ref, conv_w, al, dtb, st_ref, nw,
                         1e-6, hk)
    names = launched(ops, monkeypatch)
    ST, CS, NW = dev.up(st), dev.up(conv_st), dev.up(nw)
    consts = (dev.up(conv_w), dev.up(al), dev.up(dtb))
    parts = ops.split(dev.up(proj), (c, vd, hv, hv))

    def call():
        return ops.gdn_decode(*parts, CS, *consts, ST, NW, 1e-6, hk)

    o = call()
    fused = K_gdd.supported(hv, hk, dk, dv, 4)
    assert names[(t > 1):] == (["gdn_decode_kernel"] if fused else
                               ["causal_conv1d_kernel", "gdr_recurrent_kernel", "gated_rms_norm_warp_kernel"])
    close(dev.host(o), ref, TOL_F32)
    close(dev.host(ST), st_ref, TOL_F32)
    close(dev.host(CS), conv_ref, TOL32)
    if t == 1 and dk == 128:                       # the states are updated in place by every timed call
        one, _ = dev.best_time(call, reps=5, graph=True)
        monkeypatch.setattr(cuda_gdn, "GDN_DECODE_FUSED", False)
        three, _ = dev.best_time(call, reps=5, graph=True)
        print(f"\nGDN decode middle Hv={hv} Dk={dk} Dv={dv}: conv + rule + norm {three * 1e6:.1f} us, "
              f"fused {one * 1e6:.1f} us")


@GPU_ONLY
@pytest.mark.parametrize("state_kernel", gpu_only(["simt", "mma"]))
@pytest.mark.parametrize("t,hk,hv", gpu_only([(1024, 16, 48), (1000, 16, 48), (777, 16, 32)]))
def test_gated_delta_rule_chunked_model_dims(dev, rng, t, hk, hv, state_kernel, monkeypatch):
    """Chunked WY kernels (kernels/gdn/gdn_chunked.py, the TF32 state pass of gdn_chunked_mma.py)
    at the 27B (Hv = 48) and 35B-A3B (Hv = 32) GDN shapes, Dk = Dv = 128, vs the recurrent NumPy
    reference: outputs and final state (errors printed with -s)."""
    dk = dv = 128
    ops = dev.fresh()
    choose(ops, monkeypatch, gdn_state=state_kernel, gdn_prepare=state_kernel)   # both TF32, or both fp32
    q, k, v, g, beta = _qkvgb(rng, t, hk, hv, dk, dv)
    st = rnd(rng, hv, dv, dk, scale=0.1)
    ST = dev.up(st)
    st_ref = st.copy()
    o = dev.host(ops.gated_delta_rule_chunked(dev.up(q), dev.up(k), dev.up(v), dev.up(g), dev.up(beta), ST))
    ref = cpu.gated_delta_rule(q, k, v, g, beta, st_ref)
    print(f"\ngated delta rule chunked ({state_kernel}) T={t} Hv={hv}: error / max |value|: "
          f"output {rel_err(o, ref):.2e}, state {rel_err(dev.host(ST), st_ref):.2e}")
    tol = TOL_TF32 if state_kernel == "mma" else TOL_F32
    close(o, ref, tol)
    close(dev.host(ST), st_ref, tol)


@GPU_ONLY
def test_gated_delta_rule_chunked_vs_recurrent_timing(dev, rng, monkeypatch):
    """27B GDN layer, T = 8192: the recurrent kernel and the chunked pair with each state pass
    agree; prints the times (-s), and the prepare kernel's alone."""
    t, hk, hv, dk, dv = 8192, 16, 48, 128, 128
    ops = dev.fresh()
    q, k, v, g, beta = (dev.up(a) for a in _qkvgb(rng, t, hk, hv, dk, dv))
    st = rnd(rng, hv, dv, dk, scale=0.1)
    times = {}
    res = {}
    for name in ("recurrent", "simt", "mma"):
        if name != "recurrent":                            # the recurrent kernel takes no choice
            choose(ops, monkeypatch, gdn_state=name, gdn_prepare="simt" if name == "simt" else "mma")
        fn = ops.gated_delta_rule if name == "recurrent" else ops.gated_delta_rule_chunked
        ST = dev.up(st)
        res[name] = (dev.host(fn(q, k, v, g, beta, ST)), dev.host(ST))     # (compiles)

        state = dev.up(st)

        def timed(fn=fn, state=state):             # its output's scratch handed back after each call
            with ops.scope():
                fn(q, k, v, g, beta, state)

        times[name] = wall_time(dev, timed)
    nc = (t + K_gdc.C - 1) // K_gdc.C
    bufs = (ops.empty((hv, t, dk)), ops.empty((hv, t, dk)), ops.empty((hv, t, dv)), ops.empty((hv, t)),
            ops.empty((hv, nc)), ops.empty((t, hv, dv)))
    prep = wall_time(dev, lambda: ops._go(K_gdc.gdc_prepare_kernel, (nc, hk), K_gdc.PREP_THREADS, q, k, v, g, beta,
                                          *bufs))
    print(f"\ngated delta rule T={t} Hv={hv}: recurrent {times['recurrent'] * 1e3:.2f} ms, "
          f"chunked with the SIMT state pass {times['simt'] * 1e3:.2f} ms, with the TF32 state pass "
          f"{times['mma'] * 1e3:.2f} ms (prepare kernel {prep * 1e3:.2f} ms); TF32 error / max |value|: "
          f"output {rel_err(res['mma'][0], res['recurrent'][0]):.2e}, "
          f"state {rel_err(res['mma'][1], res['recurrent'][1]):.2e}")
    close(res["simt"][0], res["recurrent"][0], TOL_F32)
    close(res["simt"][1], res["recurrent"][1], TOL_F32)
    close(res["mma"][0], res["recurrent"][0], TOL_TF32)
    close(res["mma"][1], res["recurrent"][1], TOL_TF32)
