"""Long context on the CPU backend (issue 30 item 6; the GPU side is test_long_context_gpu.py).

A CPU prefill of 32K tokens would take minutes (its attention is quadratic), so the prefix is
made up: the KV cache rows before position P hold random values and the GDN state is random,
as if P tokens had been read. From that state the same 17 tokens go through once as one
prefill chunk at positions P..P+16 and once as a decode step at P and a chunk at P+1..P+16,
then both take the same 2 decode steps: the logits agree to fp32 rounding (the CPU's default
fp32 cache). That checks the model at positions past 32K
(and, with NINFER_LONG=1, past 128K): cache rows and RoPE angles there, queries attending to
every earlier row, the chunk's causal mask at an offset. The rotary embedding itself stays
relative at those positions: q.k after RoPE at (P + i, P + j) equals that at (i, j).
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from ninfer_nb.models.rope import rope_table
from ninfer_nb.models.state import GDNSlots, KVCache
from ninfer_nb.ops import cpu
from tests.support.twin_models import VOCAB, twin_config, twin_llm

LONG = os.environ.get("NINFER_LONG", "") not in ("", "0")
CHUNK, FEED = 17, 2


@pytest.mark.parametrize("offset", [32_768, 131_072, 262_000])
def test_rope_stays_relative_at_long_positions(offset: int) -> None:
    cfg = twin_config("small")
    table = rope_table(cfg)
    rng = np.random.default_rng(70)
    q = rng.standard_normal((16, 1, cfg.head_dim)).astype(np.float32)
    k = rng.standard_normal((16, 1, cfg.head_dim)).astype(np.float32)
    near = np.arange(16) * 37                         # spread over the slow and fast frequencies
    scores = []
    for start in (0, offset):
        qr, kr = cpu.rope(q, near + start, table), cpu.rope(k, near + start, table)
        scores.append(np.einsum("qhd,khd->qk", qr, kr))
    err = np.abs(scores[1] - scores[0]).max() / np.abs(scores[0]).max()
    assert err <= 2e-6, err


def _fake_prefix(llm, prefix: int, rng: np.random.Generator) -> None:
    """The caches as if `prefix` tokens had been read: random K / V rows before `prefix`, a
    random GDN state in the running slot, random token ids."""
    gen = llm.engine.generator
    block = rng.standard_normal((256,) + gen.state.layers[-1].k.shape[1:]).astype(np.float32)
    for layer in gen.state.layers:
        if isinstance(layer, KVCache):
            for cache in (layer.k, layer.v):
                reps = -(-prefix // len(block))
                cache[:prefix] = np.tile(block, (reps, 1, 1))[:prefix].astype(cache.dtype)
                block = block[::-1] * 0.7                # V unlike K
        else:
            assert isinstance(layer, GDNSlots)
            layer.recurrent[0] = 0.05 * rng.standard_normal(layer.recurrent.shape[1:])
            layer.conv[0] = rng.standard_normal(layer.conv.shape[1:])
    gen.forget()
    gen.tokens = [int(t) for t in rng.integers(2, VOCAB, prefix)]


@pytest.mark.parametrize("prefix", [33_000, pytest.param(131_200, marks=pytest.mark.skipif(
    not LONG, reason="NINFER_LONG=1: the 128K case (0.5 GB of cache)"))])
def test_chunk_equals_decode_steps_past_32k(prefix: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(71)
    llm = twin_llm(monkeypatch, "small", "cpu", max_context=prefix + CHUNK + FEED + 8)
    gen = llm.engine.generator
    _fake_prefix(llm, prefix, rng)
    start = [(layer.conv[0].copy(), layer.recurrent[0].copy()) for layer in gen.state.gdn_layers()]
    prefix_ids = list(gen.tokens)
    ids = [int(t) for t in rng.integers(2, VOCAB, CHUNK + FEED)]

    last, reused = gen.prefill(prefix_ids + ids[:CHUNK])          # one chunk at positions P..
    assert reused == prefix
    chunked = [last] + [gen.decode(t) for t in ids[CHUNK:]]

    for layer, (conv, rec) in zip(gen.state.gdn_layers(), start):
        layer.conv[0], layer.recurrent[0] = conv, rec
    gen.forget()
    gen.tokens = list(prefix_ids)
    gen.decode(ids[0])                                            # one step at P, then a chunk at P + 1..
    last, reused = gen.prefill(prefix_ids + ids[:CHUNK])
    assert reused == prefix + 1
    steps = [last] + [gen.decode(t) for t in ids[CHUNK:]]
    a, b = np.stack(chunked), np.stack(steps)
    assert np.isfinite(a).all()
    err = np.abs(a - b).max() / np.abs(b).max()
    assert err <= 1e-4, err
