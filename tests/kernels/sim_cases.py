"""Simulator cases (run by test_simulator.py in a subprocess with NUMBA_ENABLE_CUDASIM=1):
CudaOps over NumPy arrays vs ops.cpu, tiny shapes, for the simulator-safe kernels."""
from __future__ import annotations

import os
from dataclasses import replace

assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "run through test_simulator.py"

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from ninfer_nb.models.rope import plain_table  # noqa: E402
from ninfer_nb.ops import cpu  # noqa: E402
from ninfer_nb.ops.cuda import CudaOps  # noqa: E402
from tests.support.cuda_helpers import HostArena, SimStream  # noqa: E402

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


@pytest.mark.parametrize("mode,builds", [("plain", ((1, 2, 8), (2, 3, 8), (8, 4, 8), (1, 5, 4), (2, 6, 4), (4, 6, 4))),
                                         ("normed", ((1, 2, 8), (4, 2, 8), (1, 4, 4), (2, 8, 2))),
                                         ("swiglu", ((2, 2, 8), (1, 4, 4)))])
def test_gemv_one_token(ops, mode, builds):
    """kernels/linear/linear.py gemv_one_token (the decode step's GEMVs; ptx_sim stands in for the
    16-byte loads and shuffles) at several K splits vs NumPy. K = 2312: two full passes of
    1024 columns, then the tail loop's 256-column chunk and, for lane 0 only, 8 columns; at 2, 4
    and 8 slices uneven slices (8: the last three empty). N = 11 (a lone last row; swiglu: I =
    5), so the last block has dead row pairs. plain adds into its bias, aliased as out (the
    residual stream); normed and swiglu fuse the RMSNorm. Builds: (K slices, blocks per SM,
    warps per block)."""
    from ninfer_nb.kernels.linear import linear as K_lin

    rng = np.random.default_rng(31)
    n, k = (10, 2312) if mode == "swiglu" else (11, 2312)
    w = rnd(rng, n, k).astype(BF16)
    x, nw, r = rnd(rng, 1, k), rnd(rng, k), rnd(rng, 1, n)
    wf = w.astype(np.float32)
    if mode == "plain":
        ref = r + cpu.linear(x, wf)
    elif mode == "normed":
        ref = cpu.linear(cpu.rms_norm(x, nw, 1e-6), wf)
    else:
        ref = cpu.linear_swiglu(cpu.rms_norm(x, nw, 1e-6), wf)
    for ways, blocks, warps in builds:
        out = r.copy() if mode == "plain" else np.full((1, ref.shape[1]), np.nan, np.float32)
        pairs = n // 2 if mode == "swiglu" else (n + 1) // 2
        per_block = warps // ways
        ops._go(K_lin.gemv_one_token(mode, ways, blocks, warps), (pairs + per_block - 1) // per_block,
                32 * warps, x, nw, np.float32(1e-6), w.view(np.uint16), out.reshape(-1), out,
                np.int32(mode == "plain"))
        close(out, ref, 1e-5)


