"""Every CUDA op vs ops.cpu on fresh random inputs, at small and real model dims (GPU only).

Outputs are checked for NaN: the scratch arena is filled with NaN before each op, so an
unwritten element fails. bf16 weights are compared against the fp32 reference run on the same
bf16-rounded values (so the tolerance measures the kernel, not the rounding).
"""
from __future__ import annotations

import contextlib
from dataclasses import replace

import numpy as np
import pytest

from ninfer_nb.kernels.gdn import gdn_decode as K_gdd
from ninfer_nb.kernels.linear import linear as K_lin
from ninfer_nb.models.rope import plain_table
from ninfer_nb.ops import cpu
from ninfer_nb.ops import cuda as cuda_ops
from ninfer_nb.ops.cuda import gdn as cuda_gdn
from ninfer_nb.ops.cuda import linear as cuda_linear
from ninfer_nb.ops.cuda import moe as cuda_moe
from tests.kernels.gpu_util import BF16, F32Experts, GpuEnv, close, rnd, rnd_bf16, stable_seed

pytestmark = pytest.mark.gpu
TOL32 = 1e-5
TOL16 = 1e-2


@pytest.fixture(scope="module")
def env() -> GpuEnv:
    return GpuEnv()


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng(stable_seed(request.node.name))


@pytest.mark.parametrize("n,k", [(5120, 17408), (5120, 6144), (2048, 4096), (257, 2048), (6, 2304), (3, 2048)])
@pytest.mark.parametrize("t", [1, 5, 16])
def test_linear_splitk_gemv(env, rng, n, k, t, monkeypatch):
    """The few-row decode GEMVs: the 27B / 35B shapes, an uneven last slice (K = 2304: slices of
    768, the fourth empty), blocks with dead row pairs (N = 3, 6). T = 1: the one-token builds
    (kernels/linear/linear.py gemv_one_token, 1-8 K slices, 2-6 blocks per SM, 8 or 4 warps per block,
    the residual as bias)
    and the one ops.linear picks; T = 5, 16 (1 and 4 passes over the tokens): the split-K
    kernels (2 or 4 K slices per row pair) against the whole-row kernel; all against NumPy.
    Prints the times at T = 1 (-s)."""
    ops = env.fresh()
    w = rnd_bf16(rng, n, k)
    x, b = rnd(rng, t, k), rnd(rng, n)
    W, X, B = env.up(w), env.up(x), env.up(b)
    ref = cpu.linear(x, w.astype(np.float32), b)
    launched = _launched(ops, monkeypatch)
    if t == 1:
        times = {}
        for ways, blocks, warps in ((1, 2, 8), (2, 3, 8), (4, 4, 8), (8, 4, 8), (1, 5, 4), (1, 6, 4), (2, 4, 4),
                                    (2, 6, 4), (4, 6, 4)):
            R = env.up(b.reshape(1, n))
            _one_token(ops, "plain", ways, blocks, X, X.reshape(-1), W, R.reshape(-1), R, warps=warps)
            close(env.host(R), ref, TOL32 * 10)
            times[ways, blocks, warps], _ = _best_time(
                env, lambda: _one_token(ops, "plain", ways, blocks, X, X.reshape(-1), W, B, R, warps=warps), reps=5,
                graph=True)
        launched.clear()
        close(env.host(ops.linear(X, W, B)), ref, TOL32 * 10)
        assert launched == [K_lin.gemv_one_token(*cuda_ops.one_token_build("plain", n, k, ops.sm_count)).name]
        print(f"\nGEMV {n}x{k} T=1, us by (K slices, blocks per SM, warps): "
              + ", ".join(f"{key}: {v * 1e6:.1f}" for key, v in times.items()))
        return
    close(env.host(ops.linear(X, W, B)), ref, TOL32 * 10)           # the tensor-core GEMV (gemv_mma.py)
    monkeypatch.setattr(cuda_linear, "GEMV_MMA", False)              # the SIMT GEMVs below
    outs = {}
    for ways in (0, 2, 4):                                          # whole rows, 2 or 4 K slices
        monkeypatch.setattr(cuda_linear, "SPLITK_MIN_K", 2048 if ways == 4 else 1 << 30)
        monkeypatch.setattr(cuda_linear, "SPLITK2_MIN_K", 2048 if ways == 2 else 1 << 30)
        outs[ways] = env.host(ops.linear(X, W, B))
    assert {"gemv_bf16_kernel", "gemv_bf16_splitk_kernel", "gemv_bf16_splitk2_kernel"} <= set(launched)
    close(outs[0], ref, TOL32 * 10)
    for ways in (2, 4):
        close(outs[ways], ref, TOL32 * 10)
        close(outs[ways], outs[0], TOL32 * 10)


@pytest.mark.parametrize("i,k,t", [(17408, 5120, 1), (512, 2048, 4), (96, 264, 6), (3, 16, 16)])
def test_linear_swiglu_gemv(env, rng, i, k, t):
    """ops.linear_swiglu's SwiGLU-epilogue GEMV against the GEMV + swiglu pair and NumPy (the
    27B MLP shape, a ragged last block, 1-4 passes over the tokens); prints both times at the
    27B shape (-s)."""
    ops = env.fresh()
    w = rnd_bf16(rng, 2 * i, k)
    x = rnd(rng, t, k)
    X, W = env.up(x), env.up(w)
    ref = cpu.linear_swiglu(x, w.astype(np.float32))
    times, outs = {}, {}
    calls = {False: lambda: ops.swiglu(ops.linear(X, W)), True: lambda: ops.linear_swiglu(X, W)}
    for fused in (False, True):
        times[fused], o = _best_time(env, calls[fused], reps=5, graph=True)
        outs[fused] = env.host(o)
    close(outs[True], ref, TOL32 * 10)
    close(outs[True], outs[False], TOL32 * 10)
    if i == 17408:
        print(f"\nGEMV + SwiGLU {2 * i}x{k} T={t}: pair {times[False] * 1e6:.1f} us, fused {times[True] * 1e6:.1f} us")


