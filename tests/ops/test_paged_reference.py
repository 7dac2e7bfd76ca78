"""The batched forms of the attention and GDN ops in ops/cpu.py (the oracle the kernels are
compared with): through a page table, attention and the K / V store give exactly what the
contiguous reference gives each sequence alone; with slots, gdn_decode runs each sequence as
alone on its slot, and leaves the other slots alone."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer_nb.models.rope import plain_table
from ninfer_nb.ops import cpu
from ninfer_nb.ops.base import PAGE_SIZE

P = PAGE_SIZE


def scattered_table(rng: np.random.Generator, n_seq: int, pages: int, pool: int) -> np.ndarray:
    """[B, pages] int32: distinct random pages of a pool of `pool` pages, in no order."""
    return rng.permutation(pool)[: n_seq * pages].reshape(n_seq, pages).astype(np.int32)


def contiguous(cache: np.ndarray, table_row: np.ndarray, n: int) -> np.ndarray:
    """The first n positions of one sequence, gathered from its pages in order."""
    keys = np.arange(n)
    return cache[table_row[keys // P] * P + keys % P]


def test_cache_rows() -> None:
    table = np.array([[5, 2], [0, 7]], np.int32)
    pos = np.array([0, 63, 64, 2, 65, 127], np.int32)              # 3 tokens per sequence
    assert cpu.cache_rows(pos, table).tolist() == [5 * P, 5 * P + 63, 2 * P, 0 * P + 2, 7 * P + 1, 7 * P + 63]
    assert cpu.cache_rows(pos, None).tolist() == pos.tolist()
    with pytest.raises(ValueError):
        cpu.cache_rows(pos[:5], table)


@pytest.mark.parametrize("n_seq,n,int8", [(3, 1, False), (2, 4, False), (4, 1, True), (1, 70, False)])
def test_paged_attention_equals_each_sequence_alone(n_seq: int, n: int, int8: bool) -> None:
    """B sequences at different lengths (one past a page boundary, one inside its first page),
    pages scattered over a pool: the batched, paged attention (and its gated form) equals the
    contiguous reference of each sequence's own keys."""
    rng = np.random.default_rng(7 + n_seq * 10 + n)
    hq, hkv, d, pages = 4, 2, 64, 3
    table = scattered_table(rng, n_seq, pages, pool=n_seq * pages + 2)
    rows = (n_seq * pages + 2) * P
    k_cache = rng.standard_normal((rows, hkv, d)).astype(np.float32)
    v_cache = rng.standard_normal((rows, hkv, d)).astype(np.float32)
    ks = vs = None
    if int8:
        k_cache, ks = cpu.kv_quantize_int8(k_cache)
        v_cache, vs = cpu.kv_quantize_int8(v_cache)
    last = rng.integers(n - 1, pages * P, size=n_seq)
    last[0] = pages * P - 1                                      # the whole table
    last[-1] = max(n - 1, min(last[-1], 5))                      # inside the first page
    pos = np.concatenate([np.arange(e - n + 1, e + 1) for e in last]).astype(np.int32)
    q = rng.standard_normal((n_seq * n, hq, d)).astype(np.float32)
    gate = rng.standard_normal((n_seq * n, hq * d)).astype(np.float32)
    got = cpu.attention(q, k_cache, v_cache, pos, d ** -0.5, ks, vs, page_table=table)
    got_gated = cpu.attention_gated(q, k_cache, v_cache, pos, d ** -0.5, gate, ks, vs, page_table=table)
    for b in range(n_seq):
        r = slice(b * n, (b + 1) * n)
        m = int(last[b]) + 1
        kb, vb = contiguous(k_cache, table[b], m), contiguous(v_cache, table[b], m)
        kbs = None if ks is None else contiguous(ks, table[b], m)
        vbs = None if vs is None else contiguous(vs, table[b], m)
        want = cpu.attention(q[r], kb, vb, pos[r], d ** -0.5, kbs, vbs)
        np.testing.assert_array_equal(got[r], want)
        np.testing.assert_array_equal(got_gated[r], cpu.attention_gated(q[r], kb, vb, pos[r], d ** -0.5, gate[r],
                                                                          kbs, vbs))


