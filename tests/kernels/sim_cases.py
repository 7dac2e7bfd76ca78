"""Simulator cases (run by test_simulator.py in a subprocess with NUMBA_ENABLE_CUDASIM=1):
CudaOps over NumPy arrays vs ops.cpu, tiny shapes, for the simulator-safe kernels."""
from __future__ import annotations

import os

assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "run through test_simulator.py"

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from ninfer_nb.kernels import sampling as S  # noqa: E402
from ninfer_nb.ops import cpu  # noqa: E402
from ninfer_nb.ops.cuda import CudaOps, HostArena, SimStream  # noqa: E402

BF16 = ml_dtypes.bfloat16


@pytest.fixture
def ops() -> CudaOps:
    return CudaOps(HostArena(), SimStream(), persistent=HostArena())


def rnd(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def close(a, b, tol=1e-5):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert np.isfinite(a).all(), "NaN/inf in kernel output (unwritten element?)"
    err = np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)
    assert err <= tol, f"relative error {err:.3e} > {tol}"


def test_elementwise(ops):
    rng = np.random.default_rng(1)
    x, y = rnd(rng, 3, 37), rnd(rng, 3, 37)
    close(ops.add(x, y), cpu.add(x, y))
    close(ops.silu(x), cpu.silu(x))
    close(ops.sigmoid(x), cpu.sigmoid(x))
    close(ops.sigmoid_mul(x, y), cpu.sigmoid_mul(x, y))
    gu = rnd(rng, 3, 2 * 19)
    close(ops.swiglu(gu), cpu.swiglu(gu))
    for rows, sizes in ((3, (5, 7, 2, 9)), (3, (10, 13)), (1, (4, 6, 3))):  # copy, copy, views
        p = rnd(rng, rows, sum(sizes))
        got, want = ops.split(p, sizes), cpu.split(p, sizes)
        assert len(got) == len(sizes)
        for g, w in zip(got, want):
            assert np.array_equal(np.asarray(g), w)


def test_embedding(ops):
    rng = np.random.default_rng(2)
    table = rnd(rng, 50, 40)
    ids = np.array([3, 0, 49, 3], dtype=np.int32)
    close(ops.embedding(table, ids), cpu.embedding(table, ids))
    tb = table.astype(BF16)
    close(ops.embedding(tb, ids), cpu.embedding(tb.astype(np.float32), ids), 0)


def test_norms(ops):
    rng = np.random.default_rng(3)
    x, r, z = rnd(rng, 2, 3, 300), rnd(rng, 2, 3, 300), rnd(rng, 2, 3, 300)
    w = rnd(rng, 300)
    close(ops.rms_norm(x, w, 1e-6), cpu.rms_norm(x, w, 1e-6))
    o, res = ops.add_rms_norm(x, r, w, 1e-6)
    close(res, x + r)
    close(o, cpu.rms_norm(x + r, w, 1e-6))
    close(ops.gated_rms_norm(x, z, w, 1e-6), cpu.gated_rms_norm(x, z, w, 1e-6))


@pytest.mark.parametrize("wdtype", [np.float32, BF16])
def test_linear_gemm(ops, wdtype):
    rng = np.random.default_rng(4)
    x = rnd(rng, 5, 40)
    w = rnd(rng, 70, 40).astype(wdtype)
    b = rnd(rng, 70)
    wf = w.astype(np.float32)
    close(ops.linear(x, w), cpu.linear(x, wf))
    close(ops.linear(x, w, b), cpu.linear(x, wf, b))


def test_rope(ops):
    rng = np.random.default_rng(5)
    x = rnd(rng, 3, 2, 16)
    pos = np.array([0, 7, 123456], dtype=np.int32)
    close(ops.rope(x, pos, 8, 1e7), cpu.rope(x, pos, 8, 1e7))


@pytest.mark.parametrize("cdtype", [np.float32, BF16])
def test_kv_store_and_prefill_attention(ops, cdtype):
    rng = np.random.default_rng(6)
    s, hkv, hq, d, t = 40, 2, 4, 24, 18
    kc = rnd(rng, s, hkv, d).astype(cdtype)
    vc = rnd(rng, s, hkv, d).astype(cdtype)
    kc_ref, vc_ref = kc.astype(np.float32), vc.astype(np.float32)
    pos = np.arange(5, 5 + t, dtype=np.int32)
    k, v = rnd(rng, t, hkv, d), rnd(rng, t, hkv, d)
    ops.kv_store(kc, vc, k, v, pos)
    cpu.kv_store(kc_ref, vc_ref, k.astype(cdtype).astype(np.float32), v.astype(cdtype).astype(np.float32), pos)
    close(kc.astype(np.float32), kc_ref, 0)
    close(vc.astype(np.float32), vc_ref, 0)
    q = rnd(rng, t, hq, d)
    close(ops.attention(q, kc, vc, pos, d ** -0.5), cpu.attention(q, kc_ref, vc_ref, pos, d ** -0.5))


