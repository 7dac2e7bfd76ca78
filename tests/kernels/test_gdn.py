"""Gated DeltaNet kernels (kernels/gdn/) through CudaOps vs ops.cpu, one body per case: small
shapes under the CUDA simulator (tests/support/sim_runner.py), model shapes on the GPU (-m gpu).
The causal conv1d (decode, parallel prefill, written split), the gates, the gated delta rule
(recurrent and chunked) and the head decode kernel (gdn_decode_head_slots_kernel: slots,
per-token snapshots, S-independent bits); the cluster decode kernel, the prepare kernels and
the model-shape timings are in test_cases_gdn.py."""
from __future__ import annotations

import os
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


@pytest.mark.parametrize("n_seq,n,hk,hv,dk,dv,slotted", shapes(
    sim=[(1, 3, 1, 2, 32, 16, False), (3, 2, 2, 4, 16, 8, True)],
    gpu=[(b, 1, 16, hv, 128, 128, True) for hv in (48, 32) for b in (1, 8, 16)]
    + [(1, 1, 16, 48, 128, 128, False), (1, 4, 16, 48, 128, 128, False), (3, 2, 2, 6, 64, 96, True),
       (2, 1, 1, 2, 32, 40, True)]))
def test_gdn_decode_head(dev, rng, monkeypatch, n_seq, n, hk, hv, dk, dv, slotted):
    """gdn_decode_head_slots_kernel (a block per sequence and value head; the key head's q / k conv
    state written by the last of its Hv / Hk blocks to arrive) vs ops.cpu.gdn_decode: outputs,
    recurrent and conv state (slot pools: idle slots untouched), twice in a row (the arrival
    counts return to 0). GPU: timed against the cluster kernel (-s)."""
    from ninfer_nb.ops.cuda import gdn as cuda_gdn

    monkeypatch.setattr(cuda_gdn, "GDN_DECODE_KERNEL", "head")
    ops = dev.fresh()
    ops._gdn_buf = None                                          # it lived in the arena fresh() reset
    names: list[str] = []
    go = ops._go
    monkeypatch.setattr(ops, "_go", lambda spec, *a, **kw: (names.append(spec.name), go(spec, *a, **kw)))
    t, c, vd = n_seq * n, 2 * hk * dk + hv * dv, hv * dv
    n_slots = n_seq + 2 if slotted else 1
    slots = rng.permutation(n_slots)[:n_seq].astype(np.int32)
    conv_w = rnd(rng, c, 4, scale=0.5)
    al, dtb, nw = rnd(rng, hv, scale=0.5), rnd(rng, hv), rnd(rng, dv)
    conv_pool, state_pool = rnd(rng, n_slots, 3, c), rnd(rng, n_slots, hv, dv, dk, scale=0.1)
    conv_ref, state_ref = conv_pool.copy(), state_pool.copy()
    CP, SP = dev.up(conv_pool if slotted else conv_pool[0]), dev.up(state_pool if slotted else state_pool[0])
    consts = [dev.up(x) for x in (conv_w, al, dtb)]
    NW, SL = dev.up(nw), dev.up(slots)

    def call(ins):
        return ops.gdn_decode(*ins, CP, *consts, SP, NW, 1e-6, hk, slots=SL if slotted else None)

    for _ in range(2):
        mixed, z, a, b = rnd(rng, t, c), rnd(rng, t, vd), rnd(rng, t, hv), rnd(rng, t, hv)
        a[0, 0] = 25.0                                           # a > 20: softplus is the identity
        if slotted:
            want = cpu.gdn_decode(mixed, z, a, b, conv_ref, conv_w, al, dtb, state_ref, nw, 1e-6, hk, slots=slots)
        else:
            want = cpu.gdn_decode(mixed, z, a, b, conv_ref[0], conv_w, al, dtb, state_ref[0], nw, 1e-6, hk)
        ins = [dev.up(x) for x in (mixed, z, a, b)]
        got = call(ins)
        close(dev.host(got), want, 1e-4)
        close(dev.host(SP), state_ref if slotted else state_ref[0], 1e-4)
        close(dev.host(CP), conv_ref if slotted else conv_ref[0], 1e-5)
    assert names == ["gdn_decode_head_slots_kernel"] * 2
    assert not dev.host(ops._gdn_buf)[2:].any()
    if slotted:
        idle = [s for s in range(n_slots) if s not in slots]
        assert np.array_equal(dev.host(SP)[idle], state_pool[idle])
        assert np.array_equal(dev.host(CP)[idle], conv_pool[idle])
    if dev.on_gpu and dk == 128:
        mib = 2 * n_seq * hv * dv * dk * 4 / 2**20                # state read + written
        times = []
        for sp in (0, 2, 4):                                      # 0: the automatic pick
            monkeypatch.setattr(cuda_gdn, "GDN_HEAD_SPLIT", sp)
            us = dev.best_time(lambda: call(ins), graph=True)[0] * 1e6
            times.append(f"S={sp or 'auto'} {us:.1f}" + (f" ({mib / us * 1.048576:.2f} TB/s)" if not sp else ""))
        if os.environ.get("GDN_TIME_CLUSTER", "1") == "1":
            monkeypatch.setattr(cuda_gdn, "GDN_DECODE_KERNEL", "cluster")
            times.append(f"cluster {dev.best_time(lambda: call(ins), graph=True)[0] * 1e6:.1f}")
        print(f"\ngdn_decode B={n_seq} T/B={n} Hv={hv} us: head " + ", ".join(times))


