"""Every supported architecture against Hugging Face transformers (fp32, CPU) on tiny random
checkpoints: logits at every position, and greedy generation through the incremental caches."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ninfer_nb import LLM, SamplingParams

torch = pytest.importorskip("torch")

VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen35-dense": ("qwen35", {}),
    "qwen35-dense-wrapper-interval3-tied": ("qwen35", dict(
        wrapper=True, num_hidden_layers=6, full_attention_interval=3, num_attention_heads=8,
        num_key_value_heads=2, head_dim=16, tie_word_embeddings=True, linear_num_key_heads=1,
        linear_num_value_heads=3, linear_key_head_dim=8, linear_value_head_dim=24)),
    "qwen35-moe-wrapper": ("qwen35_moe", dict(wrapper=True)),
    # shared expert as wide as the routed ones: folded in as expert E (MoEWeights.shared_slot)
    "qwen35-moe-top1-interval2": ("qwen35_moe", dict(
        num_experts=4, num_experts_per_tok=1, full_attention_interval=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=64, shared_expert_intermediate_size=32)),
    # No shared expert in the files; the oracle is HF with its shared expert zeroed.
    "qwen35-moe-no-shared-expert": ("qwen35_moe", dict(drop=r"shared_expert")),
    "llama-tied": ("llama", {}),
    "llama-untied-mha": ("llama", dict(tie_word_embeddings=False, num_key_value_heads=4)),
    "qwen3-qknorm": ("qwen3", {}),
    "qwen2-bias": ("qwen2", {}),
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant(request: pytest.FixtureRequest, tiny_checkpoints) -> tuple[LLM, Any]:
    kind, kwargs = VARIANTS[request.param]
    path = tiny_checkpoints.get(request.param, kind, **kwargs)
    return LLM(str(path), device="cpu", max_context=256, prefill_chunk=16), tiny_checkpoints.hf_model(request.param)


def _prompt(seed: int, n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, 248000, n)]


def test_logits_match_transformers(variant) -> None:
    llm, hf = variant
    ids = _prompt(1, 40)       # 40 tokens over 16-token chunks: chunked GDN + a 8-token tail
    ours = llm.logits(ids)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].float().numpy()
    assert ours.shape == ref.shape == (40, hf.config.vocab_size)
    scale = np.abs(ref).max()
    assert np.abs(ours - ref).max() <= 1e-4 * scale


def test_greedy_generation_matches_transformers(variant) -> None:
    llm, hf = variant
    ids = _prompt(2, 12)
    result = llm.generate(ids, SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True))
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=32, min_new_tokens=32,
                          do_sample=False, attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    expected = out[0, len(ids):].tolist()
    assert result.token_ids == expected
    assert result.finish_reason == "length"
    assert result.timings.completion_tokens == 32


def test_shared_expert_folds_only_when_as_wide_as_the_experts(tiny_checkpoints) -> None:
    """The parity tests above cover both MoE layouts: folded (shared width == expert width)
    and a separate gated shared MLP (48 != 32)."""
    from ninfer_nb.models.weights import MoEWeights

    def ffn(name: str) -> MoEWeights:
        kind, kwargs = VARIANTS[name]
        llm = LLM(str(tiny_checkpoints.get(name, kind, **kwargs)), device="cpu", max_context=64)
        layer = llm.engine.generator.decoder.weights.layers[0].ffn
        assert isinstance(layer, MoEWeights)
        return layer

    folded, separate = ffn("qwen35-moe-top1-interval2"), ffn("qwen35-moe-wrapper")
    assert folded.shared_slot and folded.shared is None and folded.gate_up.shape[0] == 4 + 1
    assert folded.router.shape[0] == 4 + 1
    assert not separate.shared_slot and separate.shared is not None
