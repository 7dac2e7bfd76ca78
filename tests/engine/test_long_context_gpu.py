"""Long context on the GPU against the CPU backend: logits at positions past 32K and 128K.

The tiny random hybrid of tests/support/twin_models.py (max_position_embeddings 262144, the
real head dims) prefills a random prompt of P tokens on the GPU in the default 1,024-token
chunks. A CPU prefill of 128K tokens would take minutes (its attention is quadratic), so the
CPU starts from the GPU's caches instead: after the prompt, every KV cache row and the GDN
state are copied into the CPU engine's caches, bit for bit (bf16, or int8 codes and scales).
Both then run the same continuation: one 300-token prefill chunk at positions P.. (wgmma GEMM,
flash attention over P + 300 keys), then decode steps (graph replays, the decode attention
over every row). Their logits are compared with LONG_BOUND (test_gpu_default_path.py says where
bf16 bounds of this model come from). The first P rows themselves are the GPU's: what is checked is the
arithmetic at long positions (RoPE angles of positions past 2^15 and 2^17, attention over
128K keys, the split and combine of the decode attention, int32 offsets), not the prefix.
"""
from __future__ import annotations

import numpy as np
import pytest

from ninfer_nb.models.state import GDNSlots, KVCache
from tests.engine.test_gpu_default_path import U_BF16
from tests.support.twin_models import VOCAB, bf16_gemm_inputs, twin_llm

pytestmark = pytest.mark.gpu

CHUNK, FEED = 300, 8
# the prefill chunk's row and the decode rows (test_gpu_default_path.py derives its bounds,
# 16u / 4u, at 1K positions); over 33K / 131K keys: measured on the H200 max 4.8u / 3.8u
LONG_BOUND = 8 * U_BF16


def _copy_state(gpu, cpu) -> None:
    """The GPU generator's caches and cached tokens into the CPU generator (same layout)."""
    src, dst = gpu.engine.generator, cpu.engine.generator
    for a, b in zip(src.state.layers, dst.state.layers):
        assert type(a) is type(b)
        names = ("k", "v", "k_scale", "v_scale") if isinstance(a, KVCache) else ("conv", "recurrent")
        assert isinstance(a, (KVCache, GDNSlots))
        for name in names:
            d, s = getattr(b, name), getattr(a, name)
            if d is None:
                continue
            host = np.ascontiguousarray(src.backend.to_host(s))
            d[...] = host.view(d.dtype).reshape(d.shape)
    dst.forget()
    dst.tokens = list(src.tokens)


@pytest.mark.parametrize("kv", ["auto", "int8"])
@pytest.mark.parametrize("prefix", [33_000, 131_200])
def test_long_context_logits_match_cpu(prefix: int, kv: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = [int(t) for t in np.random.default_rng(40).integers(2, VOCAB, prefix + CHUNK + FEED)]
    ctx = prefix + CHUNK + FEED + 8
    gpu = twin_llm(monkeypatch, "hybrid", "cuda", max_context=ctx, kv_cache=kv)
    bf16_gemm_inputs(monkeypatch)
    cpu = twin_llm(monkeypatch, "hybrid", "cpu", max_context=ctx, kv_cache="bf16" if kv == "auto" else kv)
    gpu.engine.generator.prefill(ids[:prefix])
    _copy_state(gpu, cpu)
    got, want = [], []
    for llm, out in ((gpu, got), (cpu, want)):
        gen = llm.engine.generator
        last, reused = gen.prefill(ids[: prefix + CHUNK])
        assert reused == prefix
        out.append(last)
        out.extend(gen.decode(t) for t in ids[prefix + CHUNK:])
    g, w = np.stack(got), np.stack(want)
    assert np.isfinite(g).all()
    err = np.abs(g - w).max(-1) / np.abs(w).max(-1)
    print(f"\nlong context {prefix} + {CHUNK} + {FEED} ({kv} cache): max error / max logit per row "
          f"{' '.join(f'{e:.1e}' for e in err)} (bound {LONG_BOUND:.1e})")
    assert err.max() <= LONG_BOUND