@pytest.mark.parametrize("t", [17, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_split_gemm_parts(env, rng, t, bias):
    """ops.linear_split: the fused projection as split(linear) and as ops.linear_split's one
    tensor-core GEMM per part of the weight rows (mma.sync at T = 17,
    wgmma on cc 9.0 at T = 300 when the ops take it); both vs NumPy on bf16-rounded x."""
    ops = env.fresh()
    sizes = (256, 128, 48, 48)
    w = rnd_bf16(rng, sum(sizes), 512)
    x, b = rnd(rng, t, 512), rnd(rng, sum(sizes))
    ref = cpu.split(cpu.linear(x.astype(BF16).astype(np.float32), w.astype(np.float32), b if bias else None),
                    sizes)
    X, W, B = env.up(x), env.up(w), env.up(b) if bias else None
    for parts in (False, True):
        got = [env.host(p) for p in (ops.linear_split(X, W, B, sizes) if parts
                                     else ops.split(ops.linear(X, W, B), sizes))]
        assert [g.shape for g in got] == [r.shape for r in ref]
        for g, r in zip(got, ref):
            close(g, r, TOL32 * 10)


@pytest.mark.parametrize("t", [1, 4])
def test_lm_head_and_embedding_vocab(env, rng, t):
    """Vocab-size GEMV 248320 x 5120 (2.5 GB bf16) and the tied embedding gather."""
    ops = env.fresh()
    v, h = 248320, 5120
    w = rnd_bf16(rng, v, h)
    W = env.up(w)
    x = rnd(rng, t, h)
    y = env.host(ops.linear(env.up(x), W))
    assert np.isfinite(y).all()
    rows = rng.choice(v, 4096, replace=False)
    rows[:2] = [0, v - 1]
    close(y[:, rows], x @ w[rows].astype(np.float32).T, TOL32 * 10)
    ids = rng.integers(0, v, 13).astype(np.int32)
    ids[:2] = [0, v - 1]
    close(env.host(ops.embedding(W, env.up(ids))), w[ids].astype(np.float32), 0)


@pytest.mark.parametrize("t,heads,d,rd", [(5, 24, 256, 64), (3, 4, 128, 128), (70, 16, 256, 64)])
def test_rope(env, rng, t, heads, d, rd):
    ops = env.fresh()
    x = rnd(rng, t, heads, d)
    pos = rng.integers(0, 262144, t).astype(np.int32)
    table = plain_table(rd, 1e7)
    close(env.host(ops.rope(env.up(x), env.up(pos), env.up(table))), cpu.rope(x, pos, table), TOL32)


def _check_attention(o, q, kf, vf, pos, scale, kind):
    """SIMT kernels: fp32 throughout (1e-4). The GEMM and flash paths and the tensor-core decode
    kernel (bf16 caches): bf16 Q, K, V and P, so against the reference on bf16-rounded q, k, v;
    P's rounding leaves ~4e-3 (1e-2 allowed)."""
    if kind in ("gemm", "flash", "decode_mma"):
        r16 = [a.astype(BF16).astype(np.float32) for a in (q, kf, vf)]
        return close(o, cpu.attention(r16[0], r16[1], r16[2], pos, scale), 1e-2)
    return close(o, cpu.attention(q, kf, vf, pos, scale), TOL32 * 10)


def _best_time(env, fn, reps=3, graph=False):
    """(time per call, the last output). graph=False: the best wall time of `reps` synchronised
    calls after a warm-up call (for ms-scale prefill ops; it includes ~0.15 ms of Python launch
    cost). graph=True: GPU time per call from `reps` replays of a graph holding 8 calls
    (runtime.graph.time_in_graph), for the microsecond-scale decode kernels."""
    import time

    from ninfer_nb.runtime.graph import time_in_graph

    fn()                                                    # warm-up (compiles)
    if graph:
        return time_in_graph(env.stream, fn, env.ops.scope, repeat=8, replays=reps)
    best = float("inf")
    for _ in range(reps):
        env.stream.synchronize()
        t0 = time.perf_counter()
        o = fn()
        env.stream.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best, o


@contextlib.contextmanager
def _prefill_kind(ops, kind):
    saved = ops.choices
    ops.choices = replace(saved, prefill_attention=kind)
    try:
        yield
    finally:
        ops.choices = saved


def _attn_case(env, rng, cdtype, s, hq, hkv, d, start, t, kind="gemm"):
    ops = env.fresh()
    kc = rnd(rng, s, hkv, d).astype(cdtype)
    vc = rnd(rng, s, hkv, d).astype(cdtype)
    kc_ref, vc_ref = kc.astype(np.float32), vc.astype(np.float32)
    KC, VC = env.up(kc), env.up(vc)
    pos = np.arange(start, start + t, dtype=np.int32)
    k, v = rnd(rng, t, hkv, d), rnd(rng, t, hkv, d)
    P = env.up(pos)
    ops.kv_store(KC, VC, env.up(k), env.up(v), P)
    cpu.kv_store(kc_ref, vc_ref, k.astype(cdtype).astype(np.float32), v.astype(cdtype).astype(np.float32), pos)
    close(env.host(KC).astype(np.float32), kc_ref, 0)
    close(env.host(VC).astype(np.float32), vc_ref, 0)
    q = rnd(rng, t, hq, d)
    with _prefill_kind(ops, kind):
        o = env.host(ops.attention(env.up(q), KC, VC, P, d ** -0.5))
    if t <= 16:                                    # decode-sized: the split kernels
        from ninfer_nb.kernels.attention import attention_decode_mma as K_adm
        mma = cdtype == BF16 and K_adm.supported(d, hq // hkv)
        return _check_attention(o, q, kc_ref, vc_ref, pos, d ** -0.5, "decode_mma" if mma else "simt")
    return _check_attention(o, q, kc_ref, vc_ref, pos, d ** -0.5, "simt" if kind == "simt" or d % 64 else kind)


@pytest.mark.parametrize("kind", ["flash", "gemm", "simt"])
@pytest.mark.parametrize("cdtype", [np.float32, BF16])
@pytest.mark.parametrize("start,t", [(0, 1), (4000, 1), (700, 3), (0, 300), (300, 77)])
def test_attention_qwen_dims(env, rng, cdtype, start, t, kind):
    """24 q heads / 4 kv heads x 256 (decode split-K for T <= 4; prefill above: the mma.sync
    flash kernel, the GEMM path or the SIMT flash kernel)."""
    if t <= 4 and kind != "flash":
        pytest.skip("decode takes the split-K kernel whatever the prefill kind")
    _attn_case(env, rng, cdtype, 4096, 24, 4, 256, start, t, kind)


@pytest.mark.parametrize("cdtype", [np.float32, BF16, np.int8])
@pytest.mark.parametrize("hq,hkv,start,t", [(24, 4, 4000, 1), (16, 2, 700, 3), (8, 2, 30, 1), (16, 2, 8190, 1),
                                            (24, 4, 0, 1), (16, 2, 13, 4), (24, 4, 511, 1), (24, 4, 8190, 1)])
def test_attention_decode_splits(env, rng, cdtype, hq, hkv, start, t, monkeypatch):
    """Decode attention (split kernel + combine) over an 8K cache at short and long positions,
    including the first key alone and a few tokens at once, on fp32 / bf16 / int8 caches,
    against NumPy for several split counts (SPLIT_WAVES); prints the times at 8K and 512 (-s).
    The per-q-head SIMT kernel on every cache dtype (bf16 ones default to tensor cores:
    test_attention_decode_mma)."""
    from ninfer_nb.kernels.attention import attention as K_attn

    ops = env.fresh()
    monkeypatch.setattr(ops, "choices", replace(ops.choices, decode_attention="simt"))
    s, d = 8192, 256
    pos = np.arange(start, start + t, dtype=np.int32)
    q = rnd(rng, t, hq, d)
    kf, vf = rnd(rng, s, hkv, d), rnd(rng, s, hkv, d)
    if cdtype == np.int8:
        kc, vc = np.zeros((s, hkv, d), np.int8), np.zeros((s, hkv, d), np.int8)
        ks, vs = np.zeros((s, hkv, d // 64), np.float32), np.zeros((s, hkv, d // 64), np.float32)
        cpu.kv_store(kc, vc, kf, vf, np.arange(s), ks, vs)
        kf = kc.astype(np.float32) * np.repeat(ks, 64, axis=-1)
        vf = vc.astype(np.float32) * np.repeat(vs, 64, axis=-1)
        args = (env.up(q), env.up(kc), env.up(vc), env.up(pos), d ** -0.5, env.up(ks), env.up(vs))
    else:
        kc, vc = kf.astype(cdtype), vf.astype(cdtype)
        kf, vf = kc.astype(np.float32), vc.astype(np.float32)
        args = (env.up(q), env.up(kc), env.up(vc), env.up(pos), d ** -0.5)
    ref = cpu.attention(q, kf, vf, pos, d ** -0.5)
    times = {}
    for waves in (1, 2, 4):
        monkeypatch.setattr(K_attn, "SPLIT_WAVES", waves)
        times[waves], o = _best_time(env, lambda: ops.attention(*args), reps=5, graph=True)
        close(env.host(o), ref, TOL32 * 10)
    if start + t in (8191, 512) and t == 1:
        print(f"\ndecode attention Hq={hq} Hkv={hkv} at {start + t} ({np.dtype(cdtype).name} cache): "
              + ", ".join(f"{w} waves {v * 1e6:.1f} us" for w, v in times.items()))


@pytest.mark.parametrize("hq,hkv,start,t", [(24, 4, 8190, 1), (16, 2, 8190, 1), (24, 4, 511, 1), (16, 2, 511, 1),
                                            (16, 2, 700, 3), (8, 1, 0, 1), (6, 2, 30, 2), (16, 2, 8100, 4)])
def test_attention_decode_mma(env, rng, hq, hkv, start, t, monkeypatch):
    """The bf16 caches' decode attention (attention_decode_mma.attn_split_mma_d256_kernel: tensor
    cores, a block per (split, kv head)) against NumPy at the 27B / 35B heads over an 8K cache,
    the first key alone and a few tokens at once (Q, K, V, P rounded to bf16: tolerance 2e-2);
    prints its time against attn_split_kernel on the same bf16 cache and on an fp32 one (-s)."""
    ops = env.fresh()
    s, d = 8192, 256
    pos = np.arange(start, start + t, dtype=np.int32)
    q = rnd(rng, t, hq, d)
    kf, vf = rnd(rng, s, hkv, d), rnd(rng, s, hkv, d)
    kc, vc = kf.astype(BF16), vf.astype(BF16)
    ref = cpu.attention(q, kc.astype(np.float32), vc.astype(np.float32), pos, d ** -0.5)
    launched = _launched(ops, monkeypatch)
    times = {}
    for name, caches, kind in (("mma", (kc, vc), "auto"), ("simt bf16", (kc, vc), "simt"),
                               ("simt fp32", (kf, vf), "auto")):
        monkeypatch.setattr(ops, "choices", replace(ops.choices, decode_attention=kind))
        args = (env.up(q), env.up(caches[0]), env.up(caches[1]), env.up(pos), d ** -0.5)
        times[name], o = _best_time(env, lambda: ops.attention(*args), reps=5, graph=True)
        if name != "simt fp32":
            close(env.host(o), ref, 2e-2 if name == "mma" else TOL32 * 10)
    assert {"attn_split_mma_d256_kernel", "attn_split_kernel"} <= set(launched)
    if start + t in (8191, 512) and t == 1:
        print(f"\ndecode attention Hq={hq} Hkv={hkv} at {start + t}: "
              + ", ".join(f"{k} {v * 1e6:.1f} us" for k, v in times.items()))


@pytest.mark.parametrize("t,start", [(1, 511), (3, 700), (1, 0), (20, 100)])
def test_attention_gated(env, rng, t, start, monkeypatch):
    """ops.attention_gated (the Qwen3.5 attention's sigmoid output gate): decode-sized T applies
    it in the split kernels' combine kernel (no sigmoid_mul launch), longer T after the prefill
    kernel (the fp32 one here); against NumPy. The gate is a view into one projection row, as
    the decoder passes it."""
    ops = env.fresh()
    hq, hkv, d, s = 16, 2, 256, 1024
    pos = np.arange(start, start + t, dtype=np.int32)
    q, kc, vc = rnd(rng, t, hq, d), rnd(rng, s, hkv, d), rnd(rng, s, hkv, d)
    proj = rnd(rng, t, 2 * hq * d)                                   # [T, q | gate]
    ref = cpu.attention_gated(q, kc, vc, pos, d ** -0.5, proj[:, hq * d:])
    launched = _launched(ops, monkeypatch)
    _, gate = ops.split(env.up(proj), (hq * d, hq * d))
    with _prefill_kind(ops, "simt"):
        o = ops.attention_gated(env.up(q), env.up(kc), env.up(vc), env.up(pos), d ** -0.5, gate)
    close(env.host(o), ref, TOL32 * 10)
    assert o.shape == (t, hq * d)
    assert ("sigmoid_mul_kernel" in launched) == (t > 4)


@pytest.mark.parametrize("hq,hkv", [(24, 4), (16, 2)])
def test_attention_decode_64k(env, rng, hq, hkv, monkeypatch):
    """Decode attention at 64K context over a bf16 cache (the issue's long-context case) vs
    NumPy: the tensor-core kernel (the bf16 default; bf16 Q and P, so against the reference
    on a bf16-rounded q) and the SIMT kernel for 1 / 2 / 4 / 8 waves of split blocks
    (SPLIT_WAVES = 1 was chosen from the 512 and 8K timings); the times per call (-s)."""
    from ninfer_nb.kernels.attention import attention as K_attn

    ops = env.fresh()
    s, d = 65536, 256
    pos = np.array([s - 1], dtype=np.int32)
    q = rnd(rng, 1, hq, d)
    kc, vc = rnd_bf16(rng, s, hkv, d), rnd_bf16(rng, s, hkv, d)
    args = (env.up(q), env.up(kc), env.up(vc), env.up(pos), d ** -0.5)
    ref = cpu.attention(q, kc.astype(np.float32), vc.astype(np.float32), pos, d ** -0.5)
    launched = _launched(ops, monkeypatch)
    times = {}
    times["mma"], o = _best_time(env, lambda: ops.attention(*args), reps=3, graph=True)
    _check_attention(env.host(o), q, kc.astype(np.float32), vc.astype(np.float32), pos, d ** -0.5, "decode_mma")
    assert "attn_split_mma_d256_kernel" in launched
    monkeypatch.setattr(ops, "choices", replace(ops.choices, decode_attention="simt"))
    for waves in (1, 2, 4, 8):
        monkeypatch.setattr(K_attn, "SPLIT_WAVES", waves)
        times[f"SIMT {waves} waves"], o = _best_time(env, lambda: ops.attention(*args), reps=3, graph=True)
        close(env.host(o), ref, TOL32 * 10)
    kv_bytes = 2 * kc.nbytes
    print(f"\ndecode attention Hq={hq} Hkv={hkv} at 65536 (bfloat16 cache): "
          + ", ".join(f"{w} {v * 1e6:.1f} us ({kv_bytes / v / 1e9:.0f} GB/s of KV)" for w, v in times.items()))


@pytest.mark.parametrize("d,t,start", [(64, 1, 37), (128, 20, 5), (96, 2, 600), (64, 300, 40), (96, 33, 7)])
def test_attention_small_heads(env, rng, d, t, start):
    """Other head dims; 96 is not a multiple of the GEMMs' K step, so it takes the SIMT kernel."""
    _attn_case(env, rng, np.float32, 1024, 8, 2, d, start, t)


# TF32 state products (kernels/gdn/gdn_chunked_mma.py): operands rounded to 10 mantissa bits
TOL_TF32 = 3e-3


@pytest.mark.parametrize("cdtype", [np.float32, BF16])
@pytest.mark.parametrize("hq,hkv,d,rot,t,norm", [(24, 4, 256, 64, 1, True), (16, 2, 256, 64, 5, True),
                                                 (8, 2, 128, 128, 3, False), (6, 2, 96, 32, 2, True)])
def test_qk_norm_rope_store(env, rng, cdtype, hq, hkv, d, rot, t, norm):
    """The fused attention prologue (q / k norms, RoPE, K / V into the cache) vs ops.cpu."""
    ops = env.fresh()
    s = 64
    q, k, v = rnd(rng, t, hq, d), rnd(rng, t, hkv, d), rnd(rng, t, hkv, d)
    qn, kn = (rnd(rng, d), rnd(rng, d)) if norm else (None, None)
    pos = np.sort(rng.choice(s, t, replace=False)).astype(np.int32)
    kc, vc = rnd(rng, s, hkv, d).astype(cdtype), rnd(rng, s, hkv, d).astype(cdtype)
    kc_ref, vc_ref = kc.astype(np.float32), vc.astype(np.float32)
    KC, VC = env.up(kc), env.up(vc)

    def up(a):
        return env.up(a) if a is not None else None

    table = plain_table(rot, 1e7)
    got = ops.qk_norm_rope_store(env.up(q), env.up(k), env.up(v), up(qn), up(kn), env.up(pos), env.up(table), 1e-6,
                                 KC, VC)
    ref = cpu.qk_norm_rope_store(q, k, v, qn, kn, pos, table, 1e-6, kc_ref, vc_ref)
    close(env.host(got), ref, TOL32)
    close(env.host(KC).astype(np.float32), kc_ref.astype(cdtype).astype(np.float32),
          TOL32 if cdtype == np.float32 else 8e-3)
    close(env.host(VC).astype(np.float32), vc_ref.astype(cdtype).astype(np.float32), 0)


@pytest.mark.parametrize("t,hk,hv,dk,dv", [(1, 16, 48, 128, 128), (3, 16, 32, 128, 128), (2, 2, 4, 64, 96),
                                           (1, 16, 32, 128, 128), (1, 1, 2, 256, 40)])
def test_gated_delta_rule_raw_gates(env, rng, t, hk, hv, dk, dv):
    """The decode form: gates computed inside the recurrent kernel from the raw a / b projections
    (including a > 20, where softplus is the identity), against ops.cpu; prints the time at the
    27B / 35B decode shapes (-s). (Variants with 2 and 1 state rows per warp, 8 and 16 warps per
    block, were slower on the H200: 8.1 / 10.4 us at Hv = 48 against 5.9 us.)"""
    ops = env.fresh()
    q, k, v = rnd(rng, t, hk, dk), rnd(rng, t, hk, dk), rnd(rng, t, hv, dv)
    a, b = rnd(rng, t, hv, scale=2.0), rnd(rng, t, hv)
    a[0, 0] = 25.0
    al, dtb = rnd(rng, hv, scale=0.5), rnd(rng, hv)
    st = rnd(rng, hv, dv, dk, scale=0.1)
    ST, st_ref = env.up(st), st.copy()
    args = (env.up(q), env.up(k), env.up(v), env.up(a), env.up(b), env.up(al), env.up(dtb))
    o = ops.gated_delta_rule_raw_gates(*args, ST)
    ref = cpu.gated_delta_rule_raw_gates(q, k, v, a, b, al, dtb, st_ref)
    close(env.host(o), ref, TOL32 * 10)
    close(env.host(ST), st_ref, TOL32 * 10)
    if t == 1 and dk == 128:                       # the state is updated in place by every timed call
        best, _ = _best_time(env, lambda: ops.gated_delta_rule_raw_gates(*args, ST), reps=5, graph=True)
        print(f"\ngated delta rule decode Hv={hv} Dk={dk} Dv={dv}: {best * 1e6:.1f} us")


@pytest.mark.parametrize("t,hk,hv,dk,dv", [(1, 16, 32, 128, 128), (1, 16, 48, 128, 128), (3, 16, 32, 128, 128),
                                           (2, 2, 6, 64, 96), (1, 1, 2, 32, 40), (5, 4, 4, 96, 128),
                                           (1, 1, 8, 32, 128)])
def test_gdn_decode(env, rng, t, hk, hv, dk, dv, monkeypatch):
    """ops.gdn_decode (conv + SiLU, gated delta rule with raw gates, gated norm; the decode GDN
    middle) against ops.cpu.gdn_decode: the output, the recurrent state and the conv state. The
    inputs are views into one projection row, as the decoder passes them. Clusters of 4 to 12
    blocks (Hv / Hk = 1-3 heads of 1-4 row slices) share a key head's conv state and each head's
    norm; Hv / Hk = 8 with 4 slices (32 blocks) is past the cluster limit: the three-launch path.
    Prints the fused kernel against the three launches at the 35B / 27B shapes (-s)."""
    ops = env.fresh()
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
    launched = _launched(ops, monkeypatch)
    ST, CS, NW = env.up(st), env.up(conv_st), env.up(nw)
    consts = (env.up(conv_w), env.up(al), env.up(dtb))
    parts = ops.split(env.up(proj), (c, vd, hv, hv))

    def call():
        return ops.gdn_decode(*parts, CS, *consts, ST, NW, 1e-6, hk)

    o = call()
    fused = K_gdd.supported(hv, hk, dk, dv, 4)
    assert launched[(t > 1):] == (["gdn_decode_kernel"] if fused else
                                  ["causal_conv1d_kernel", "gdr_recurrent_kernel", "gated_rms_norm_warp_kernel"])
    close(env.host(o), ref, TOL32 * 10)
    close(env.host(ST), st_ref, TOL32 * 10)
    close(env.host(CS), conv_ref, TOL32)
    if t == 1 and dk == 128:                       # the states are updated in place by every timed call
        one, _ = _best_time(env, call, reps=5, graph=True)
        monkeypatch.setattr(cuda_gdn, "GDN_DECODE_FUSED", False)
        three, _ = _best_time(env, call, reps=5, graph=True)
        print(f"\nGDN decode middle Hv={hv} Dk={dk} Dv={dv}: conv + rule + norm {three * 1e6:.1f} us, "
              f"fused {one * 1e6:.1f} us")


@pytest.mark.parametrize("e,k,h,shared,renorm", [(256, 8, 2048, True, True), (128, 8, 2048, False, False),
                                                (60, 4, 104, True, False), (6, 2, 64, False, True)])
@pytest.mark.parametrize("cluster", [True, False])
def test_moe_router_fused(env, rng, e, k, h, shared, renorm, cluster, monkeypatch):
    """ops.moe_router's one-launch decode router on a Normed row (RMSNorm, GEMV and the top-k)
    against norm + GEMV + moe_route and NumPy: same ids, same weights; repeated launches (the
    arrival counter must come back to 0, also inside a graph); the normed row it writes for the
    experts. cluster: the thread-block-cluster kernel (E = 256: 16 blocks, a non-portable
    cluster; E = 60: 4; E = 6: 1), else the arrival-counter kernel. Prints the times at the 35B
    shape. E = 6: fewer rows than one block's warps."""
    ops = env.fresh()
    monkeypatch.setattr(cuda_moe, "ROUTER_CLUSTER", cluster)
    w = rnd_bf16(rng, e + int(shared), h)
    x, nw = rnd(rng, 1, h), rnd(rng, h)
    X, W, NW = env.up(x), env.up(w), env.up(nw)
    xn = cpu.rms_norm(x, nw, 1e-6)
    ir, wr = cpu.moe_router(xn, w.astype(np.float32), k, renorm, shared)
    times = {}
    calls = {False: lambda: ops.moe_route(ops.linear(ops.rms_norm(X, NW, 1e-6), W), k, renorm, shared),
             True: lambda: ops.moe_router(ops.normed(X, NW, 1e-6), W, k, renorm, shared)}
    launched = _launched(ops, monkeypatch)
    for fused in (False, True):
        for _ in range(3):
            ids, wts = calls[fused]()
            np.testing.assert_array_equal(env.host(ids), ir)
            close(env.host(wts), wr, TOL32 * 10)
        times[fused], (ids, wts) = _best_time(env, calls[fused], reps=5, graph=True)
        np.testing.assert_array_equal(env.host(ids), ir)
        close(env.host(wts), wr, TOL32 * 10)
    assert launched[-1] == ("moe_router_cluster_kernel" if cluster else "moe_router_fused_kernel")
    ids, wts, XN = ops._moe_router_fused(ops.normed(X, NW, 1e-6), W, k, renorm, shared)
    close(env.host(XN), xn, TOL32 * 10)
    np.testing.assert_array_equal(env.host(ids), ir)
    if e == 256:
        print(f"\nMoE router E={e}+{int(shared)} k={k} H={h}: norm + GEMV + route {times[False] * 1e6:.1f} us, "
              f"{'cluster' if cluster else 'fused'} {times[True] * 1e6:.1f} us")


@pytest.mark.parametrize("e,k,i,h", [(256, 8, 512, 2048), (16, 4, 36, 100), (32, 3, 768, 4096),
                                     (64, 4, 256, 1024)])
def test_moe_normed_residual(env, rng, e, k, i, h, monkeypatch):
    """ops.moe on one Normed token with the shared expert as a slot, adding into the residual
    stream in place (the decoder's MoE block): against cpu.moe; which kernels ran (H % 2048 ==
    0: the fused router with the norm, the wide pair; H = 1024: the unrolled gate_up; H = 100:
    no fused norm); prints its time at the 35B shape."""
    ops = env.fresh()
    gu, dn = rnd_bf16(rng, e + 1, 2 * i, h), rnd_bf16(rng, e + 1, h, i)
    router = rnd_bf16(rng, e + 1, h)
    x, nw = rnd(rng, 1, h), rnd(rng, h)
    GU, DN, R, NW = env.up(gu), env.up(dn), env.up(router), env.up(nw)
    ref = cpu.moe(cpu.rms_norm(x, nw, 1e-6), router.astype(np.float32), k, True, True, F32Experts(gu),
                  F32Experts(dn), x.copy())
    launched = _launched(ops, monkeypatch)
    X = env.up(x)
    out = ops.moe(ops.normed(X, NW, 1e-6), R, k, True, True, GU, DN, residual=X)
    assert out is X
    close(env.host(X), ref, TOL32 * 10)
    if h % 2048 == 0:
        assert launched == ["moe_router_cluster_kernel", "moe_gate_up_wide_kernel", "moe_down_wide_kernel"]
    elif h % 8 == 0:
        assert "moe_router_cluster_kernel" in launched and "add_kernel" not in launched
    else:                                                            # no fused norm: the plain path
        assert "rms_norm_kernel" in launched
    if e == 256:
        best, _ = _best_time(env, lambda: ops.moe(ops.normed(X, NW, 1e-6), R, k, True, True, GU, DN, residual=X),
                             reps=5, graph=True)
        print(f"\nMoE decode layer (norm, router, experts, residual add) E={e}+1 k={k}: {best * 1e6:.1f} us")


@pytest.mark.parametrize("n,k", [(12352, 2048), (16480, 5120), (77, 40 * 8), (5, 2056)])
def test_linear_normed_and_residual(env, rng, n, k, monkeypatch):
    """One decode token: linear of a Normed row (the norm inside gemv_one_token "normed")
    against rms_norm + linear and NumPy, and linear_add into a residual row in place (the GEMV
    adds it as its bias); prints the normed GEMV against the norm + GEMV pair at the big shapes."""
    ops = env.fresh()
    w = rnd_bf16(rng, n, k)
    x, nw, r = rnd(rng, 1, k), rnd(rng, k), rnd(rng, 1, n)
    X, W, NW = env.up(x), env.up(w), env.up(nw)
    ref = cpu.linear(cpu.rms_norm(x, nw, 1e-6), w.astype(np.float32))
    launched = _launched(ops, monkeypatch)
    close(env.host(ops.linear(ops.normed(X, NW, 1e-6), W)), ref, TOL32 * 10)
    assert launched == [K_lin.gemv_one_token(*cuda_ops.one_token_build("normed", n, k, ops.sm_count)).name]
    for ways, blocks, warps in ((1, 2, 8), (2, 4, 8), (4, 2, 8), (8, 4, 8), (2, 4, 4), (4, 8, 4),
                                (1, 8, 2)):                       # other one-token builds
        O = env.up(rnd(rng, 1, n))
        _one_token(ops, "normed", ways, blocks, X, NW, W, O.reshape(-1), O, has_bias=False, warps=warps)
        close(env.host(O), ref, TOL32 * 10)
    R = env.up(r)
    assert ops.linear_add(X, W, R) is R
    close(env.host(R), r + cpu.linear(x, w.astype(np.float32)), TOL32 * 10)
    assert "add_kernel" not in launched
    if n > 10000:
        pair, _ = _best_time(env, lambda: ops.linear(ops.rms_norm(X, NW, 1e-6), W), reps=5, graph=True)
        fused, _ = _best_time(env, lambda: ops.linear(ops.normed(X, NW, 1e-6), W), reps=5, graph=True)
        print(f"\nnormed GEMV {n}x{k}: norm + GEMV {pair * 1e6:.1f} us, fused {fused * 1e6:.1f} us "
              f"({w.nbytes / fused / 1e9:.0f} GB/s)")


@pytest.mark.parametrize("i,k", [(17408, 5120), (96, 264)])
def test_linear_swiglu_normed(env, rng, i, k):
    """The SwiGLU-epilogue GEMV on one Normed row against NumPy; the 27B MLP's times (-s)."""
    ops = env.fresh()
    w = rnd_bf16(rng, 2 * i, k)
    x, nw = rnd(rng, 1, k), rnd(rng, k)
    X, W, NW = env.up(x), env.up(w), env.up(nw)
    ref = cpu.linear_swiglu(cpu.rms_norm(x, nw, 1e-6), w.astype(np.float32))
    best, o = _best_time(env, lambda: ops.linear_swiglu(ops.normed(X, NW, 1e-6), W), reps=5, graph=True)
    close(env.host(o), ref, TOL32 * 10)
    for ways, blocks, warps in ((1, 2, 8), (2, 2, 8), (2, 4, 4), (1, 8, 2)):   # other builds
        O = env.up(rnd(rng, 1, i))
        _one_token(ops, "swiglu", ways, blocks, X, NW, W, O.reshape(-1), O, has_bias=False, warps=warps)
        close(env.host(O), ref, TOL32 * 10)
    if i == 17408:
        pair, _ = _best_time(env, lambda: ops.linear_swiglu(ops.rms_norm(X, NW, 1e-6), W), reps=5, graph=True)
        print(f"\nnormed GEMV + SwiGLU {2 * i}x{k}: norm + GEMV {pair * 1e6:.1f} us, fused {best * 1e6:.1f} us")


@pytest.mark.parametrize("t,e,k,i,h", [(1, 256, 9, 512, 2048), (4, 256, 8, 512, 2048), (3, 16, 4, 36, 100),
                                       (2, 64, 5, 256, 1024), (1, 32, 3, 768, 4096)])
@pytest.mark.parametrize("kind", ["plain", "wide"])
def test_moe_experts(env, rng, t, e, k, i, h, kind, monkeypatch):
    """Per-pair (decode) expert kernels; "wide": the decode kernels with more loads in flight,
    forced for every T (taken where H % 1024 == 0 and I % 256 == 0; the 36 x 100 case keeps
    the plain kernels; the wide gate_up needs H % 2048 == 0, so H = 1024 runs the unrolled
    gate_up with the wide down). Prints the time of one call at the 35B shape (9 slots: 8
    routed experts and the shared one) (-s)."""
    unrolled = kind != "plain"

    ops = env.fresh()
    gu, dn = rnd_bf16(rng, e, 2 * i, h), rnd_bf16(rng, e, h, i)
    x = rnd(rng, t, h)
    ids = np.stack([rng.choice(e, k, replace=False) for _ in range(t)]).astype(np.int32)
    w = rng.random((t, k), dtype=np.float32)
    args = (env.up(x), env.up(ids), env.up(w), env.up(gu), env.up(dn))
    monkeypatch.setattr(cuda_moe, "MOE_UNROLLED_MAX_T", 4 if unrolled else 0)
    best, o = _best_time(env, lambda: ops.moe_experts(*args), reps=5, graph=True)
    out = env.host(o)
    ref = cpu.moe_experts(x, ids, w, F32Experts(gu), F32Experts(dn))
    close(out, ref, TOL32 * 10)
    if i == 512:
        print(f"\nMoE decode experts T={t} k={k} I={i} H={h} ({kind}): "
              f"{best * 1e6:.1f} us")


@pytest.mark.parametrize("start,t", [(0, 1), (3000, 1), (700, 3), (0, 300), (300, 77)])
def test_attention_int8_kv(env, rng, start, t):
    """INT8-G64 caches: codes and scales written exactly like ops.cpu, attention on them (the
    GEMM path gathers dequantised bf16 keys / values for prefill)."""
    ops = env.fresh()
    s, hq, hkv, d = 4096, 24, 4, 256
    kc, vc = np.zeros((s, hkv, d), np.int8), np.zeros((s, hkv, d), np.int8)
    ks, vs = np.zeros((s, hkv, d // 64), np.float32), np.zeros((s, hkv, d // 64), np.float32)
    pre_k, pre_v = rnd(rng, start + t, hkv, d), rnd(rng, start + t, hkv, d)
    cpu.kv_store(kc, vc, pre_k, pre_v, np.arange(start + t), ks, vs)   # earlier context
    KC, VC, KS, VS = env.up(kc), env.up(vc), env.up(ks), env.up(vs)
    pos = np.arange(start, start + t, dtype=np.int32)
    k, v = rnd(rng, t, hkv, d), rnd(rng, t, hkv, d)
    P = env.up(pos)
    ops.kv_store(KC, VC, env.up(k), env.up(v), P, KS, VS)
    cpu.kv_store(kc, vc, k, v, pos, ks, vs)
    assert np.array_equal(env.host(KC), kc) and np.array_equal(env.host(VC), vc)
    close(env.host(KS), ks, 0)
    q = rnd(rng, t, hq, d)
    o = env.host(ops.attention(env.up(q), KC, VC, P, d ** -0.5, KS, VS))
    kf = kc.astype(np.float32) * np.repeat(ks, 64, axis=-1)
    vf = vc.astype(np.float32) * np.repeat(vs, 64, axis=-1)
    close(cpu.attention(q, kc, vc, pos, d ** -0.5, ks, vs), cpu.attention(q, kf, vf, pos, d ** -0.5), TOL32)
    _check_attention(o, q, kf, vf, pos, d ** -0.5, "simt" if t <= 16 else "gemm")



def _rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("state_kernel", ["simt", "mma"])
@pytest.mark.parametrize("t,hk,hv", [(1024, 16, 48), (1000, 16, 48), (777, 16, 32)])
def test_gated_delta_rule_chunked_model_dims(env, rng, t, hk, hv, state_kernel):
    """Chunked WY kernels (kernels/gdn/gdn_chunked.py, the TF32 state pass of gdn_chunked_mma.py)
    at the Qwen3.6-27B (Hv=48) and 35B-A3B (Hv=32) GDN shapes, Dk = Dv = 128, vs the recurrent
    NumPy reference: outputs and final state (errors printed with -s)."""
    dk = dv = 128
    ops = env.fresh()
    ops.choices = replace(ops.choices, gdn_state=state_kernel, gdn_prepare=state_kernel)   # both TF32, or both fp32
    q, k, v = rnd(rng, t, hk, dk), rnd(rng, t, hk, dk), rnd(rng, t, hv, dv)
    g = -np.abs(rnd(rng, t, hv, scale=0.5))
    beta = (1.0 / (1.0 + np.exp(-rnd(rng, t, hv)))).astype(np.float32)
    st = rnd(rng, hv, dv, dk, scale=0.1)
    ST = env.up(st)
    st_ref = st.copy()
    o = env.host(ops.gated_delta_rule_chunked(env.up(q), env.up(k), env.up(v), env.up(g), env.up(beta), ST))
    ref = cpu.gated_delta_rule(q, k, v, g, beta, st_ref)
    print(f"\ngated delta rule chunked ({state_kernel}) T={t} Hv={hv}: error / max |value|: "
          f"output {_rel_err(o, ref):.2e}, state {_rel_err(env.host(ST), st_ref):.2e}")
    tol = TOL_TF32 if state_kernel == "mma" else TOL32 * 10
    close(o, ref, tol)
    close(env.host(ST), st_ref, tol)


def test_gated_delta_rule_chunked_vs_recurrent_timing(env, rng):
    """27B GDN layer, T = 8192: the recurrent kernel and the chunked pair with each state pass
    agree; prints the times (-s), and the prepare kernel's alone."""
    import time

    t, hk, hv, dk, dv = 8192, 16, 48, 128, 128
    ops = env.fresh()
    q, k, v = env.up(rnd(rng, t, hk, dk)), env.up(rnd(rng, t, hk, dk)), env.up(rnd(rng, t, hv, dv))
    g = env.up(-np.abs(rnd(rng, t, hv, scale=0.5)))
    beta = env.up((1.0 / (1.0 + np.exp(-rnd(rng, t, hv)))).astype(np.float32))
    st = rnd(rng, hv, dv, dk, scale=0.1)
    times = {}
    res = {}
    for name in ("recurrent", "simt", "mma"):
        if name != "recurrent":                            # the recurrent kernel takes no choice
            ops.choices = replace(ops.choices, gdn_state=name, gdn_prepare="simt" if name == "simt" else "mma")
        fn = ops.gated_delta_rule if name == "recurrent" else ops.gated_delta_rule_chunked
        ST = env.up(st)
        o = fn(q, k, v, g, beta, ST)                       # warm-up (compiles)
        best = float("inf")
        for _ in range(3):
            ST2 = env.up(st)
            env.stream.synchronize()
            t0 = time.perf_counter()
            o = fn(q, k, v, g, beta, ST2)
            env.stream.synchronize()
            best = min(best, time.perf_counter() - t0)
        times[name] = best
        res[name] = (env.host(o), env.host(ST2))
    # the chunk-parallel prepare kernel alone (the sequential state kernel is the rest)
    from ninfer_nb.kernels.gdn import gdn_chunked as K_gdc

    nc = (t + K_gdc.C - 1) // K_gdc.C
    bufs = (ops.empty((hv, t, dk)), ops.empty((hv, t, dk)), ops.empty((hv, t, dv)), ops.empty((hv, t)),
            ops.empty((hv, nc)), ops.empty((t, hv, dv)))
    prep = float("inf")
    for _ in range(3):
        env.stream.synchronize()
        t0 = time.perf_counter()
        ops._go(K_gdc.gdc_prepare_kernel, (nc, hk), K_gdc.PREP_THREADS, q, k, v, g, beta, *bufs)
        env.stream.synchronize()
        prep = min(prep, time.perf_counter() - t0)
    print(f"\ngated delta rule T={t} Hv={hv}: recurrent {times['recurrent'] * 1e3:.2f} ms, "
          f"chunked with the SIMT state pass {times['simt'] * 1e3:.2f} ms, with the TF32 state pass "
          f"{times['mma'] * 1e3:.2f} ms (prepare kernel {prep * 1e3:.2f} ms); TF32 error / max |value|: "
          f"output {_rel_err(res['mma'][0], res['recurrent'][0]):.2e}, "
          f"state {_rel_err(res['mma'][1], res['recurrent'][1]):.2e}")
    close(res["simt"][0], res["recurrent"][0], TOL32 * 10)
    close(res["simt"][1], res["recurrent"][1], TOL32 * 10)
    close(res["mma"][0], res["recurrent"][0], TOL_TF32)
    close(res["mma"][1], res["recurrent"][1], TOL_TF32)


@pytest.mark.parametrize("kind", ["flash", "gemm", "simt"])
@pytest.mark.parametrize("cdtype", [np.float32, BF16])
def test_attention_prefill_qwen27b_second_chunk(env, rng, cdtype, kind):
    """Prefill attention at the Qwen3.6-27B shape (24 q / 4 kv heads x 256): a 512-token chunk
    at positions 1536..2047 over a cache whose earlier rows hold random keys and whose later
    rows hold NaN (never to be read)."""
    ops = env.fresh()
    s, hq, hkv, d, start, t = 2048, 24, 4, 256, 1536, 512
    s = 2304
    kc = rnd(rng, s, hkv, d).astype(cdtype)
    vc = rnd(rng, s, hkv, d).astype(cdtype)
    kc[start + t:], vc[start + t:] = np.nan, np.nan
    pos = np.arange(start, start + t, dtype=np.int32)
    q = rnd(rng, t, hq, d)
    with _prefill_kind(ops, kind):
        o = env.host(ops.attention(env.up(q), env.up(kc), env.up(vc), env.up(pos), d ** -0.5))
    _check_attention(o, q, kc.astype(np.float32), vc.astype(np.float32), pos, d ** -0.5, kind)


@pytest.mark.parametrize("hq,hkv", [(24, 4), (16, 2)])
def test_attention_prefill_timing_8k(env, rng, hq, hkv, monkeypatch):
    """Qwen3.6-27B (24/4) and -35B (16/2) heads x 256, a 2048-token chunk at 6144..8191 over a
    bf16 cache: the flash and GEMM paths vs the SIMT kernel's output (2e-2) and times (-s)."""
    ops = env.fresh()
    s, d, start, t = 8192, 256, 6144, 2048
    KC = env.up(rnd(rng, s, hkv, d).astype(BF16))
    VC = env.up(rnd(rng, s, hkv, d).astype(BF16))
    P = env.up(np.arange(start, start + t, dtype=np.int32))
    Q = env.up(rnd(rng, t, hq, d))
    times = {}
    outs = {}
    launched = _launched(ops, monkeypatch)
    for name in ("simt", "gemm", "flash"):
        monkeypatch.setattr(ops, "choices", replace(ops.choices, prefill_attention=name))
        times[name], o = _best_time(env, lambda: ops.attention(Q, KC, VC, P, d ** -0.5))
        outs[name] = env.host(o)
    assert "flash_attn_kernel" in launched, set(launched)
    flops = 4 * hq * d * t * (start + (t + 1) / 2)
    print(f"\nprefill attention T={t} at {start}, Hq={hq} Hkv={hkv} D={d}: "
          + ", ".join(f"{k} {v * 1e3:.2f} ms ({flops / v * 1e-12:.1f} TFLOP/s)" for k, v in times.items()))
    close(outs["gemm"], outs["simt"], 2e-2)
    close(outs["flash"], outs["simt"], 2e-2)
    close(outs["flash"], outs["gemm"], 1e-2)


# --- grouped MoE on the tensor cores: x and h are bf16 MMA operands, fp32 accumulate ------------
def _moe_ref_bf16(x, ids, w, gu, dn):
    """ops.cpu.moe_experts with bf16-rounded x and bf16-rounded SwiGLU rows h (the MMA operands
    of kernels/moe/moe_grouped.py), so the kernel is checked tightly."""
    xb = x.astype(BF16).astype(np.float32)
    out = np.zeros_like(x, dtype=np.float32)
    for e in np.unique(ids):
        rows, slots = np.nonzero(ids == e)
        hb = cpu.swiglu(xb[rows] @ gu[e].astype(np.float32).T).astype(BF16).astype(np.float32)
        out[rows] += (hb @ dn[e].astype(np.float32).T) * w[rows, slots][:, None]
    return out


MOE_PATHS = ("grouped", "pipelined", "wgmma")


def _moe_path(ops, path, monkeypatch):
    """Pin CudaOps' prefill MoE GEMMs: moe_grouped's mma.sync, moe_pipelined's, or (cc 9.0)
    moe_wgmma's; shapes a path cannot run fall back to the next simpler one."""
    if path == "wgmma":
        from ninfer_nb.runtime import device

        cc = tuple(device.select("cuda:0").compute_capability)
        if cc != (9, 0):
            pytest.skip(f"wgmma needs a cc 9.0 GPU (this is {cc})")
    monkeypatch.setattr(cuda_moe, "MOE_PIPELINED_MIN_PAIRS", 1 << 30 if path == "grouped" else 0)
    monkeypatch.setattr(ops, "use_wgmma", path == "wgmma")


def _one_token(ops, mode: str, ways: int, blocks: int, X, NW, W, bias, out, has_bias: bool = True,
               warps: int = K_lin.GEMV_WARPS) -> None:
    """Launch one build of kernels/linear/linear.py gemv_one_token (as ops._one_token does, any build)."""
    n, k = W.shape
    pairs = n // 2 if mode == "swiglu" else (n + 1) // 2
    per_block = warps // ways
    ops._go(K_lin.gemv_one_token(mode, ways, blocks, warps), (pairs + per_block - 1) // per_block,
            32 * warps, X, NW, np.float32(1e-6), W, bias, out, np.int32(has_bias))


def _launched(ops, monkeypatch) -> list[str]:
    """The names of the kernels ops launches from now on (which path the dispatcher took)."""
    names: list[str] = []
    go = ops._go

    def rec(spec, *a, **kw):
        names.append(spec.name)
        go(spec, *a, **kw)

    monkeypatch.setattr(ops, "_go", rec)
    return names


@pytest.mark.parametrize("t,e,k,i,h,shared", [(2048, 256, 8, 512, 2048, True), (512, 256, 8, 512, 2048, False),
                                              (70, 16, 4, 36, 100, False), (100, 8, 2, 96, 160, False),
                                              (100, 8, 2, 128, 192, False)])
@pytest.mark.parametrize("path", MOE_PATHS)
def test_moe_grouped_mma(env, rng, t, e, k, i, h, shared, path, monkeypatch):
    """Grouped path with the mma.sync GEMMs of moe_grouped.py, (pipelined) the cp.async /
    ldmatrix GEMM of moe_pipelined.py, or (wgmma) the 64-row wgmma tiles of moe_wgmma.py with
    the SwiGLU in the gate_up epilogue. Case 4: ragged column tiles, K = 160 / 96, half-empty
    row tiles (pipelined; wgmma falls back to it); the 36 x 100 case keeps moe_grouped; case 5
    (I = 128, H = 192) runs wgmma with a ragged down column tile. First case: the Qwen3.6-35B-A3B prefill chunk
    (T = 2048, E = 256 routed + the shared expert folded in as expert 256, k = 8 + 1: expert 256
    owns 2048 rows = 32 full row tiles); vs the bf16-operand reference (tight) and the fp32 one
    (bf16 rounding of x and h: loose); bitwise reproducible; prints the time of one call."""
    import time

    from ninfer_nb.kernels.moe import moe_grouped as G

    assert t >= G.GROUPED_MIN_T
    ops = env.fresh()
    _moe_path(ops, path, monkeypatch)
    n_exp = e + int(shared)
    gu, dn = rnd_bf16(rng, n_exp, 2 * i, h), rnd_bf16(rng, n_exp, h, i)
    x = rnd(rng, t, h)
    ids_d, w_d = ops.moe_route(env.up(rnd(rng, t, e + int(shared), scale=2.0)), k, True, shared)
    ids, w = env.host(ids_d), env.host(w_d)
    if shared:
        assert (ids[:, -1] == e).all()
    X, GU, DN = env.up(x), env.up(gu), env.up(dn)
    launched = _launched(ops, monkeypatch)
    out = env.host(ops.moe_experts(X, ids_d, w_d, GU, DN))
    expect = {"grouped": "moe_grouped_gate_up_kernel", "pipelined": "moe_mma_grouped_kernel",
              "wgmma": "moe_wgmma_gate_up_kernel"}[path]
    if i % 64 == 0 and h % 64 == 0:             # every path runs these shapes (else: a fallback)
        assert expect in launched, launched
    # vs the bf16-operand reference: 6.8e-4 / 8.3e-4 on the H200, from h values whose fp32 sums
    # land on the other side of a bf16 rounding boundary; a wrong row or tile is O(1) off.
    close(out, _moe_ref_bf16(x, ids, w, gu, dn), 2e-3)     # fp32-activation reference: ~2e-3 off
    close(out, cpu.moe_experts(x, ids, w, F32Experts(gu), F32Experts(dn)), 2e-2)
    assert np.array_equal(env.host(ops.moe_experts(X, ids_d, w_d, GU, DN)), out)
    best = float("inf")
    for _ in range(3):
        env.stream.synchronize()
        t0 = time.perf_counter()
        ops.moe_experts(X, ids_d, w_d, GU, DN)
        env.stream.synchronize()
        best = min(best, time.perf_counter() - t0)
    print(f"\ngrouped mma MoE ({path}) T={t} E={n_exp} k={ids.shape[1]} I={i} H={h}: "
          f"{best * 1e3:.2f} ms "
          f"({2 * t * ids.shape[1] * 3 * i * h / best / 1e12:.1f} TFLOP/s)")


@pytest.mark.parametrize("path", MOE_PATHS)
def test_moe_grouped_mma_skewed(env, rng, monkeypatch, path):
    """Skewed routing at the 35B-A3B shape (expert 7 in every token, experts >= 64 unused) with
    the mma.sync GEMMs: vs the bf16-operand reference and vs the per-pair (fp32 activation)
    kernels, which differ from it by the bf16 rounding of x and h."""
    from ninfer_nb.kernels.moe import moe_grouped as G

    t, e, k, i, h = 300, 256, 8, 512, 2048
    ops = env.fresh()
    _moe_path(ops, path, monkeypatch)
    gu, dn = rnd_bf16(rng, e, 2 * i, h), rnd_bf16(rng, e, h, i)
    x = rnd(rng, t, h)
    logits = rnd(rng, t, e, scale=2.0)
    logits[:, 64:] -= 40.0
    logits[:, 7] = logits[:, :64].max(axis=1) + 0.5
    ids_d, w_d = ops.moe_route(env.up(logits), k, True)
    ids, w = env.host(ids_d), env.host(w_d)
    assert (ids == 7).any(axis=1).all() and ids.max() < 64
    X, GU, DN = env.up(x), env.up(gu), env.up(dn)
    launched = _launched(ops, monkeypatch)
    out = env.host(ops.moe_experts(X, ids_d, w_d, GU, DN))
    assert {"grouped": "moe_grouped_gate_up_kernel", "pipelined": "moe_mma_grouped_kernel",
            "wgmma": "moe_wgmma_gate_up_kernel"}[path] in launched, launched
    close(out, _moe_ref_bf16(x, ids, w, gu, dn), 2e-3)     # fp32-activation reference: ~2e-3 off
    monkeypatch.setattr(G, "GROUPED_MIN_T", 1 << 30)            # the per-pair (decode) kernels
    close(env.host(ops.moe_experts(X, ids_d, w_d, GU, DN)), out, 2e-2)


# --- tensor-core prepare kernel of the chunked gated delta rule (kernels/gdn/gdn_prepare_mma.py) ---

@pytest.mark.parametrize("t", [2048, 2000])
def test_gdn_prepare_mma_27b(env, rng, t):
    """The TF32 prepare kernel (kernels/gdn/gdn_prepare_mma.py) at the Qwen3.6-27B GDN shape (Hk = 16,
    Hv = 48, Dk = Dv = 128; T = 2000: a 16-token last chunk): its six outputs W, Q', U, ks, ec,
    O_intra against gdc_prepare_kernel's (fp32 SIMT), and the chunked pair with it (TF32 state
    pass) against the recurrent NumPy reference. Prints (-s) the errors and the GPU time of
    either prepare kernel alone (graph replays, no launch gaps)."""
    from ninfer_nb.kernels.gdn import gdn_chunked as K_gdc
    from ninfer_nb.kernels.gdn import gdn_prepare_mma as K_gdp

    hk, hv, dk, dv = 16, 48, 128, 128
    ops = env.fresh()
    q, k, v = rnd(rng, t, hk, dk), rnd(rng, t, hk, dk), rnd(rng, t, hv, dv)
    g = -np.abs(rnd(rng, t, hv, scale=0.5))
    beta = (1.0 / (1.0 + np.exp(-rnd(rng, t, hv)))).astype(np.float32)
    Q, K, V, G, B = env.up(q), env.up(k), env.up(v), env.up(g), env.up(beta)
    nc = (t + K_gdc.C - 1) // K_gdc.C

    def prepare(kind):
        bufs = (ops.empty((hv, t, dk)), ops.empty((hv, t, dk)), ops.empty((hv, t, dv)), ops.empty((hv, t)),
                ops.empty((hv, nc)), ops.empty((t, hv, dv)))
        if kind == "mma":
            ops._go(K_gdp.gdc_prepare_mma_kernel, (nc, hk), K_gdp.THREADS, Q, K, V, G, B, *bufs,
                    smem=K_gdp.SMEM_BYTES)
        else:
            ops._go(K_gdc.gdc_prepare_kernel, (nc, hk), K_gdc.PREP_THREADS, Q, K, V, G, B, *bufs)
        return bufs

    outs = {kind: [env.host(b) for b in prepare(kind)] for kind in ("simt", "mma")}
    errs = []
    for name, a, b in zip(("W", "Q'", "U", "ks", "ec", "O_intra"), outs["mma"], outs["simt"]):
        errs.append(f"{name} {_rel_err(a, b):.2e}")
        close(a, b, TOL_TF32)
    times = {kind: _best_time(env, lambda kind=kind: prepare(kind), graph=True)[0] for kind in ("simt", "mma")}

    ops.choices = replace(ops.choices, gdn_state="mma", gdn_prepare="mma")
    st = rnd(rng, hv, dv, dk, scale=0.1)
    ST = env.up(st)
    o = env.host(ops.gated_delta_rule_chunked(Q, K, V, G, B, ST))
    st_ref = st.copy()
    ref = cpu.gated_delta_rule(q, k, v, g, beta, st_ref)
    print(f"\ngdn prepare T={t} Hv={hv}: SIMT {times['simt'] * 1e3:.3f} ms, TF32 mma {times['mma'] * 1e3:.3f} ms; "
          f"error / max |value| vs the SIMT kernel: {', '.join(errs)}; chunked pair (both TF32) vs recurrent: "
          f"output {_rel_err(o, ref):.2e}, state {_rel_err(env.host(ST), st_ref):.2e}")
    close(o, ref, TOL_TF32)
    close(env.host(ST), st_ref, TOL_TF32)


@pytest.mark.parametrize("t,hk,hv,dk,dv", [(100, 2, 4, 64, 48), (77, 1, 3, 48, 36), (130, 1, 2, 128, 160)])
def test_gdn_prepare_mma_ragged(env, rng, t, hk, hv, dk, dv):
    """The TF32 prepare kernel's edges against the fp32 pair: partial last chunks, Dk < 128 with a
    partial 32-column group (48), Dv not a multiple of 8 (36), Dv > 128 (two V column passes)."""
    ops = env.fresh()
    q, k, v = rnd(rng, t, hk, dk), rnd(rng, t, hk, dk), rnd(rng, t, hv, dv)
    g = -np.abs(rnd(rng, t, hv, scale=0.5))
    beta = (1.0 / (1.0 + np.exp(-rnd(rng, t, hv)))).astype(np.float32)
    st = rnd(rng, hv, dv, dk, scale=0.1)
    res = {}
    for prep in ("simt", "mma"):
        ops.choices = replace(ops.choices, gdn_state="simt", gdn_prepare=prep)
        ST = env.up(st)
        res[prep] = (env.host(ops.gated_delta_rule_chunked(env.up(q), env.up(k), env.up(v), env.up(g), env.up(beta),
                                                           ST)), env.host(ST))
    st_ref = st.copy()
    ref = cpu.gated_delta_rule(q, k, v, g, beta, st_ref)
    close(res["simt"][0], ref, TOL32 * 10)
    close(res["mma"][0], ref, TOL_TF32)
    close(res["mma"][1], st_ref, TOL_TF32)
