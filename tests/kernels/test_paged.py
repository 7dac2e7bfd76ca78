"""Paged attention kernels (kernels/attention/: the decode split kernels, the prefill kernels and
the prologue that stores K / V through a page table) through CudaOps vs the ops.cpu reference
on fresh random inputs: small shapes in the CUDA simulator (tests/support/sim_runner.py),
model shapes on the GPU (-m gpu). Pages are scattered over a pool whose other rows hold NaN,
so a key read from a wrong row shows."""
from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

from ninfer_nb.models.rope import plain_table
from ninfer_nb.ops import cpu
from ninfer_nb.ops.base import PAGE_SIZE as P
from tests.kernels.device import DEVICE_MARKS, SIM, shapes
from tests.kernels.gpu_util import close, rnd

pytestmark = DEVICE_MARKS
BF16 = ml_dtypes.bfloat16


def paged_pool(rng: np.random.Generator, last: list[int], pool: int, hkv: int, d: int, cache: str
               ) -> tuple[np.ndarray, list[np.ndarray | None], list[np.ndarray]]:
    """(page table [B, pages], the device-typed caches [k, v, k_scale, v_scale] (scales None
    unless int8), their fp32 reference values [k, v]): each sequence's pages drawn at random from
    `pool`; rows no sequence owns up to its last position are NaN."""
    pages = max(-(-(e + 1) // P) for e in last)
    table = rng.permutation(pool)[: len(last) * pages].reshape(len(last), pages).astype(np.int32)
    rows = pool * P
    kf, vf = rnd(rng, rows, hkv, d), rnd(rng, rows, hkv, d)
    live = np.zeros(rows, bool)
    live[cpu.cache_rows(np.concatenate([np.arange(e + 1) for e in last]),
                        np.repeat(table, [e + 1 for e in last], axis=0))] = True
    if cache == "int8":
        kc, ks = cpu.kv_quantize_int8(kf)
        vc, vs = cpu.kv_quantize_int8(vf)
        ks[~live] = np.nan
        vs[~live] = np.nan
        return table, [kc, vc, ks, vs], [cpu.kv_dequantize_int8(kc, ks), cpu.kv_dequantize_int8(vc, vs)]
    dtype = BF16 if cache == "bf16" else np.float32
    kc, vc = kf.astype(dtype), vf.astype(dtype)
    kc[~live] = np.nan
    vc[~live] = np.nan
    return table, [kc, vc, None, None], [kc.astype(np.float32), vc.astype(np.float32)]


def positions_of(last: list[int], n: int) -> np.ndarray:
    """Each sequence's n positions ending at its last one, sequences back to back [B * n]."""
    return np.concatenate([np.arange(e - n + 1, e + 1) for e in last]).astype(np.int32)


def recording(ops: Any) -> list[str]:
    """The names of the kernels `ops` launches from now on."""
    names: list[str] = []
    go = ops._go

    def rec(spec: Any, *a: Any, **kw: Any) -> None:
        names.append(spec.name)
        go(spec, *a, **kw)

    ops._go = rec
    return names


@pytest.mark.parametrize("cache,hq,hkv,d,last,n,sm", shapes(
    sim=[("bf16", 2, 1, 64, [130, 40], 1, 1), ("f32", 2, 1, 64, [70, 5], 1, 1), ("int8", 2, 1, 64, [70, 5], 1, 1)],
    gpu=[("bf16", 24, 4, 256, [4000, 70, 1, 700, 64, 2047, 300, 128], 1, 132),
         ("bf16", 24, 4, 256, [900, 3000, 63], 2, 132),
         ("f32", 24, 4, 256, [2000, 5, 700, 64], 1, 132),
         ("int8", 24, 4, 256, [2000, 5, 700, 64], 1, 132),
         ("bf16", 16, 2, 256, [5000 - 300 * i for i in range(16)], 1, 132)]))
def test_paged_decode_attention(dev, rng, cache, hq, hkv, d, last, n, sm):
    """The split-K decode kernels' paged builds + the combine (output gate) for B sequences of n
    tokens each at their own lengths (one inside its first page, some ending at a page's last
    or first row) vs ops.cpu.attention_gated through the same table: bf16 caches on tensor cores
    (attn_split_mma_paged_d*), fp32 / int8 caches on the SIMT split kernel (its shuffles run on
    ptx_sim's stand-ins in the simulator)."""
    ops = dev.fresh()
    ops.sm_count = sm
    pool = len(last) * -(-(max(last) + 1) // P) + 3
    table, caches, ref = paged_pool(rng, last, pool, hkv, d, cache)
    pos = positions_of(last, n)
    t = len(pos)
    q, gate = rnd(rng, t, hq, d), rnd(rng, t, hq * d)
    want = cpu.attention_gated(q, ref[0], ref[1], pos, d ** -0.5, gate, page_table=table)
    dc = [None if c is None else dev.up(c) for c in caches]
    Q, G, POS, TAB = dev.up(q), dev.up(gate), dev.up(pos), dev.up(table)
    names = recording(ops)
    if dev.on_gpu:
        got = ops.attention_gated(Q, dc[0], dc[1], POS, d ** -0.5, G, dc[2], dc[3], page_table=TAB)
    else:                                   # the simulator routes decode-sized T to the prefill kernels
        got = ops.empty((t, hq, d))
        ks, vs = (dc[2], dc[3]) if cache == "int8" else (Q, Q)
        ops._attention_decode(Q, dc[0], dc[1], ks, vs, POS, d ** -0.5, G, got, TAB)
    split = f"attn_split_mma_paged_d{d}_kernel" if cache == "bf16" else "attn_split_paged_kernel"
    assert names == [split, "attn_combine_kernel"]
    close(dev.host(got).reshape(t, hq * d), want, 2e-2 if cache == "bf16" else 2e-5)
    if dev.on_gpu and cache == "bf16" and n == 1:
        us = dev.best_time(lambda: ops.attention_gated(Q, dc[0], dc[1], POS, d ** -0.5, G, page_table=TAB),
                           graph=True)[0] * 1e6
        print(f"\npaged decode attention B={t} Hq={hq} Hkv={hkv}, {sum(last) + t} keys in all: {us:.1f} us")


@pytest.mark.parametrize("last", shapes(sim=[200], gpu=[200, 4095, 30000]))
def test_paged_decode_costs_what_contiguous_costs(dev, rng, last):
    """One sequence's decode attention through a page table whose pages are scattered equals the
    contiguous kernel on the same keys laid out in order (the same arithmetic, rows moved), and
    on the GPU prints both times (-s)."""
    ops = dev.fresh()
    hq, hkv, d = (2, 1, 64) if SIM else (24, 4, 256)
    ops.sm_count = 1 if SIM else ops.sm_count
    pool = -(-(last + 1) // P) + 2
    table, caches, ref = paged_pool(rng, [last], pool, hkv, d, "bf16")
    keys = np.arange(last + 1)
    rows = table[0, keys // P] * P + keys % P
    kflat, vflat = caches[0][rows], caches[1][rows]
    q, gate = rnd(rng, 1, hq, d), rnd(rng, 1, hq * d)
    pos = np.array([last], np.int32)
    Q, G, POS, TAB = dev.up(q), dev.up(gate), dev.up(pos), dev.up(table)
    KC, VC, KF, VF = dev.up(caches[0]), dev.up(caches[1]), dev.up(kflat), dev.up(vflat)

    def paged() -> Any:
        out = ops.empty((1, hq, d))
        ops._attention_decode(Q, KC, VC, Q, Q, POS, d ** -0.5, G, out, TAB)
        return out

    def flat() -> Any:
        out = ops.empty((1, hq, d))
        ops._attention_decode(Q, KF, VF, Q, Q, POS, d ** -0.5, G, out)
        return out

    got, want = dev.host(paged()), dev.host(flat())
    if KC.shape[0] >= KF.shape[0]:          # the same split count (it follows the cache length)
        assert np.array_equal(got, want)
    close(got.reshape(1, -1), cpu.attention_gated(q, ref[0], ref[1], pos, d ** -0.5, gate, page_table=table), 2e-2)
    if dev.on_gpu:
        tp, tf = dev.best_time(paged, graph=True)[0], dev.best_time(flat, graph=True)[0]
        print(f"\ndecode attention at {last + 1} keys: paged {tp * 1e6:.1f} us, contiguous {tf * 1e6:.1f} us")


@pytest.mark.parametrize("cache,hq,hkv,d,last,n", shapes(
    sim=[("f32", 2, 1, 32, [65], 6), ("bf16", 2, 1, 32, [70, 9], 5)],
    gpu=[("bf16", 24, 4, 256, [700], 9), ("bf16", 24, 4, 256, [3000], 2048), ("f32", 24, 4, 256, [130, 64], 5),
         ("int8", 24, 4, 256, [1000], 300), ("bf16", 8, 2, 64, [500], 100)]))
def test_paged_prefill_attention(dev, rng, cache, hq, hkv, d, last, n):
    """Prefill-sized chunks through a page table (one launch per sequence): the SIMT kernel's
    paged build (up to 16 tokens, or B sequences of 5+ tokens), and on the GPU the flash kernel
    and the GEMM path over the paged gathers; positions.host set as the engine's inputs carry it."""
    ops = dev.fresh()
    pool = len(last) * -(-(max(last) + 1) // P) + 2
    table, caches, ref = paged_pool(rng, last, pool, hkv, d, cache)
    pos = positions_of(last, n)
    t = len(pos)
    q = rnd(rng, t, hq, d)
    want = cpu.attention(q, ref[0], ref[1], pos, d ** -0.5, page_table=table)
    dc = [None if c is None else dev.up(c) for c in caches]
    POS = dev.up(pos)
    if dev.on_gpu:
        POS.host = pos
    got = ops.attention(dev.up(q), dc[0], dc[1], POS, d ** -0.5, dc[2], dc[3], page_table=dev.up(table))
    big = dev.on_gpu and n > 16
    close(dev.host(got), want, 2e-2 if big or cache != "f32" else 2e-5)


@pytest.mark.parametrize("cache,hq,hkv,d,last,n,norm", shapes(
    sim=[("bf16", 4, 2, 32, [63, 64, 5], 1, True), ("f32", 2, 1, 32, [66, 3], 2, False),
         ("int8", 2, 1, 64, [64, 2], 1, True)],
    gpu=[("bf16", 24, 4, 256, [63, 64, 5000, 1, 700, 8, 9, 10], 1, True), ("int8", 24, 4, 256, [63, 640], 3, True),
         ("f32", 24, 4, 256, [100, 200], 4, True)]))
def test_paged_qk_norm_rope_store(dev, rng, cache, hq, hkv, d, last, n, norm):
    """The attention prologue through a page table (fused kernel: fp32 / bf16 caches; the
    separate ops and the int8 store at cache_rows otherwise) vs ops.cpu: the rotated q, the rows
    it wrote, and every other row untouched."""
    ops = dev.fresh()
    pool = len(last) * -(-(max(last) + 1) // P) + 2
    table, caches, _ = paged_pool(rng, last, pool, hkv, d, cache)
    pos = positions_of(last, n)
    t = len(pos)
    q, k, v = rnd(rng, t, hq, d), rnd(rng, t, hkv, d), rnd(rng, t, hkv, d)
    qn, kn = (rnd(rng, d), rnd(rng, d)) if norm else (None, None)
    rope = plain_table(d // 2, 1e6)
    ref_caches = [None if c is None else c.copy() for c in caches]
    q_want = cpu.qk_norm_rope_store(q, k, v, qn, kn, pos, rope, 1e-6, *ref_caches, page_table=table)
    dc = [None if c is None else dev.up(c) for c in caches]
    qn_d, kn_d = (dev.up(qn), dev.up(kn)) if norm else (None, None)
    q_got = ops.qk_norm_rope_store(dev.up(q), dev.up(k), dev.up(v), qn_d, kn_d, dev.up(pos), dev.up(rope),
                                   1e-6, *dc, page_table=dev.up(table))
    close(dev.host(q_got), q_want, 1e-5)
    rows = cpu.cache_rows(pos, table)
    other = np.ones(pool * P, bool)
    other[rows] = False
    for got_c, want_c in zip(dc, ref_caches):
        if got_c is None:
            continue
        g, w = dev.host(got_c), want_c
        np.testing.assert_array_equal(g[other].view(np.uint8), w[other].view(np.uint8))   # NaN rows too
        if cache == "bf16":                 # the rope angle: fp32 cos / sin here, float64 in NumPy
            close(g[rows].astype(np.float32), w[rows].astype(np.float32), 8e-3)
        elif cache == "f32":
            close(g[rows], w[rows], 1e-5)
        else:                               # int8 codes may differ by one where a value sits on a rounding edge
            assert np.abs(g[rows].astype(np.int32) - w[rows].astype(np.int32)).max() <= 1


@pytest.mark.parametrize("n_seq,n,hk,hv,dk,dv", shapes(
    sim=[(2, 1, 1, 2, 32, 16)],
    gpu=[(8, 1, 16, 48, 128, 128), (16, 1, 16, 32, 128, 128), (2, 4, 16, 48, 128, 128), (3, 1, 2, 6, 64, 96)]))
def test_gdn_decode_slots(dev, rng, monkeypatch, n_seq, n, hk, hv, dk, dv):
    """gdn_decode over the slot pools (slots [B] in device memory, in no order, some slots
    idle) vs ops.cpu: every sequence's outputs, its slot's recurrent and conv state, idle slots
    untouched. GPU: gdn_decode_slots_kernel (a grid row per sequence), and each sequence equals
    the one-sequence kernel on its slot bit for bit; the simulator: the gather / three ops /
    scatter fallback. Prints the B-sequence kernel's time (-s). The head kernel, the default
    for rounds of 3+ sequences, has its own cases (test_gdn.py)."""
    from ninfer_nb.ops.cuda import gdn as cuda_gdn

    monkeypatch.setattr(cuda_gdn, "GDN_DECODE_KERNEL", "cluster")
    ops = dev.fresh()
    t, c, vd = n_seq * n, 2 * hk * dk + hv * dv, hv * dv
    n_slots = n_seq + 3
    slots = rng.permutation(n_slots)[:n_seq].astype(np.int32)
    mixed, z = rnd(rng, t, c), rnd(rng, t, vd)
    a, b = rnd(rng, t, hv), rnd(rng, t, hv)
    conv_w = rnd(rng, c, 4, scale=0.5)
    al, dtb, nw = rnd(rng, hv, scale=0.5), rnd(rng, hv), rnd(rng, dv)
    conv_pool, state_pool = rnd(rng, n_slots, 3, c), rnd(rng, n_slots, hv, dv, dk, scale=0.1)
    conv_ref, state_ref = conv_pool.copy(), state_pool.copy()
    want = cpu.gdn_decode(mixed, z, a, b, conv_ref, conv_w, al, dtb, state_ref, nw, 1e-6, hk, slots=slots)
    CP, SP = dev.up(conv_pool), dev.up(state_pool)
    ins = [dev.up(x) for x in (mixed, z, a, b)]
    consts = [dev.up(x) for x in (conv_w, al, dtb)]
    NW, SL = dev.up(nw), dev.up(slots)
    names = recording(ops)
    got = ops.gdn_decode(*ins, CP, *consts, SP, NW, 1e-6, hk, slots=SL)
    close(dev.host(got), want, 1e-4)
    close(dev.host(SP), state_ref, 1e-4)
    close(dev.host(CP), conv_ref, 1e-5)
    idle = [s for s in range(n_slots) if s not in slots]
    assert np.array_equal(dev.host(SP)[idle], state_pool[idle]) and np.array_equal(dev.host(CP)[idle], conv_pool[idle])
    if not dev.on_gpu:
        assert names[:2] == ["slot_gather_kernel", "slot_gather_kernel"] and names[-2:] == ["slot_scatter_kernel"] * 2
        return
    assert names == ["gdn_decode_slots_kernel"]
    for i, s in enumerate(slots):                  # the one-sequence kernel on that slot's starting state
        r = slice(i * n, (i + 1) * n)
        cs, st = dev.up(conv_pool[s]), dev.up(state_pool[s])
        one = ops.gdn_decode(*[dev.up(x[r]) for x in (mixed, z, a, b)], cs, *consts, st, NW, 1e-6, hk)
        assert np.array_equal(dev.host(one), dev.host(got)[r])
        assert np.array_equal(dev.host(st), dev.host(SP)[s])
    us = dev.best_time(lambda: ops.gdn_decode(*ins, CP, *consts, SP, NW, 1e-6, hk, slots=SL), graph=True)[0] * 1e6
    print(f"\ngdn_decode slots B={n_seq} n={n} Hv={hv}: {us:.1f} us")


@pytest.mark.skipif(not SIM, reason="the simulator's case; the GPU runs the gathers inside test_paged_prefill_attention")
def test_paged_gather_kv_equals_contiguous_gather() -> None:
    """attn_gather_kv_paged_kernel (the flash / GEMM prefill's K, V gathers through a page table
    [1, P]) writes exactly what attn_gather_kv_kernel writes from the same keys laid out in
    order (keys past the chunk's last position zero, unowned rows NaN)."""
    from ninfer_nb.kernels.attention import attention_gemm as K

    rng = np.random.default_rng(4)
    hkv, d, last, t = 1, 32, 100, 5
    table, caches, _ = paged_pool(rng, [last], 4, hkv, d, "bf16")
    keys = np.arange(last + 1)
    rows = table[0, keys // P] * P + keys % P
    kc, vc = caches[0].view(np.uint16), caches[1].view(np.uint16)
    pos = np.arange(last - t + 1, last + 1, dtype=np.int32)
    lp = K.padded_keys(last + 1)
    got = [np.full((hkv, lp, d), 0xFFFF, np.uint16), np.full((hkv, d, lp), 0xFFFF, np.uint16)]
    want = [np.full((hkv, lp, d), 0xFFFF, np.uint16), np.full((hkv, d, lp), 0xFFFF, np.uint16)]
    dummy = np.zeros((1, 1, 1), np.float32)
    grid = (lp // K.TILE, d // K.TILE, hkv)
    K.attn_gather_kv_paged_kernel[grid, (K.TILE, 8), 0](kc, vc, dummy, dummy, pos, table, *got)
    K.attn_gather_kv_kernel[grid, (K.TILE, 8), 0](np.ascontiguousarray(kc[rows]), np.ascontiguousarray(vc[rows]),
                                                  dummy, dummy, pos, *want)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