@pytest.mark.parametrize("t", [1, 5])
def test_gemv_multi_token(ops, t):
    """kernels/linear/linear.py's GEMVs for up to 16 tokens (4 per pass; T = 5: a full pass and a
    one-token one) vs NumPy: gemv_bf16_kernel (vectorised and scalar paths), the split-K
    kernels (2 and 4 slices, K = 2312 as in test_gemv_one_token: uneven slices, the last of 4
    holding 8 columns) with the residual as bias, and the SwiGLU GEMV."""
    from ninfer_nb.kernels.linear import linear as K_lin

    rng = np.random.default_rng(37)
    n, k = 11, 2312
    w = rnd(rng, n, k).astype(BF16)
    wu = w.view(np.uint16)
    x, b = rnd(rng, t, k), rnd(rng, n)
    ref = cpu.linear(x, w.astype(np.float32), b)
    g = K_lin.GEMV_WARPS * 32
    for vec in (1, 0):
        out = np.full((t, n), np.nan, np.float32)
        ops._go(K_lin.gemv_bf16_kernel, -(-n // K_lin.GEMV_ROWS_PER_BLOCK), g, x, wu, b, out, np.int32(1),
                np.int32(vec))
        close(out, ref, 1e-5)
    for spec, ways in ((K_lin.gemv_bf16_splitk2_kernel, 2), (K_lin.gemv_bf16_splitk_kernel, 4)):
        out = np.full((t, n), np.nan, np.float32)
        ops._go(spec, -(-n // K_lin.splitk_rows_per_block(ways)), g, x, wu, b, out, np.int32(1))
        close(out, ref, 1e-5)
    gu = rnd(rng, 10, k).astype(BF16)
    h = np.full((t, 5), np.nan, np.float32)
    ops._go(K_lin.gemv_bf16_swiglu_kernel, 1, g, x, gu.view(np.uint16), h)
    close(h, cpu.linear_swiglu(x, gu.astype(np.float32)), 1e-5)


def test_rope(ops):
    rng = np.random.default_rng(5)
    x = rnd(rng, 3, 2, 16)
    pos = np.array([0, 7, 123456], dtype=np.int32)
    table = plain_table(8, 1e7)
    close(ops.rope(x, pos, table), cpu.rope(x, pos, table))


@pytest.mark.parametrize("cdtype", [np.float32, BF16])
@pytest.mark.parametrize("norm", [False, True])
def test_qk_norm_rope_store(ops, cdtype, norm):
    """The fused attention prologue vs ops.cpu: rotated q, and the cache rows it wrote (a bf16
    cache holds the rounded k / v); rows it must not touch stay as they were."""
    rng = np.random.default_rng(8)
    s, hkv, hq, d, t, rot = 12, 2, 6, 24, 3, 16
    q, k, v = rnd(rng, t, hq, d), rnd(rng, t, hkv, d), rnd(rng, t, hkv, d)
    qn, kn = (rnd(rng, d), rnd(rng, d)) if norm else (None, None)
    pos = np.array([0, 5, 9], dtype=np.int32)
    kc, vc = rnd(rng, s, hkv, d).astype(cdtype), rnd(rng, s, hkv, d).astype(cdtype)
    kc_ref, vc_ref = kc.astype(np.float32), vc.astype(np.float32)
    table = plain_table(rot, 1e6)
    got = ops.qk_norm_rope_store(q, k, v, qn, kn, pos, table, 1e-6, kc, vc)
    ref = cpu.qk_norm_rope_store(q, k, v, qn, kn, pos, table, 1e-6, kc_ref, vc_ref)
    close(got, ref)
    # k: cos / sin of the reduced angle in fp32 here, in float64 by NumPy: ~1e-7 apart, or one bf16 step
    close(kc.astype(np.float32), kc_ref.astype(cdtype).astype(np.float32), 1e-6 if cdtype == np.float32 else 8e-3)
    close(vc.astype(np.float32), vc_ref.astype(cdtype).astype(np.float32), 0)


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


@pytest.mark.parametrize("hq,hkv,d,t,sm_count", [(6, 2, 64, 2, 1), (8, 1, 256, 1, 132)])
def test_decode_attention_mma(ops, hq, hkv, d, t, sm_count):
    """attn_split_mma_d{64, 256}_kernel (bf16 caches' decode attention: tensor cores, a block per (split, kv head))
    + the combine kernel with the output gate, vs ops.cpu on a bf16 cache whose rows past the
    last position hold NaN. (6, 2, 64, 2, 1): G = 3 of the mma's 8 head columns, two kv heads,
    two tokens, one split of 100 / 101 keys (each warp walks one or two 16-key tiles, the
    next one's loads issued at the end of the last; warp 2's second tile partly past the keys); (8, 1, 256, 1, 132): all 8 columns, every k-step and m-tile of D = 256, 13 splits of
    64 keys of which 3 hold keys (the last one 23: one full and one partial warp tile); the
    other 10 blocks return at once and the combine (given the kernel's minimum split) skips them. Q, K, V and P are rounded to bf16, hence the tolerance."""
    rng = np.random.default_rng(19)
    s = 200
    last = 150 if t == 1 else 100
    pos = np.arange(last - t + 1, last + 1, dtype=np.int32)
    kc = rnd(rng, s, hkv, d).astype(BF16)
    vc = rnd(rng, s, hkv, d).astype(BF16)
    kc[last + 1:] = np.nan
    vc[last + 1:] = np.nan
    q, gate = rnd(rng, t, hq, d), rnd(rng, t, hq * d)
    ops.sm_count = sm_count
    names = []
    go = ops._go

    def rec(spec, *a, **kw):
        names.append(spec.name)
        go(spec, *a, **kw)

    ops._go = rec
    out = ops.empty((t, hq, d))
    ops._attention_decode(q, kc, vc, q, q, pos, d ** -0.5, gate, out)
    assert names == [f"attn_split_mma_d{d}_kernel", "attn_combine_kernel"]
    ref = cpu.attention_gated(q, kc.astype(np.float32), vc.astype(np.float32), pos, d ** -0.5, gate)
    close(out.reshape(t, hq * d), ref, 2e-2)


def test_attention_combine_many_splits(ops):
    """attn_combine_kernel alone vs NumPy: 40 allocated splits, of which 34 / 27 (tokens 0 / 1,
    min split 16: three and two 16-split load chunks, the last one partial) or 9 / 7 (min split
    64) hold keys; the others hold NaN (first pass) or stale values, which the kernel must not
    read. With the output gate; D = 48 (threads past D only load)."""
    from ninfer_nb.kernels.attention import attention as K_attn

    rng = np.random.default_rng(23)
    t, hq, ns, d = 2, 3, 40, 48
    pos = np.array([540, 420], dtype=np.int32)
    part_o = np.full((t, hq, ns, d), np.nan, np.float32)
    part_ml = np.full((t, hq, ns, 2), np.nan, np.float32)
    gate = rnd(rng, t, hq * d)
    for min_split in (16, 64):
        want = np.empty((t, hq, d), np.float32)
        for i in range(t):
            n_keys = int(pos[i]) + 1
            split_len = max(-(-n_keys // ns), min_split)
            live = min(ns, -(-n_keys // split_len))
            part_o[i, :, :live] = rnd(rng, hq, live, d)
            part_ml[i, :, :live, 0] = rnd(rng, hq, live, scale=3.0)
            part_ml[i, :, :live, 1] = rng.uniform(0.5, 2.0, (hq, live)).astype(np.float32)
            m = part_ml[i, :, :live, 0].astype(np.float64)
            wt = np.exp(m - m.max(axis=1, keepdims=True))                     # [Hq, live]
            o = (wt[:, :, None] * part_o[i, :, :live]).sum(1) / (wt * part_ml[i, :, :live, 1]).sum(1)[:, None]
            want[i] = o / (1.0 + np.exp(-gate[i].reshape(hq, d)))
        out = ops.empty((t, hq, d))
        ops._go(K_attn.attn_combine_kernel, (hq, t), K_attn.COMBINE_THREADS, part_o, part_ml, pos, gate,
                np.int32(1), np.int32(min_split), out)
        close(out, want, 1e-5)


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


# --- grouped-by-expert MoE (kernels/moe/moe_grouped.py; the simulator always takes this path) ------
def _small_blocks(monkeypatch, sort_threads, chunk=None):
    """Smaller bookkeeping / combine blocks: faster in the simulator, and E > block exercises
    the strided expert loops and the carried scan (the GEMM blocks stay 256 threads)."""
    from ninfer_nb.kernels.moe import moe_grouped as G

    monkeypatch.setattr(G, "SORT_THREADS", sort_threads)
    monkeypatch.setattr(G, "COMBINE_THREADS", 32)
    if chunk is not None:
        monkeypatch.setattr(G, "SORT_CHUNK", chunk)
    return G


def test_moe_grouped_bookkeeping(ops, monkeypatch):
    """hist -> scan -> scatter: per-expert offsets, row-tile offsets and a stable expert sort."""
    G = _small_blocks(monkeypatch, 16, chunk=64)
    rng = np.random.default_rng(21)
    e, p = 40, 300                                       # E > block (16), 5 chunks of 64 pairs
    ids = rng.choice([x for x in range(e) if x % 7], p).astype(np.int32)   # experts 0, 7, ... unused
    ids[:150:2] = 5                                      # one expert with 75 pairs: two row tiles
    n_chunks = (p + G.SORT_CHUNK - 1) // G.SORT_CHUNK
    hist = np.zeros((n_chunks, e), np.int32)
    offs, tile_off, order = np.zeros(e + 1, np.int32), np.zeros(e + 1, np.int32), np.zeros(p, np.int32)
    ops._go(G.moe_hist_kernel, n_chunks, G.SORT_THREADS, ids, hist)
    ops._go(G.moe_scan_kernel, 1, G.SORT_THREADS, hist, offs, tile_off)
    ops._go(G.moe_scatter_kernel, n_chunks, G.SORT_THREADS, ids, hist, offs, order)
    counts = np.bincount(ids, minlength=e)
    np.testing.assert_array_equal(offs, np.concatenate([[0], np.cumsum(counts)]))
    np.testing.assert_array_equal(tile_off, np.concatenate([[0], np.cumsum((counts + G.BM - 1) // G.BM)]))
    np.testing.assert_array_equal(order, np.argsort(ids, kind="stable"))
    assert tile_off[-1] <= G.max_row_tiles(p, e)


def test_moe_pipelined_helpers(ops):
    """kernels/moe/moe_pipelined.py's simulator-safe steps: 128-row tile offsets from the row
    offsets, the expert-sorted bf16 gather of x, SwiGLU to bf16 (its GEMM is GPU-only)."""
    from ninfer_nb.kernels.moe import moe_pipelined as M

    rng = np.random.default_rng(23)
    counts = np.array([0, 300, 1, 128, 129, 0, 7], np.int32)
    offs = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    tile_off = np.zeros(counts.size + 1, np.int32)
    ops._go(M.moe_tile_offsets_kernel, 1, 32, offs, tile_off)
    np.testing.assert_array_equal(tile_off, np.concatenate([[0], np.cumsum((counts + M.BM - 1) // M.BM)]))
    assert tile_off[-1] <= M.max_row_tiles(int(counts.sum()), counts.size)
    t, k, h = 5, 3, 40
    x = rnd(rng, t, h)
    order = rng.permutation(t * k).astype(np.int32)
    xs = np.zeros((t * k, h), np.uint16)
    ops._go(M.moe_gather_bf16_kernel, t * k, 32, x, order, np.int32(k), xs)
    np.testing.assert_array_equal(xs.view(BF16), x[order // k].astype(BF16))
    g = rnd(rng, 6, 2 * 24)
    hb = np.zeros((6, 24), np.uint16)
    ops._go(M.moe_swiglu_bf16_kernel, 2, 32, g, hb)
    close(hb.view(BF16).astype(np.float32), cpu.swiglu(g).astype(BF16).astype(np.float32), 8e-3)


def test_moe_grouped_top4(ops, monkeypatch):
    """top-4, experts 1 and 4 get no tokens, H = 66 (two down column tiles, ragged K = 66 in
    gate_up), I = 20; E > sort block (carried scan)."""
    _small_blocks(monkeypatch, 4)
    _moe_grouped_case(ops, 22, t=4, e=6, k=4, h=66, i=20, unused={1, 4})


def test_moe_grouped_top2_hot_expert(ops, monkeypatch):
    """top-2, expert 2 in every token (65 rows: a full and a 1-row tile), expert 3 unused,
    I = 66 (two gate_up column tiles, ragged K = 66 in down), H = 20; 3 sort chunks."""
    _small_blocks(monkeypatch, 32, chunk=64)
    _moe_grouped_case(ops, 23, t=65, e=4, k=2, h=20, i=66, unused={3}, hot=2)


# --- tiled GQA prefill attention (kernels/attention/attention.py attn_prefill_kernel) --------------------

def _prefill_attn_case(ops, seed, cache, hq, hkv, d, start, t):
    """A prefill chunk at positions start..start+t-1 over a cache that already holds random keys
    for earlier positions (and 3 random rows past the chunk, which must stay unseen)."""
    rng = np.random.default_rng(seed)
    s = start + t + 3
    q = rnd(rng, t, hq, d)
    kf, vf = rnd(rng, s, hkv, d), rnd(rng, s, hkv, d)
    pos = np.arange(start, start + t, dtype=np.int32)
    scale = d ** -0.5
    if cache == "int8":
        kc, vc = np.zeros((s, hkv, d), np.int8), np.zeros((s, hkv, d), np.int8)
        ks, vs = np.zeros((s, hkv, d // 64), np.float32), np.zeros((s, hkv, d // 64), np.float32)
        cpu.kv_store(kc, vc, kf, vf, np.arange(s, dtype=np.int32), ks, vs)
        assert kc.any() and ks.all()
        close(ops.attention(q, kc, vc, pos, scale, ks, vs), cpu.attention(q, kc, vc, pos, scale, ks, vs))
    else:
        dt = np.float32 if cache == "f32" else BF16
        kc, vc = kf.astype(dt), vf.astype(dt)
        ref = cpu.attention(q, kc.astype(np.float32), vc.astype(np.float32), pos, scale)
        close(ops.attention(q, kc, vc, pos, scale), ref)


def test_prefill_attn_f32_gqa6_d256(ops):
    """G = 6, D = 256 (8 head-dim slices, 4 P.V column blocks); 36 rows in one 64-row tile;
    key tiles 0..31 and 32..35, the second fully masked for the first two tokens."""
    _prefill_attn_case(ops, 41, "f32", hq=6, hkv=1, d=256, start=30, t=6)


def test_prefill_attn_bf16_mha_d64(ops):
    """G = 1, two kv heads (blockIdx.y = 1), bf16 cache, first chunk (start 0), T = 40."""
    _prefill_attn_case(ops, 42, "bf16", hq=2, hkv=2, d=64, start=0, t=40)


def test_prefill_attn_int8_gqa3_d64(ops):
    """G = 3, int8 cache, second chunk at 40: 69 rows = a full 64-row tile and a 5-row tile."""
    _prefill_attn_case(ops, 43, "int8", hq=3, hkv=1, d=64, start=40, t=23)


from numba import cuda as _cuda  # noqa: E402  (the simulator swaps module-level `cuda` only)

from ninfer_nb.kernels.common.ptx import mma_bf16, pack_bf16x2  # noqa: E402


@_cuda.jit
def _one_mma(a, b, c, out):
    lane = _cuda.threadIdx.x
    g = lane >> 2
    t = lane & 3
    fa = (pack_bf16x2(a[g, 2 * t + 1], a[g, 2 * t]), pack_bf16x2(a[g + 8, 2 * t + 1], a[g + 8, 2 * t]),
          pack_bf16x2(a[g, 2 * t + 9], a[g, 2 * t + 8]), pack_bf16x2(a[g + 8, 2 * t + 9], a[g + 8, 2 * t + 8]))
    b0 = pack_bf16x2(b[2 * t + 1, g], b[2 * t, g])
    b1 = pack_bf16x2(b[2 * t + 9, g], b[2 * t + 8, g])
    acc = (c[g, 2 * t], c[g, 2 * t + 1], c[g + 8, 2 * t], c[g + 8, 2 * t + 1])
    acc = mma_bf16(fa, b0, b1, acc)
    acc = mma_bf16(fa, b0, b1, acc)                     # twice: the rendezvous is reusable
    out[g, 2 * t] = acc[0]
    out[g, 2 * t + 1] = acc[1]
    out[g + 8, 2 * t] = acc[2]
    out[g + 8, 2 * t + 1] = acc[3]


def test_mma_emulation_fragment_layout():
    """ptx_sim.mma_bf16 (what tensor-core kernels call under the simulator) computes
    C += A @ B from the PTX ISA m16n8k16 fragment layout, loaded here exactly as a kernel would."""
    rng = np.random.default_rng(11)
    a = rnd(rng, 16, 16).astype(BF16).astype(np.float32)
    b = rnd(rng, 16, 8).astype(BF16).astype(np.float32)
    c = rnd(rng, 16, 8)
    out = np.full((16, 8), np.nan, np.float32)
    _one_mma[1, 32](a, b, c, out)
    close(out, c + 2 * (a @ b), 1e-6)


def _bf16r(x):
    return np.asarray(x, np.float32).astype(BF16).astype(np.float32)


# --- flash prefill attention (kernels/attention/attention_flash.py: ldmatrix, cp.async, mma.sync) --------

def test_prefill_flash_gqa2_d256(ops, monkeypatch):
    """The flash kernel through CudaOps.attention (f32 cache, head dim 256, G = 2, one kv head:
    the GPU tests take the 27B's and 35B's heads), chunk at 50, T = 17: 34 rows = one block
    whose rows past 34 read row 33 and are not written; keys 0..66 = two 64-key tiles (the copy
    pipeline's second round), the second masked per row and zero past key 66. vs ops.cpu on the
    exact inputs (bf16 rounding of Q, K, V, P by design) and on bf16-rounded q, k, v (the
    kernel's own error)."""
    monkeypatch.setattr(ops, "arch", (9, 0))
    assert ops.choices.prefill_attention == "flash"
    names = []
    go = ops._go

    def rec(spec, *a, **kw):
        names.append(spec.name)
        go(spec, *a, **kw)

    monkeypatch.setattr(ops, "_go", rec)
    rng = np.random.default_rng(61)
    hq, hkv, d, start, t = 2, 1, 256, 50, 17
    s = start + t + 5
    q = rnd(rng, t, hq, d)
    kc, vc = rnd(rng, s, hkv, d), rnd(rng, s, hkv, d)
    kc[start + t:] = np.nan                                  # stale cache rows past the chunk
    pos = np.arange(start, start + t, dtype=np.int32)
    scale = d ** -0.5
    got = ops.attention(q, kc, vc, pos, scale)
    assert "flash_attn_kernel" in names, names
    ref = cpu.attention(q, kc[: start + t], vc[: start + t], pos, scale)
    close(got, ref, 2e-2)
    close(got, cpu.attention(_bf16r(q), _bf16r(kc[: start + t]), _bf16r(vc[: start + t]), pos, scale), 6e-3)


# --- grouped MoE with tensor-core GEMMs: x and h are bf16 MMA operands (fp32 accumulate) -------
def _moe_ref_bf16(x, ids, w, gu, dn):
    """ops.cpu.moe_experts on bf16-rounded x and bf16-rounded SwiGLU rows h (what the grouped
    kernels feed the tensor cores), so the comparison can stay tight."""
    xb = x.astype(BF16).astype(np.float32)
    g32, d32 = gu.astype(np.float32), dn.astype(np.float32)
    out = np.zeros_like(x, dtype=np.float32)
    for e in np.unique(ids):
        rows, slots = np.nonzero(ids == e)
        hb = cpu.swiglu(xb[rows] @ g32[e].T).astype(BF16).astype(np.float32)
        out[rows] += (hb @ d32[e].T) * w[rows, slots][:, None]
    return out


def _moe_grouped_case(ops, seed, t, e, k, h, i, unused, hot=None):
    rng = np.random.default_rng(seed)
    pool = [x for x in range(e) if x not in unused and x != hot]
    rows = []
    for _ in range(t):
        r = list(rng.choice(pool, k - (hot is not None), replace=False)) + ([hot] if hot is not None else [])
        rows.append(rng.permutation(r))
    ids = np.array(rows, dtype=np.int32)
    x = rnd(rng, t, h)
    gu, dn = rnd(rng, e, 2 * i, h).astype(BF16), rnd(rng, e, h, i).astype(BF16)
    w = (rng.random((t, k)) + 0.1).astype(np.float32)
    got = ops.moe_experts(x, ids, w, gu, dn)
    close(got, _moe_ref_bf16(x, ids, w, gu, dn), 1e-4)      # same bf16 operands: ~1e-7 seen
    close(got, cpu.moe_experts(x, ids, w, gu.astype(np.float32), dn.astype(np.float32)), 2e-2)


def test_whole_hybrid_model_prefill_chunk_matches_cpu(ops):
    """A tiny dense Qwen3.5 through CudaOps in the simulator against the CPU backend, for a
    prefill chunk that continues a sequence (positions 17..33; the first chunk runs on the CPU
    and its caches are copied over): fused projections and ops.split, one conv over q|k|v with a
    nonzero conv state, the chunked GDN (SIMT state pass) from a nonzero state, GQA prefill
    attention over cached keys, norms. (The MoE pieces have their own cases above: the simulator is too slow for a
    whole MoE model in CI.)"""
    from ninfer_nb.config import ModelConfig
    from ninfer_nb.engine.backend import random_array
    from ninfer_nb.engine.batch import ForwardBatch
    from ninfer_nb.models.decoder import Decoder
    from ninfer_nb.models.presets import PRESETS, random_weights
    from ninfer_nb.models.state import new_state

    cfg = ModelConfig.from_hf(dict(
        PRESETS["tiny-qwen3.5"], vocab_size=96, hidden_size=64, intermediate_size=64,
        num_hidden_layers=2, full_attention_interval=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=32, linear_value_head_dim=32))
    rng = np.random.default_rng(21)
    w = random_weights(cfg, lambda shape, kind: random_array(rng, shape, kind))
    ids = rng.integers(0, cfg.vocab_size, 34)
    # the TF32 state pass and prepare kernel have their own cases (simulated mma: CI time)
    ops.choices = replace(ops.choices, gdn_state="simt", gdn_prepare="simt")
    pos = np.arange(34)
    cpu_state = new_state(cfg, 64, np.zeros)
    Decoder(cfg, w).forward(cpu, ForwardBatch.single(ids[:17], pos[:17]), cpu_state)   # first chunk: CPU
    sim_state = new_state(cfg, 64, lambda shape, dtype=np.float32: ops.zeros(shape, dtype, persistent=True))
    for dst, src in zip(sim_state.layers, cpu_state.layers):
        for name, buf in vars(src).items():
            if buf is not None:
                getattr(dst, name)[...] = buf
    want = Decoder(cfg, w).forward(cpu, ForwardBatch.single(ids[17:], pos[17:], all_logits=True), cpu_state)
    got = Decoder(cfg, w).forward(ops, ForwardBatch.single(ids[17:].astype(np.int32), pos[17:].astype(np.int32),
                                                           all_logits=True), sim_state)
    close(got, want, 1e-4)
    for dst, src in zip(sim_state.layers, cpu_state.layers):              # the caches it leaves
        for name, buf in vars(src).items():
            if buf is not None:
                close(getattr(dst, name)[:34] if name in ("k", "v") else getattr(dst, name),
                      buf[:34] if name in ("k", "v") else buf, 1e-4)


# --- prefill attention through the GEMMs (kernels/attention/attention_gemm.py) -------------------------

@pytest.mark.parametrize("cdtype", [np.float32])   # bf16 / int8 caches: the GPU tests (CI time)
def test_attention_gemm_kernels(ops, cdtype):
    """The gather, softmax and scatter kernels of the GEMM attention path, with the two GEMMs
    done in NumPy on the same bf16 operands: each kernel's output exactly (gathers) or at fp32
    rounding (softmax, scatter), and the composed result against ops.cpu.attention on
    bf16-rounded q, k, v (P's bf16 rounding: 1e-2). Keys past the chunk's last position hold
    NaN in the cache and must not reach the output."""
    from ninfer_nb.kernels.attention import attention_gemm as K

    rng = np.random.default_rng(11)
    t, hq, hkv, d, start = 5, 4, 2, 32, 70           # the kernels take any D (the GEMMs want % 64)
    grp, s_len = hq // hkv, 80
    q = rnd(rng, t, hq, d)
    kf, vf = rnd(rng, s_len, hkv, d), rnd(rng, s_len, hkv, d)
    kf[start + t:], vf[start + t:] = np.nan, np.nan
    kc, vc = kf.astype(cdtype), vf.astype(cdtype)
    if cdtype == BF16:
        kc, vc = kc.view(np.uint16), vc.view(np.uint16)
    pos = np.arange(start, start + t, dtype=np.int32)
    n_keys, lp = start + t, K.padded_keys(start + t)                     # 75 keys -> 128
    rows = t * grp
    qb = np.zeros((hkv, rows, d), np.uint16)
    kb = np.full((hkv, lp, d), 0xFFFF, np.uint16)
    vt = np.full((hkv, d, lp), 0xFFFF, np.uint16)
    K.attn_gather_q_kernel[(rows, hkv), 32, 0](q, qb)
    K.attn_gather_kv_kernel[(lp // K.TILE, d // K.TILE, hkv), (K.TILE, 8), 0](kc, vc, q, q, pos, kb, vt)
    q_grouped = q.reshape(t, hkv, grp, d).transpose(1, 0, 2, 3).reshape(hkv, rows, d)
    np.testing.assert_array_equal(qb, q_grouped.astype(BF16).view(np.uint16))
    k_want = np.zeros((hkv, lp, d), np.float32)
    v_want = np.zeros((hkv, d, lp), np.float32)
    k_want[:, :n_keys] = kf[:n_keys].transpose(1, 0, 2)
    v_want[:, :, :n_keys] = vf[:n_keys].transpose(1, 2, 0)
    np.testing.assert_array_equal(kb, k_want.astype(BF16).view(np.uint16))
    np.testing.assert_array_equal(vt, v_want.astype(BF16).view(np.uint16))

    def wide(a):
        return a.view(BF16).astype(np.float32)

    scale = d ** -0.5
    out = np.full((t * hq, d), np.nan, np.float32)
    for h in range(hkv):
        sc = wide(qb[h]) @ wide(kb[h]).T                                    # [R, Lp]
        for r0, r1 in ((0, 3), (3, rows)):                                  # two row blocks
            p = np.full((r1 - r0, lp), 0xFFFF, np.uint16)
            K.attn_softmax_rows_kernel[r1 - r0, K.SOFTMAX_THREADS, 0](
                np.ascontiguousarray(sc[r0:r1]), pos, np.int32(r0), np.int32(grp), np.float32(scale), p)
            valid = np.arange(lp)[None, :] <= pos[np.arange(r0, r1) // grp][:, None]
            z = np.where(valid, sc[r0:r1] * scale, -np.inf)
            want = np.exp(z - z.max(axis=1, keepdims=True))
            want /= want.sum(axis=1, keepdims=True)
            close(wide(p), want.astype(BF16).astype(np.float32), 1e-2)
            assert (wide(p)[~valid] == 0).all()
            o = (wide(p) @ wide(vt[h]).T).astype(np.float32)                  # [R, D]
            K.attn_scatter_o_kernel[r1 - r0, 32, 0](o, np.int32(r0), np.int32(h), np.int32(grp),
                                                     np.int32(hq), out)
    r16 = [a.astype(BF16).astype(np.float32) for a in (q, kf, vf)]
    ref = cpu.attention(r16[0], r16[1], r16[2], pos, scale).reshape(t * hq, d)
    close(out, ref, 1e-2)


# --- tensor-core prepare kernel of the chunked gated delta rule (kernels/gdn/gdn_prepare_mma.py) ---
# The simulated mma costs ~25 ms per warp-level call: one (chunk, V head) of the smallest
# shapes below is ~300 of them (the Gram, M = P T and the four products), ~10 s.

def test_gdr_prepare_mma_vs_simt_kernel(ops):
    """gdc_prepare_mma_kernel's six outputs against gdc_prepare_kernel's (fp32) for one partial
    chunk (T = 20: rows past T zero) and Hv/Hk = 2 (the Gram tiles kept across the V heads),
    Dk = Dv = 16 (one n8 tile pair of one column group). Measured here: <= 7e-4 of the largest
    value (TF32 operands), bound 3e-3."""
    from ninfer_nb.kernels.gdn import gdn_chunked as K_gdc
    from ninfer_nb.kernels.gdn import gdn_prepare_mma as K_gdp

    rng = np.random.default_rng(35)
    t, hk, hv, dk, dv = 20, 1, 2, 16, 16
    q, k, v = rnd(rng, t, hk, dk), rnd(rng, t, hk, dk), rnd(rng, t, hv, dv)
    g = -np.abs(rnd(rng, t, hv, scale=0.5))
    beta = (1.0 / (1.0 + np.exp(-rnd(rng, t, hv)))).astype(np.float32)
    outs = {}
    for kind in ("simt", "mma"):
        bufs = [np.full(shape, np.nan, np.float32) for shape in
                ((hv, t, dk), (hv, t, dk), (hv, t, dv), (hv, t), (hv, 1), (t, hv, dv))]
        if kind == "mma":
            ops._go(K_gdp.gdc_prepare_mma_kernel, (1, hk), K_gdp.THREADS, q, k, v, g, beta, *bufs,
                    smem=K_gdp.SMEM_BYTES)
        else:
            ops._go(K_gdc.gdc_prepare_kernel, (1, hk), K_gdc.PREP_THREADS, q, k, v, g, beta, *bufs)
        outs[kind] = bufs
    for a, b in zip(outs["mma"], outs["simt"]):
        close(a, b, 3e-3)