def test_conv1d_and_gates(ops):
    rng = np.random.default_rng(7)
    t, c, kw = 5, 70, 4
    x, w, st = rnd(rng, t, c), rnd(rng, c, kw), rnd(rng, kw - 1, c)
    st_ref = st.copy()
    close(ops.causal_conv1d(x, st, w), cpu.causal_conv1d(x, st_ref, w))
    close(st, st_ref, 0)
    a, b = rnd(rng, 4, 6, scale=8.0), rnd(rng, 4, 6)
    alog, dtb = rnd(rng, 6), rnd(rng, 6)
    g, beta = ops.gdn_gates(a, b, alog, dtb)
    gr, br = cpu.gdn_gates(a, b, alog, dtb)
    close(g, gr)
    close(beta, br)


def test_moe_route(ops):
    rng = np.random.default_rng(8)
    logits = rnd(rng, 3, 40)
    logits[1, 7] = logits[1, 9] = logits[1].max() + 1.0    # tie -> lower id first
    for renorm in (True, False):
        ids, w = ops.moe_route(logits, 4, renorm)
        ir, wr = cpu.moe_route(logits, 4, renorm)
        np.testing.assert_array_equal(ids, ir)
        close(w, wr)


def test_sampling(ops):
    rng = np.random.default_rng(9)
    b, v = 4, 300
    logits = rnd(rng, b, v, scale=3.0)
    logits[2, 11] = logits[2, 200] = logits[2].max() + 1.0
    np.testing.assert_array_equal(ops.argmax(logits, threads=32), np.argmax(logits, axis=1))
    counts = rng.integers(0, 3, (b, v)).astype(np.int32)
    rep = np.array([1.0, 1.3, 0.8, 1.1], np.float32)
    freq = np.array([0.0, 0.5, 0.1, 0.0], np.float32)
    pres = np.array([0.0, 0.2, 0.0, 0.7], np.float32)
    lp = logits.copy()
    ops.apply_penalties(lp, counts, rep, freq, pres)
    close(lp, S.penalties_ref(logits, counts, rep, freq, pres))
    temp = np.array([0.0, 0.7, 1.0, 1.5], np.float32)
    top_k = np.array([0, 20, 0, 5], np.int32)
    top_p = np.array([1.0, 0.9, 0.5, 1.0], np.float32)
    min_p = np.array([0.0, 0.0, 0.05, 0.0], np.float32)
    seeds = np.array([1, 2, 3, 2**40 + 5], np.int64)
    offs = np.array([0, 10, 3, 7], np.int64)
    offs0 = offs.copy()
    tok = ops.sample(logits, temp, top_k, top_p, min_p, seeds, offs, threads=32)
    np.testing.assert_array_equal(offs, offs0 + 1)
    for i in range(b):
        ref, kept, tgt = S.sample_ref(logits[i], temp[i], top_k[i], top_p[i], min_p[i], seeds[i], offs0[i], i)
        assert kept[tok[i]], (i, tok[i])
        assert tok[i] == ref, (i, tok[i], ref)
    counts2 = counts.copy()
    ops.count_tokens(counts2, tok)
    exp = counts.copy()
    exp[np.arange(b), tok] += 1
    np.testing.assert_array_equal(counts2, exp)


def test_int8_kv_store_and_prefill_attention(ops):
    rng = np.random.default_rng(7)
    s, hkv, hq, d, t = 30, 2, 4, 128, 17
    kc, vc = np.zeros((s, hkv, d), np.int8), np.zeros((s, hkv, d), np.int8)
    ks, vs = np.zeros((s, hkv, d // 64), np.float32), np.zeros((s, hkv, d // 64), np.float32)
    kc_ref, vc_ref, ks_ref, vs_ref = kc.copy(), vc.copy(), ks.copy(), vs.copy()
    pos = np.arange(3, 3 + t, dtype=np.int32)
    k, v = rnd(rng, t, hkv, d), rnd(rng, t, hkv, d)
    k[0, 0, :64] = 0.0                                  # an all-zero group: scale 0, codes 0
    ops.kv_store(kc, vc, k, v, pos, ks, vs)
    cpu.kv_store(kc_ref, vc_ref, k, v, pos, ks_ref, vs_ref)
    assert np.array_equal(kc, kc_ref) and np.array_equal(vc, vc_ref)
    close(ks, ks_ref, 0)
    close(vs, vs_ref, 0)
    assert ks[3, 0, 0] == 0 and not kc[3, 0, :64].any()
    q = rnd(rng, t, hq, d)
    close(ops.attention(q, kc, vc, pos, d ** -0.5, ks, vs),
          cpu.attention(q, kc_ref, vc_ref, pos, d ** -0.5, ks_ref, vs_ref))