@pytest.mark.parametrize("n_seq,n,hk,hv,dk", shapes(sim=[], gpu=[(1, 1, 16, 48, 128), (2, 4, 16, 48, 128),
                                                                 (5, 1, 16, 32, 128), (3, 2, 2, 6, 64)]))
def test_gdn_decode_head_splits_bitwise(dev, rng, monkeypatch, n_seq, n, hk, hv, dk):
    """The head kernel with S = 1, 2 and 4 blocks per head (clusters; S = 1 needs Dk <= 64)
    gives the same bits: outputs, recurrent and conv state (every sum is taken in one order),
    so the batch size, which picks S, never changes a sequence's tokens."""
    from ninfer_nb.kernels.gdn import gdn_decode as K_gdd
    from ninfer_nb.ops.cuda import gdn as cuda_gdn

    monkeypatch.setattr(cuda_gdn, "GDN_DECODE_KERNEL", "head")
    dv = 128
    t, c, vd = n_seq * n, 2 * hk * dk + hv * dv, hv * dv
    slots = rng.permutation(n_seq + 1)[:n_seq].astype(np.int32)
    conv_w = rnd(rng, c, 4, scale=0.5)
    al, dtb, nw = rnd(rng, hv, scale=0.5), rnd(rng, hv), rnd(rng, dv)
    conv_pool, state_pool = rnd(rng, n_seq + 1, 3, c), rnd(rng, n_seq + 1, hv, dv, dk, scale=0.1)
    mixed, z, a, b = rnd(rng, t, c), rnd(rng, t, vd), rnd(rng, t, hv), rnd(rng, t, hv)
    got = []
    for sp in [sp for sp in K_gdd.HEAD_SPLITS if K_gdd.head_supported(hv, hk, dk, dv, 4, sp)]:
        monkeypatch.setattr(cuda_gdn, "GDN_HEAD_SPLIT", sp)
        ops = dev.fresh()
        ops._gdn_buf = None                                      # it lived in the arena fresh() reset
        CP, SP = dev.up(conv_pool), dev.up(state_pool)
        o = ops.gdn_decode(*[dev.up(x) for x in (mixed, z, a, b)], CP, *[dev.up(x) for x in (conv_w, al, dtb)], SP,
                           dev.up(nw), 1e-6, hk, slots=dev.up(slots))
        got.append((dev.host(o), dev.host(SP), dev.host(CP)))
    want = cpu.gdn_decode(mixed, z, a, b, conv_pool.copy(), conv_w, al, dtb, state_pool.copy(), nw, 1e-6, hk,
                          slots=slots)
    close(got[0][0], want, 1e-4)
    assert len(got) >= 2
    for other in got[1:]:
        for x, y in zip(got[0], other):
            assert np.array_equal(x.view(np.uint32), y.view(np.uint32))


@pytest.mark.parametrize("n_seq,n,hk,hv,dk,dv", shapes(sim=[(2, 3, 1, 2, 32, 16)],
                                                        gpu=[(1, 4, 16, 48, 128, 128), (4, 4, 16, 32, 128, 128)]))
