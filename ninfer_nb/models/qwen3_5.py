"""Qwen3.5 / 3.6 hybrid (dense and MoE): HF tensors -> runtime weights.

Layers alternate Gated DeltaNet and gated full attention (`cfg.layer_types`). Sanitising here:
zero-centred norms get +1, q_proj's per-head [query | gate] rows are de-interleaved,
in_proj_qkv and its depthwise conv are split into q / k / v parts, experts stay fused.
The math itself is in `layers.py`; the spec is `shared/reference/qwen35-model.md`.
"""
from __future__ import annotations

import numpy as np

from ..config import ModelConfig
from ..errors import ModelFormatError
from .weights import (AttentionWeights, GDNWeights, LayerWeights, MLPWeights, ModelWeights,
                      MoEWeights)


class _Tensors:
    """Named access with a clear error for a missing tensor."""

    def __init__(self, weights: dict[str, np.ndarray], source: str) -> None:
        self.w, self.source = weights, source

    def __call__(self, name: str) -> np.ndarray:
        try:
            return self.w[name]
        except KeyError:
            raise ModelFormatError(f"{self.source}: missing tensor {name}") from None

    def get(self, name: str) -> np.ndarray | None:
        return self.w.get(name)


def _f32(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32)


def _attention(cfg: ModelConfig, t: _Tensors, p: str) -> AttentionWeights:
    d, heads = cfg.head_dim, cfg.num_heads
    q_proj = t(p + "q_proj.weight")
    gate = None
    if cfg.attn_output_gate:
        qg = q_proj.reshape(heads, 2, d, -1)
        q_proj, gate = qg[:, 0].reshape(heads * d, -1), _f32(qg[:, 1].reshape(heads * d, -1))
    return AttentionWeights(
        q=_f32(q_proj), k=_f32(t(p + "k_proj.weight")), v=_f32(t(p + "v_proj.weight")),
        o=_f32(t(p + "o_proj.weight")), gate=gate,
        q_norm=_f32(1.0 + t(p + "q_norm.weight")), k_norm=_f32(1.0 + t(p + "k_norm.weight")),
    )


def _gdn(cfg: ModelConfig, t: _Tensors, p: str) -> GDNWeights:
    qk = cfg.linear_num_key_heads * cfg.linear_key_head_dim
    qkv = t(p + "in_proj_qkv.weight")
    conv = t(p + "conv1d.weight").reshape(cfg.conv_dim, -1)
    return GDNWeights(
        q=_f32(qkv[:qk]), k=_f32(qkv[qk : 2 * qk]), v=_f32(qkv[2 * qk :]),
        z=_f32(t(p + "in_proj_z.weight")), a=_f32(t(p + "in_proj_a.weight")),
        b=_f32(t(p + "in_proj_b.weight")),
        conv_q=_f32(conv[:qk]), conv_k=_f32(conv[qk : 2 * qk]), conv_v=_f32(conv[2 * qk :]),
        a_log=_f32(t(p + "A_log")), dt_bias=_f32(t(p + "dt_bias")),
        norm=_f32(t(p + "norm.weight")), out=_f32(t(p + "out_proj.weight")),
    )


def _mlp(t: _Tensors, p: str) -> MLPWeights:
    gate_up = np.concatenate([t(p + "gate_proj.weight"), t(p + "up_proj.weight")])
    return MLPWeights(gate_up=_f32(gate_up), down=_f32(t(p + "down_proj.weight")))


def _moe(cfg: ModelConfig, t: _Tensors, p: str) -> MoEWeights:
    shared = _mlp(t, p + "shared_expert.") if t.get(p + "shared_expert.gate_proj.weight") is not None else None
    sg = t.get(p + "shared_expert_gate.weight")
    return MoEWeights(
        router=_f32(t(p + "gate.weight")), gate_up=_f32(t(p + "experts.gate_up_proj")),
        down=_f32(t(p + "experts.down_proj")), top_k=cfg.num_experts_per_tok,
        renormalize=True, shared=shared, shared_gate=None if sg is None else _f32(sg),
    )


def build_weights(cfg: ModelConfig, weights: dict[str, np.ndarray], source: str) -> ModelWeights:
    t = _Tensors(weights, source)
    layers = []
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        mixer = (_attention(cfg, t, p + "self_attn.") if cfg.is_full_attention(i)
                 else _gdn(cfg, t, p + "linear_attn."))
        ffn = _moe(cfg, t, p + "mlp.") if cfg.is_moe else _mlp(t, p + "mlp.")
        layers.append(LayerWeights(
            input_norm=_f32(1.0 + t(p + "input_layernorm.weight")),
            post_norm=_f32(1.0 + t(p + "post_attention_layernorm.weight")),
            mixer=mixer, ffn=ffn,
        ))
    embed = _f32(t("model.embed_tokens.weight"))
    head = t.get("lm_head.weight")
    return ModelWeights(embed=embed, layers=layers, norm=_f32(1.0 + t("model.norm.weight")),
                        lm_head=embed if cfg.tie_word_embeddings or head is None else _f32(head))