@pytest.mark.parametrize("int8", [False, True])
def test_paged_store_writes_each_sequence_rows(int8: bool) -> None:
    """qk_norm_rope_store through a page table writes exactly the rows the contiguous store of
    each sequence would, moved to its pages; q is the same; no other row changes."""
    rng = np.random.default_rng(3)
    n_seq, n, hq, hkv, d, pages = 3, 2, 4, 2, 64, 2
    pool = 8
    table = scattered_table(rng, n_seq, pages, pool)
    pos = np.array([62, 63, 0, 1, 100, 101], np.int32)          # across a page boundary, first page, second page
    q = rng.standard_normal((n_seq * n, hq, d)).astype(np.float32)
    k = rng.standard_normal((n_seq * n, hkv, d)).astype(np.float32)
    v = rng.standard_normal((n_seq * n, hkv, d)).astype(np.float32)
    qn, kn = rng.standard_normal(d).astype(np.float32), rng.standard_normal(d).astype(np.float32)
    rope_table = plain_table(d, 1e6)
    dtype = np.int8 if int8 else np.float32

    def caches(rows: int) -> list[np.ndarray | None]:
        kc = np.full((rows, hkv, d), 3, dtype)
        vc = np.full((rows, hkv, d), 3, dtype)
        sc = [np.full((rows, hkv, d // 64), 0.5, np.float32) for _ in range(2)] if int8 else [None, None]
        return [kc, vc, *sc]

    paged = caches(pool * P)
    untouched = [None if c is None else c.copy() for c in paged]
    q_got = cpu.qk_norm_rope_store(q, k, v, qn, kn, pos, rope_table, 1e-6, *paged, page_table=table)
    written = np.zeros(pool * P, bool)
    for b in range(n_seq):
        r = slice(b * n, (b + 1) * n)
        alone = caches(pages * P)
        q_want = cpu.qk_norm_rope_store(q[r], k[r], v[r], qn, kn, pos[r], rope_table, 1e-6, *alone)
        np.testing.assert_array_equal(q_got[r], q_want)
        rows = cpu.cache_rows(pos[r], table[b : b + 1])
        written[rows] = True
        for got_c, want_c in zip(paged, alone):
            if got_c is not None:
                np.testing.assert_array_equal(got_c[rows], want_c[pos[r]])
    for got_c, old_c in zip(paged, untouched):
        if got_c is not None:
            np.testing.assert_array_equal(got_c[~written], old_c[~written])


@pytest.mark.parametrize("n_seq,n", [(3, 1), (2, 3)])
def test_gdn_decode_slots_equal_each_sequence_alone(n_seq: int, n: int) -> None:
    """gdn_decode over slot pools: each sequence's outputs and its slot's conv / recurrent state
    as gdn_decode of that sequence alone on copies of its slot; unused slots unchanged."""
    rng = np.random.default_rng(11 + n)
    hk, hv, dk, dv, kw, n_slots = 2, 4, 32, 16, 4, 6
    c = 2 * hk * dk + hv * dv
    t = n_seq * n
    slots = np.array([4, 1, 2][:n_seq], np.int32)
    mixed = rng.standard_normal((t, c)).astype(np.float32)
    z = rng.standard_normal((t, hv * dv)).astype(np.float32)
    a, b = rng.standard_normal((t, hv)).astype(np.float32), rng.standard_normal((t, hv)).astype(np.float32)
    conv_w = rng.standard_normal((c, kw)).astype(np.float32) * 0.5
    a_log, dt_bias = rng.standard_normal(hv).astype(np.float32), rng.standard_normal(hv).astype(np.float32)
    norm_w = rng.standard_normal(dv).astype(np.float32)
    conv_pool = rng.standard_normal((n_slots, kw - 1, c)).astype(np.float32)
    state_pool = rng.standard_normal((n_slots, hv, dv, dk)).astype(np.float32) * 0.1
    conv0, state0 = conv_pool.copy(), state_pool.copy()
    out = cpu.gdn_decode(mixed, z, a, b, conv_pool, conv_w, a_log, dt_bias, state_pool, norm_w, 1e-6, hk,
                         slots=slots)
    for i, s in enumerate(slots):
        r = slice(i * n, (i + 1) * n)
        cs, st = conv0[s].copy(), state0[s].copy()
        want = cpu.gdn_decode(mixed[r], z[r], a[r], b[r], cs, conv_w, a_log, dt_bias, st, norm_w, 1e-6, hk)
        np.testing.assert_array_equal(out[r], want)
        np.testing.assert_array_equal(conv_pool[s], cs)
        np.testing.assert_array_equal(state_pool[s], st)
    idle = [s for s in range(n_slots) if s not in slots]
    np.testing.assert_array_equal(conv_pool[idle], conv0[idle])
    np.testing.assert_array_equal(state_pool[idle], state0[idle])
    with pytest.raises(ValueError):
        cpu.gdn_decode(mixed, z, a, b, conv_pool, conv_w, a_log, dt_bias, state_pool, norm_w, 1e-6, hk,
                       slots=np.array([1, 1, 2][:n_seq] if n_seq > 1 else [1, 1], np.int32))