def test_gdn_decode_head_snapshots(dev, rng, monkeypatch, n_seq, n, hk, hv, dk, dv):
    """gdn_decode(..., snapshots=) on the head kernel (a speculative verify of n tokens per
    sequence keeping the states rollback needs): slot snapshots[t] holds the recurrent and conv
    state after token t exactly as gdn_decode run up to that token leaves its slot; tokens
    marked -1 write nothing; outputs and the sequences' own slots as without snapshots. GPU:
    prints the time with and without the n - 1 snapshots per sequence (-s)."""
    from ninfer_nb.ops.cuda import gdn as cuda_gdn

    monkeypatch.setattr(cuda_gdn, "GDN_DECODE_KERNEL", "head")
    ops = dev.fresh()
    ops._gdn_buf = None                                          # it lived in the arena fresh() reset
    t, c, vd = n_seq * n, 2 * hk * dk + hv * dv, hv * dv
    n_slots = n_seq * n + 1
    slots = np.arange(n_seq, dtype=np.int32)[::-1].copy()
    snaps = np.full(t, -1, np.int32)                              # the last token of each: none (its slot)
    spare = iter(range(n_seq, n_slots))
    for i in range(n_seq):
        for j in range(n - 1):
            snaps[i * n + j] = next(spare)
    conv_w = rnd(rng, c, 4, scale=0.5)
    al, dtb, nw = rnd(rng, hv, scale=0.5), rnd(rng, hv), rnd(rng, dv)
    conv_pool, state_pool = rnd(rng, n_slots, 3, c), rnd(rng, n_slots, hv, dv, dk, scale=0.1)
    mixed, z, a, b = rnd(rng, t, c), rnd(rng, t, vd), rnd(rng, t, hv), rnd(rng, t, hv)
    conv_ref, state_ref = conv_pool.copy(), state_pool.copy()
    want = np.empty((t, vd), np.float32)
    for i, slot in enumerate(slots):                              # token by token on the reference
        for j in range(n):
            r = slice(i * n + j, i * n + j + 1)
            want[r] = cpu.gdn_decode(mixed[r], z[r], a[r], b[r], conv_ref[slot], conv_w, al, dtb, state_ref[slot],
                                     nw, 1e-6, hk)
            if snaps[i * n + j] >= 0:
                conv_ref[snaps[i * n + j]], state_ref[snaps[i * n + j]] = conv_ref[slot], state_ref[slot]
    CP, SP = dev.up(conv_pool), dev.up(state_pool)
    ins = [dev.up(x) for x in (mixed, z, a, b)]
    args = (*ins, CP, *[dev.up(x) for x in (conv_w, al, dtb)], SP, dev.up(nw), 1e-6, hk)
    got = ops.gdn_decode(*args, slots=dev.up(slots), snapshots=dev.up(snaps))
    close(dev.host(got), want, 1e-4)
    close(dev.host(SP), state_ref, 1e-4)
    close(dev.host(CP), conv_ref, 1e-5)
    if dev.on_gpu:
        SL, SN = dev.up(slots), dev.up(snaps)
        with_s = dev.best_time(lambda: ops.gdn_decode(*args, slots=SL, snapshots=SN), graph=True)[0] * 1e6
        without = dev.best_time(lambda: ops.gdn_decode(*args, slots=SL), graph=True)[0] * 1e6
        print(f"\ngdn_decode B={n_seq} T/B={n} Hv={hv}: {n - 1} snapshots per sequence {with_s:.1f} us, "
              f"none {without:.1f} us")


def test_gdn_decode_kernel_choice(dev, rng):
    """GDN_DECODE_KERNEL "auto" (the default): the head kernel for rounds of at least
    GDN_HEAD_MIN_SEQS sequences and whenever snapshots are asked for; one sequence (the
    one-sequence path, a verify) and smaller rounds keep the cluster kernel (GPU) or the
    three-op path (simulator). "head" / "cluster" force one."""
    from ninfer_nb.ops.cuda import gdn as cuda_gdn

    assert cuda_gdn.GDN_DECODE_KERNEL == "auto"
    ops = dev.fresh()
    hk, hv, dk, dv = 1, 2, 32, 16
    conv_w = dev.up(rnd(rng, 2 * hk * dk + hv * dv, 4, scale=0.5))
    low = cuda_gdn.GDN_HEAD_MIN_SEQS - 1
    assert [ops._head_kernel(n, hv, hk, dk, dv, conv_w) for n in (1, low, low + 1, 16)] == [False, False, True, True]
    assert ops._head_kernel(1, hv, hk, dk, dv, conv_w, snapshots=np.zeros(1, np.int32))
    assert not ops._head_kernel(1, hv, hk, 96, dv, conv_w, snapshots=np.zeros(1, np.int32))   # Dk 96: no head
