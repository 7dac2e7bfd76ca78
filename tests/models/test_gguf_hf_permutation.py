"""The Llama Q/K un-permutation, checked against Hugging Face transformers (torch, CPU).

A tiny random `LlamaForCausalLM` is converted to GGUF here the way llama.cpp's converter does
(conftest's `llama_cpp_permute`). Two facts are checked, neither through our model code:
1. the file really is in llama.cpp's convention: attention logits computed from the GGUF rows
   with interleaved-pair RoPE (llama.cpp's "normal" RoPE for the llama architecture) equal HF's
   logits from its own weights, rotary embedding and `apply_rotary_pos_emb`;
2. `load_gguf` gives back exactly HF's state dict.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from gguf import GGUFReader  # noqa: E402
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb  # noqa: E402

from ninfer_nb.models.gguf_loader import load_gguf  # noqa: E402
from ninfer_nb.quant.rows import values  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, HIDDEN = 4, 2, 16, 64
THETA = 10000.0


@pytest.fixture(scope="module")
def hf_model() -> "transformers.LlamaForCausalLM":
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=96, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
        rope_theta=THETA, rms_norm_eps=1e-5, max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)                  # norms too, so every tensor is distinct
    return model


@pytest.fixture
def gguf_path(hf_model, tmp_path: Path, write_gguf, hf_to_gguf) -> Path:
    sd = {k: v.detach().numpy() for k, v in hf_model.state_dict().items()}
    cfg = hf_model.config
    meta = {
        "llama.embedding_length": HIDDEN, "llama.block_count": cfg.num_hidden_layers,
        "llama.feed_forward_length": cfg.intermediate_size, "llama.attention.head_count": HEADS,
        "llama.attention.head_count_kv": KV_HEADS, "llama.attention.key_length": HEAD_DIM,
        "llama.rope.dimension_count": HEAD_DIM, "llama.rope.freq_base": THETA,
        "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.context_length": 256,
        "llama.vocab_size": cfg.vocab_size,
    }
    tensors = hf_to_gguf(sd, arch="llama", n_heads=HEADS, n_kv_heads=KV_HEADS)
    return write_gguf(tmp_path / "hf-llama.gguf", "llama", meta, tensors)


def _interleaved_rope(x: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """llama.cpp's normal RoPE: rotate pairs (x[2i], x[2i+1]) by pos * theta^(-2i/d).
    x: [heads, seq, head_dim]."""
    d = x.shape[-1]
    freqs = THETA ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    angle = positions[:, None] * freqs[None, :]                # [seq, d/2]
    cos, sin = np.cos(angle), np.sin(angle)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x, dtype=np.float64)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


def _logits(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """q: [H, S, d], k: [KV, S, d] -> [H, S, S] with grouped-query sharing."""
    k = np.repeat(k, HEADS // KV_HEADS, axis=0)
    return q @ k.transpose(0, 2, 1)


def test_gguf_rows_follow_llama_cpp_rope_convention(hf_model, gguf_path: Path) -> None:
    seq = 7
    x = np.random.default_rng(1).standard_normal((seq, HIDDEN))
    positions = np.arange(3, 3 + seq)
    attn = hf_model.model.layers[1].self_attn
    xt = torch.tensor(x[None], dtype=torch.float64)
    with torch.no_grad():
        q = attn.q_proj.double()(xt).view(1, seq, HEADS, HEAD_DIM).transpose(1, 2)
        k = attn.k_proj.double()(xt).view(1, seq, KV_HEADS, HEAD_DIM).transpose(1, 2)
        cos, sin = hf_model.model.rotary_emb(xt, torch.tensor(positions)[None])
        q_hf, k_hf = apply_rotary_pos_emb(q, k, cos.double(), sin.double())
    attn.float()
    expected = _logits(q_hf[0].numpy(), k_hf[0].numpy())

    reader = GGUFReader(gguf_path)
    raw = {t.name: np.array(t.data, dtype=np.float64) for t in reader.tensors}
    wq, wk = raw["blk.1.attn_q.weight"], raw["blk.1.attn_k.weight"]
    q_cpp = (x @ wq.T).reshape(seq, HEADS, HEAD_DIM).transpose(1, 0, 2)
    k_cpp = (x @ wk.T).reshape(seq, KV_HEADS, HEAD_DIM).transpose(1, 0, 2)
    got = _logits(_interleaved_rope(q_cpp, positions), _interleaved_rope(k_cpp, positions))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)   # HF computes cos/sin in fp32

    # the check has teeth: the same RoPE on HF-ordered rows gives other logits
    wq_hf = attn.q_proj.weight.detach().double().numpy()
    wk_hf = attn.k_proj.weight.detach().double().numpy()
    q_bad = (x @ wq_hf.T).reshape(seq, HEADS, HEAD_DIM).transpose(1, 0, 2)
    k_bad = (x @ wk_hf.T).reshape(seq, KV_HEADS, HEAD_DIM).transpose(1, 0, 2)
    bad = _logits(_interleaved_rope(q_bad, positions), _interleaved_rope(k_bad, positions))
    assert not np.allclose(bad, expected, atol=1e-3)


def test_loader_returns_the_hf_state_dict(hf_model, gguf_path: Path) -> None:
    ckpt = load_gguf(gguf_path)
    sd = {k: v.detach().float().numpy() for k, v in hf_model.state_dict().items()}
    assert sorted(ckpt.weights) == sorted(sd)
    for name, ref in sd.items():
        np.testing.assert_array_equal(values(ckpt.weights[name]), ref, err_msg=name)
    cfg = ckpt.config
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size) == (
        HEADS, KV_HEADS, HEAD_DIM, 96)
    assert not cfg.tie_word_embeddings
