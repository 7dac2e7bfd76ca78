"""Attention kernels (kernels/attention/: RoPE, the fused prologue, KV stores, split-K decode,
SIMT / GEMM / flash prefill) through CudaOps vs ops.cpu, one body per case: small shapes under
the CUDA simulator (tests/support/sim_runner.py), the Qwen3.6-27B / 35B heads (24 / 4 and 16 / 2
x 256) on the GPU (-m gpu), where cases also print times (-s). Cache rows past the last
position hold NaN (or random codes) that must never reach the output; scratch starts as NaN."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer_nb.kernels.attention import attention as K_attn
from ninfer_nb.models.rope import plain_table
from ninfer_nb.ops import cpu
from tests.kernels.case_util import (
    GPU_ONLY,
    SIM_ONLY,
    TOL_F32,
    bf16r,
    check_attention,
    choose,
    gpu_only,
    launched,
    prefill_kind,
)
from tests.kernels.device import DEVICE_MARKS, SIM, shapes
from tests.kernels.gpu_util import BF16, close, rnd, rnd_bf16

pytestmark = DEVICE_MARKS
TOL32 = 1e-5


@pytest.mark.parametrize("t,heads,d,rd", shapes(sim=[(3, 2, 16, 8)],
                                                gpu=[(5, 24, 256, 64), (3, 4, 128, 128), (70, 16, 256, 64)]))
def test_rope(dev, rng, t, heads, d, rd):
    """Partial rotary embedding at random positions up to 256K (the first at 0)."""
    ops = dev.fresh()
    x = rnd(rng, t, heads, d)
    pos = rng.integers(0, 262144, t).astype(np.int32)
    pos[0] = 0
    table = plain_table(rd, 1e7)
    close(dev.host(ops.rope(dev.up(x), dev.up(pos), dev.up(table))), cpu.rope(x, pos, table), TOL32)


@pytest.mark.parametrize("cdtype", [np.float32, BF16])
@pytest.mark.parametrize("hq,hkv,d,rot,t,norm", shapes(
    sim=[(6, 2, 24, 16, 3, False), (6, 2, 24, 16, 3, True)],
    gpu=[(24, 4, 256, 64, 1, True), (16, 2, 256, 64, 5, True), (8, 2, 128, 128, 3, False), (6, 2, 96, 32, 2, True)]))
def test_qk_norm_rope_store(dev, rng, cdtype, hq, hkv, d, rot, t, norm):
    """The fused attention prologue (q / k norms, RoPE, K / V into the cache) vs ops.cpu: rotated
    q, and the cache rows it wrote (a bf16 cache holds the rounded k / v); rows it must not
    touch stay as they were."""
    ops = dev.fresh()
    s = 64
    q, k, v = rnd(rng, t, hq, d), rnd(rng, t, hkv, d), rnd(rng, t, hkv, d)
    qn, kn = (rnd(rng, d), rnd(rng, d)) if norm else (None, None)
    pos = np.sort(rng.choice(s, t, replace=False)).astype(np.int32)
    kc, vc = rnd(rng, s, hkv, d).astype(cdtype), rnd(rng, s, hkv, d).astype(cdtype)
    kc_ref, vc_ref = kc.astype(np.float32), vc.astype(np.float32)
    KC, VC = dev.up(kc), dev.up(vc)

    def up(a):
        return dev.up(a) if a is not None else None

    table = plain_table(rot, 1e7)
    got = ops.qk_norm_rope_store(dev.up(q), dev.up(k), dev.up(v), up(qn), up(kn), dev.up(pos), dev.up(table), 1e-6,
                                 KC, VC)
    ref = cpu.qk_norm_rope_store(q, k, v, qn, kn, pos, table, 1e-6, kc_ref, vc_ref)
    close(dev.host(got), ref, TOL32)
    # k: cos / sin of the reduced angle in fp32 (the simulator: NumPy's) vs float64, or one bf16 step
    k_tol = (1e-6 if SIM else TOL32) if cdtype == np.float32 else 8e-3
    close(dev.host(KC).astype(np.float32), kc_ref.astype(cdtype).astype(np.float32), k_tol)
    close(dev.host(VC).astype(np.float32), vc_ref.astype(cdtype).astype(np.float32), 0)


def _attn_case(dev, rng, cdtype, s, hq, hkv, d, start, t, kind):
    """kv_store of a chunk into an fp32 / bf16 cache (exact, as ops.cpu), then attention over it
    with the prefill kind pinned (None: the ops' default)."""
    ops = dev.fresh()
    kc = rnd(rng, s, hkv, d).astype(cdtype)
    vc = rnd(rng, s, hkv, d).astype(cdtype)
    kc_ref, vc_ref = kc.astype(np.float32), vc.astype(np.float32)
    KC, VC = dev.up(kc), dev.up(vc)
    pos = np.arange(start, start + t, dtype=np.int32)
    k, v = rnd(rng, t, hkv, d), rnd(rng, t, hkv, d)
    P = dev.up(pos)
    ops.kv_store(KC, VC, dev.up(k), dev.up(v), P)
    cpu.kv_store(kc_ref, vc_ref, k.astype(cdtype).astype(np.float32), v.astype(cdtype).astype(np.float32), pos)
    close(dev.host(KC).astype(np.float32), kc_ref, 0)
    close(dev.host(VC).astype(np.float32), vc_ref, 0)
    q = rnd(rng, t, hq, d)
    with prefill_kind(ops, kind):
        o = dev.host(ops.attention(dev.up(q), KC, VC, P, d ** -0.5))
    if t <= 16:                                    # decode-sized: the split kernels
        from ninfer_nb.kernels.attention import attention_decode_mma as K_adm
        mma = cdtype == BF16 and K_adm.supported(d, hq // hkv)
        return check_attention(o, q, kc_ref, vc_ref, pos, d ** -0.5, "decode_mma" if mma else "simt")
    simt = kind in (None, "simt") or d % 64 or not dev.on_gpu
    return check_attention(o, q, kc_ref, vc_ref, pos, d ** -0.5, "simt" if simt else kind)


@pytest.mark.parametrize("cdtype", [np.float32, BF16])
@pytest.mark.parametrize("s,hq,hkv,d,start,t,kind", shapes(
    sim=[(40, 4, 2, 24, 5, 18, None)],
    gpu=[(4096, 24, 4, 256, start, t, kind) for start, t in ((0, 1), (4000, 1), (700, 3), (0, 300), (300, 77))
         for kind in ("flash", "gemm", "simt")]))
def test_attention_qwen_dims(dev, rng, cdtype, s, hq, hkv, d, start, t, kind):
    """kv_store, then attention: decode split-K for T <= 4; prefill above (GPU: the mma.sync
    flash kernel, the GEMM path or the SIMT flash kernel; simulator: the SIMT kernel)."""
    if t <= 4 and kind != "flash":
        pytest.skip("decode takes the split-K kernel whatever the prefill kind")
    _attn_case(dev, rng, cdtype, s, hq, hkv, d, start, t, kind)


@GPU_ONLY
@pytest.mark.parametrize("d,t,start", gpu_only([(64, 1, 37), (128, 20, 5), (96, 2, 600), (64, 300, 40), (96, 33, 7)]))
def test_attention_small_heads(dev, rng, d, t, start):
    """Other head dims; 96 is not a multiple of the GEMMs' K step, so it takes the SIMT kernel."""
    _attn_case(dev, rng, np.float32, 1024, 8, 2, d, start, t, "gemm")


@pytest.mark.parametrize("s,hq,hkv,d,start,t", shapes(
    sim=[(30, 4, 2, 128, 3, 17)],
    gpu=[(4096, 24, 4, 256, start, t) for start, t in ((0, 1), (3000, 1), (700, 3), (0, 300), (300, 77))]))
def test_attention_int8_kv(dev, rng, s, hq, hkv, d, start, t):
    """INT8-G64 caches: codes and scales written exactly like ops.cpu (an all-zero group: scale
    0, codes 0), attention on them over earlier context (the GPU's GEMM path gathers dequantised
    bf16 keys / values for prefill)."""
    ops = dev.fresh()
    kc, vc = np.zeros((s, hkv, d), np.int8), np.zeros((s, hkv, d), np.int8)
    ks, vs = np.zeros((s, hkv, d // 64), np.float32), np.zeros((s, hkv, d // 64), np.float32)
    pre_k, pre_v = rnd(rng, start + t, hkv, d), rnd(rng, start + t, hkv, d)
    cpu.kv_store(kc, vc, pre_k, pre_v, np.arange(start + t), ks, vs)   # earlier context
    KC, VC, KS, VS = dev.up(kc), dev.up(vc), dev.up(ks), dev.up(vs)
    pos = np.arange(start, start + t, dtype=np.int32)
    k, v = rnd(rng, t, hkv, d), rnd(rng, t, hkv, d)
    k[0, 0, :64] = 0.0
    P = dev.up(pos)
    ops.kv_store(KC, VC, dev.up(k), dev.up(v), P, KS, VS)
    cpu.kv_store(kc, vc, k, v, pos, ks, vs)
    assert np.array_equal(dev.host(KC), kc) and np.array_equal(dev.host(VC), vc)
    close(dev.host(KS), ks, 0)
    close(dev.host(VS), vs, 0)
    assert ks[start, 0, 0] == 0 and not kc[start, 0, :64].any()
    q = rnd(rng, t, hq, d)
    o = dev.host(ops.attention(dev.up(q), KC, VC, P, d ** -0.5, KS, VS))
    kf = kc.astype(np.float32) * np.repeat(ks, 64, axis=-1)
    vf = vc.astype(np.float32) * np.repeat(vs, 64, axis=-1)
    close(cpu.attention(q, kc, vc, pos, d ** -0.5, ks, vs), cpu.attention(q, kf, vf, pos, d ** -0.5), TOL32)
    if t <= 16 or not dev.on_gpu:
        close(o, cpu.attention(q, kc, vc, pos, d ** -0.5, ks, vs), TOL_F32)
    else:
        check_attention(o, q, kf, vf, pos, d ** -0.5, "gemm")


@pytest.mark.parametrize("hq,hkv,d,s,start,t,sm_count", shapes(
    sim=[(6, 2, 64, 200, 99, 2, 1), (8, 1, 256, 200, 150, 1, 132)],
    gpu=[(24, 4, 256, 8192, 8190, 1, None), (16, 2, 256, 8192, 8190, 1, None), (24, 4, 256, 8192, 511, 1, None),
         (16, 2, 256, 8192, 511, 1, None), (16, 2, 256, 8192, 700, 3, None), (8, 1, 256, 8192, 0, 1, None),
         (6, 2, 256, 8192, 30, 2, None), (16, 2, 256, 8192, 8100, 4, None)]))
def test_decode_attention_mma(dev, rng, hq, hkv, d, s, start, t, sm_count, monkeypatch):
    """The bf16 caches' decode attention (attn_split_mma_d{64, 256}_kernel: tensor cores, a block
    per (split, kv head)) + the combine kernel with the output gate, vs ops.cpu on a bf16 cache
    whose rows past the last position hold NaN; Q, K, V and P are rounded to bf16 (2e-2).
    Simulator: (6, 2, 64, 2 tokens, 1 SM): G = 3 of the mma's 8 head columns, one split of 100 /
    101 keys (each warp walks one or two 16-key tiles, warp 2's second partly past the keys);
    (8, 1, 256, 1 token, 132 SMs): all 8 columns, every k-step and m-tile of D = 256, 13 splits of
    64 keys of which 3 hold keys; the others return at once and the combine skips them. GPU: the
    27B / 35B heads over an 8K cache, through ops.attention_gated (the mma kernel by default),
    against attn_split_kernel on the same bf16 cache (fp32) and the times of both and of an fp32
    cache (-s)."""
    ops = dev.fresh()
    if sm_count is not None:
        monkeypatch.setattr(ops, "sm_count", sm_count)
    last = start + t - 1
    pos = np.arange(start, start + t, dtype=np.int32)
    kc, vc = rnd(rng, s, hkv, d).astype(BF16), rnd(rng, s, hkv, d).astype(BF16)
    kc[last + 1:] = np.nan
    vc[last + 1:] = np.nan
    q, gate = rnd(rng, t, hq, d), rnd(rng, t, hq * d)
    ref = cpu.attention_gated(q, kc.astype(np.float32), vc.astype(np.float32), pos, d ** -0.5, gate)
    names = launched(ops, monkeypatch)
    Q, P, G = dev.up(q), dev.up(pos), dev.up(gate)
    KC, VC = dev.up(kc), dev.up(vc)
    out = ops.empty((t, hq, d))                 # the split kernels (the simulator's ops take prefill)
    ops._attention_decode(Q, KC, VC, Q, Q, P, d ** -0.5, G, out)
    assert names == [f"attn_split_mma_d{d}_kernel", "attn_combine_kernel"]
    close(dev.host(out).reshape(t, hq * d), ref, 2e-2)
    if not dev.on_gpu:
        return
    times = {}
    KF, VF = dev.up(kc.astype(np.float32)), dev.up(vc.astype(np.float32))
    for name, caches, kind in (("mma", (KC, VC), "auto"), ("simt bf16", (KC, VC), "simt"),
                               ("simt fp32", (KF, VF), "auto")):
        choose(ops, monkeypatch, decode_attention=kind)
        times[name], o = dev.best_time(lambda: ops.attention_gated(Q, *caches, P, d ** -0.5, G), reps=5, graph=True)
        if name != "simt fp32":
            close(dev.host(o), ref, 2e-2 if name == "mma" else TOL_F32)
    assert {"attn_split_mma_d256_kernel", "attn_split_kernel"} <= set(names[2:])
    if start + t in (8191, 512) and t == 1:
        print(f"\ndecode attention Hq={hq} Hkv={hkv} at {start + t}: "
              + ", ".join(f"{k} {v * 1e6:.1f} us" for k, v in times.items()))


def test_attention_combine_many_splits(dev, rng):
    """attn_combine_kernel alone vs NumPy: 40 allocated splits, of which 34 / 27 (tokens 0 / 1,
    min split 16: three and two 16-split load chunks, the last one partial) or 9 / 7 (min split
    64) hold keys; the others hold NaN (first pass) or stale values, which the kernel must not
    read. With the output gate; D = 48 (threads past D only load)."""
    ops = dev.fresh()
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
        ops._go(K_attn.attn_combine_kernel, (hq, t), K_attn.COMBINE_THREADS, dev.up(part_o), dev.up(part_ml),
                dev.up(pos), dev.up(gate), np.int32(1), np.int32(min_split), out)
        close(dev.host(out), want, TOL32)


@pytest.mark.parametrize("cache,hq,hkv,d,start,t,kind", shapes(
    sim=[("f32", 6, 1, 256, 30, 6, None), ("bf16", 2, 2, 64, 0, 40, None), ("int8", 3, 1, 64, 40, 23, None)],
    gpu=[(cache, 24, 4, 256, 1536, 512, kind) for kind in ("flash", "gemm", "simt") for cache in ("f32", "bf16")]))
def test_attention_prefill_chunk(dev, rng, cache, hq, hkv, d, start, t, kind):
    """A prefill chunk at positions start..start+t-1 over a cache whose earlier rows hold random
    keys and whose rows past the chunk hold NaN (int8: random codes), never to be read.
    Simulator, the tiled SIMT kernel: G = 6, D = 256 (8 head-dim slices, 4 P.V column blocks;
    36 rows in one 64-row tile; key tiles 0..31 and 32..35, the second fully masked for the
    first two tokens); G = 1 with two kv heads, a first chunk, T = 40; G = 3 on an int8 cache,
    69 rows = a full and a 5-row tile. GPU: the 27B shape, a 512-token chunk at 1536, each kind."""
    ops = dev.fresh()
    s = start + t + (256 if dev.on_gpu else 3)
    q = rnd(rng, t, hq, d)
    kf, vf = rnd(rng, s, hkv, d), rnd(rng, s, hkv, d)
    pos = np.arange(start, start + t, dtype=np.int32)
    scale = d ** -0.5
    if cache == "int8":
        kc, vc = np.zeros((s, hkv, d), np.int8), np.zeros((s, hkv, d), np.int8)
        ks, vs = np.zeros((s, hkv, d // 64), np.float32), np.zeros((s, hkv, d // 64), np.float32)
        cpu.kv_store(kc, vc, kf, vf, np.arange(s, dtype=np.int32), ks, vs)
        assert kc.any() and ks.all()
        with prefill_kind(ops, kind):
            o = dev.host(ops.attention(dev.up(q), dev.up(kc), dev.up(vc), dev.up(pos), scale, dev.up(ks), dev.up(vs)))
        close(o, cpu.attention(q, kc, vc, pos, scale, ks, vs), TOL_F32)
        return
    kc, vc = kf.astype(np.float32 if cache == "f32" else BF16), vf.astype(np.float32 if cache == "f32" else BF16)
    kc[start + t:], vc[start + t:] = np.nan, np.nan
    with prefill_kind(ops, kind):
        o = dev.host(ops.attention(dev.up(q), dev.up(kc), dev.up(vc), dev.up(pos), scale))
    check_attention(o, q, kc.astype(np.float32), vc.astype(np.float32), pos, scale, kind or "simt")


def test_prefill_flash_gqa2_d256(dev, rng, monkeypatch):
    """The flash kernel (attention_flash.py: ldmatrix, cp.async, mma.sync) through
    CudaOps.attention (f32 cache, head dim 256, G = 2, one kv head), chunk at 50, T = 17: 34 rows
    = one block whose rows past 34 read row 33 and are not written; keys 0..66 = two 64-key tiles
    (the copy pipeline's second round), the second masked per row and zero past key 66. vs
    ops.cpu on the exact inputs (bf16 rounding of Q, K, V, P by design) and on bf16-rounded q, k,
    v (the kernel's own error). Simulator: as on a cc 9.0 GPU."""
    ops = dev.fresh()
    monkeypatch.setattr(ops, "arch", (9, 0))
    assert ops.choices.prefill_attention == "flash"
    names = launched(ops, monkeypatch)
    hq, hkv, d, start, t = 2, 1, 256, 50, 17
    s = start + t + 5
    q = rnd(rng, t, hq, d)
    kc, vc = rnd(rng, s, hkv, d), rnd(rng, s, hkv, d)
    kc[start + t:] = np.nan                                  # stale cache rows past the chunk
    pos = np.arange(start, start + t, dtype=np.int32)
    scale = d ** -0.5
    got = dev.host(ops.attention(dev.up(q), dev.up(kc), dev.up(vc), dev.up(pos), scale))
    assert "flash_attn_kernel" in names, names
    close(got, cpu.attention(q, kc, vc, pos, scale), 2e-2)
    close(got, cpu.attention(bf16r(q), bf16r(kc), bf16r(vc), pos, scale), 6e-3)


@SIM_ONLY
@pytest.mark.parametrize("cdtype", [np.float32])   # bf16 / int8 caches: the GPU cases (CI time)
def test_attention_gemm_kernels(dev, rng, cdtype):
    """The gather, softmax and scatter kernels of the GEMM attention path
    (kernels/attention/attention_gemm.py), with the two GEMMs done in NumPy on the same bf16
    operands: each kernel's output exactly (gathers) or at fp32 rounding (softmax, scatter), and
    the composed result against ops.cpu.attention on bf16-rounded q, k, v (P's bf16 rounding:
    1e-2). Keys past the chunk's last position hold NaN in the cache and must not reach the
    output. (The GPU runs the path whole: test_attention_qwen_dims, kind gemm.)"""
    from ninfer_nb.kernels.attention import attention_gemm as K

    dev.fresh()
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
    ref = cpu.attention(bf16r(q), bf16r(kf), bf16r(vf), pos, scale).reshape(t * hq, d)
    close(out, ref, 1e-2)


@GPU_ONLY
@pytest.mark.parametrize("cdtype", gpu_only([np.float32, BF16, np.int8]))
@pytest.mark.parametrize("hq,hkv,start,t", gpu_only([(24, 4, 4000, 1), (16, 2, 700, 3), (8, 2, 30, 1), (16, 2, 8190, 1),
                                            (24, 4, 0, 1), (16, 2, 13, 4), (24, 4, 511, 1), (24, 4, 8190, 1)]))
def test_attention_decode_splits(dev, rng, cdtype, hq, hkv, start, t, monkeypatch):
    """Decode attention (split kernel + combine) over an 8K cache at short and long positions,
    including the first key alone and a few tokens at once, on fp32 / bf16 / int8 caches,
    against NumPy for several split counts (SPLIT_WAVES); prints the times at 8K and 512 (-s).
    The per-q-head SIMT kernel on every cache dtype (bf16 ones default to tensor cores:
    test_decode_attention_mma)."""
    ops = dev.fresh()
    choose(ops, monkeypatch, decode_attention="simt")
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
        args = (dev.up(q), dev.up(kc), dev.up(vc), dev.up(pos), d ** -0.5, dev.up(ks), dev.up(vs))
    else:
        kc, vc = kf.astype(cdtype), vf.astype(cdtype)
        kf, vf = kc.astype(np.float32), vc.astype(np.float32)
        args = (dev.up(q), dev.up(kc), dev.up(vc), dev.up(pos), d ** -0.5)
    ref = cpu.attention(q, kf, vf, pos, d ** -0.5)
    times = {}
    for waves in (1, 2, 4):
        monkeypatch.setattr(K_attn, "SPLIT_WAVES", waves)
        times[waves], o = dev.best_time(lambda: ops.attention(*args), reps=5, graph=True)
        close(dev.host(o), ref, TOL_F32)
    if start + t in (8191, 512) and t == 1:
        print(f"\ndecode attention Hq={hq} Hkv={hkv} at {start + t} ({np.dtype(cdtype).name} cache): "
              + ", ".join(f"{w} waves {v * 1e6:.1f} us" for w, v in times.items()))


@GPU_ONLY
@pytest.mark.parametrize("t,start", gpu_only([(1, 511), (3, 700), (1, 0), (20, 100)]))
def test_attention_gated(dev, rng, t, start, monkeypatch):
    """ops.attention_gated (the Qwen3.5 attention's sigmoid output gate): decode-sized T applies
    it in the split kernels' combine kernel (no sigmoid_mul launch), longer T after the prefill
    kernel (the fp32 one here); against NumPy. The gate is a view into one projection row, as
    the decoder passes it."""
    ops = dev.fresh()
    hq, hkv, d, s = 16, 2, 256, 1024
    pos = np.arange(start, start + t, dtype=np.int32)
    q, kc, vc = rnd(rng, t, hq, d), rnd(rng, s, hkv, d), rnd(rng, s, hkv, d)
    proj = rnd(rng, t, 2 * hq * d)                                   # [T, q | gate]
    ref = cpu.attention_gated(q, kc, vc, pos, d ** -0.5, proj[:, hq * d:])
    names = launched(ops, monkeypatch)
    _, gate = ops.split(dev.up(proj), (hq * d, hq * d))
    with prefill_kind(ops, "simt"):
        o = ops.attention_gated(dev.up(q), dev.up(kc), dev.up(vc), dev.up(pos), d ** -0.5, gate)
    close(dev.host(o), ref, TOL_F32)
    assert o.shape == (t, hq * d)
    assert ("sigmoid_mul_kernel" in names) == (t > 4)


@GPU_ONLY
@pytest.mark.parametrize("hq,hkv", gpu_only([(24, 4), (16, 2)]))
def test_attention_decode_64k(dev, rng, hq, hkv, monkeypatch):
    """Decode attention at 64K context over a bf16 cache vs NumPy: the tensor-core kernel (the
    bf16 default; bf16 Q and P, so against the reference on a bf16-rounded q) and the SIMT kernel
    for 1 / 2 / 4 / 8 waves of split blocks; the times per call (-s)."""
    ops = dev.fresh()
    s, d = 65536, 256
    pos = np.array([s - 1], dtype=np.int32)
    q = rnd(rng, 1, hq, d)
    kc, vc = rnd_bf16(rng, s, hkv, d), rnd_bf16(rng, s, hkv, d)
    args = (dev.up(q), dev.up(kc), dev.up(vc), dev.up(pos), d ** -0.5)
    ref = cpu.attention(q, kc.astype(np.float32), vc.astype(np.float32), pos, d ** -0.5)
    names = launched(ops, monkeypatch)
    times = {}
    times["mma"], o = dev.best_time(lambda: ops.attention(*args), reps=3, graph=True)
    check_attention(dev.host(o), q, kc.astype(np.float32), vc.astype(np.float32), pos, d ** -0.5, "decode_mma")
    assert "attn_split_mma_d256_kernel" in names
    choose(ops, monkeypatch, decode_attention="simt")
    for waves in (1, 2, 4, 8):
        monkeypatch.setattr(K_attn, "SPLIT_WAVES", waves)
        times[f"SIMT {waves} waves"], o = dev.best_time(lambda: ops.attention(*args), reps=3, graph=True)
        close(dev.host(o), ref, TOL_F32)
    kv_bytes = 2 * kc.nbytes
    print(f"\ndecode attention Hq={hq} Hkv={hkv} at 65536 (bfloat16 cache): "
          + ", ".join(f"{w} {v * 1e6:.1f} us ({kv_bytes / v / 1e9:.0f} GB/s of KV)" for w, v in times.items()))


@GPU_ONLY
@pytest.mark.parametrize("hq,hkv", gpu_only([(24, 4), (16, 2)]))
def test_attention_prefill_timing_8k(dev, rng, hq, hkv, monkeypatch):
    """Qwen3.6-27B (24/4) and -35B (16/2) heads x 256, a 2048-token chunk at 6144..8191 over a
    bf16 cache: the flash and GEMM paths vs the SIMT kernel's output (2e-2) and times (-s)."""
    ops = dev.fresh()
    s, d, start, t = 8192, 256, 6144, 2048
    KC = dev.up(rnd(rng, s, hkv, d).astype(BF16))
    VC = dev.up(rnd(rng, s, hkv, d).astype(BF16))
    P = dev.up(np.arange(start, start + t, dtype=np.int32))
    Q = dev.up(rnd(rng, t, hq, d))
    times = {}
    outs = {}
    names = launched(ops, monkeypatch)
    for name in ("simt", "gemm", "flash"):
        choose(ops, monkeypatch, prefill_attention=name)
        times[name], o = dev.best_time(lambda: ops.attention(Q, KC, VC, P, d ** -0.5))
        outs[name] = dev.host(o)
    assert "flash_attn_kernel" in names, set(names)
    flops = 4 * hq * d * t * (start + (t + 1) / 2)
    print(f"\nprefill attention T={t} at {start}, Hq={hq} Hkv={hkv} D={d}: "
          + ", ".join(f"{k} {v * 1e3:.2f} ms ({flops / v * 1e-12:.1f} TFLOP/s)" for k, v in times.items()))
    close(outs["gemm"], outs["simt"], 2e-2)
    close(outs["flash"], outs["simt"], 2e-2)
    close(outs["flash"], outs["gemm"], 1e-2)
