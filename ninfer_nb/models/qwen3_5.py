"""Qwen3.5 / 3.6 hybrid (dense and MoE): HF tensors -> runtime weights.

Layers alternate Gated DeltaNet and gated full attention (`cfg.layer_types`). Sanitising here:
zero-centred norms get +1, q_proj's per-head [query | gate] rows are de-interleaved,
q | gate | k | v and GDN's qkv | z | a | b projections are fused row-wise (one matrix
per mixer input), experts stay fused.
The math itself is in `layers.py`; the spec is `docs/model-math.md`.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..config import ModelConfig
from .rope import rope_table
from .tensors import NamedTensors, Place, dense, f32, fold_shared_expert, fuse_rows, keep, mlp_weights, qkv_weights
from .weights import AttentionWeights, GDNWeights, LayerWeights, ModelWeights, MoEWeights, MTPWeights


def _attention(cfg: ModelConfig, t: NamedTensors, p: str, table: np.ndarray) -> AttentionWeights:
    d, heads = cfg.head_dim, cfg.num_heads
    q_proj = t(p + "q_proj.weight")
    gate = None
    if cfg.attn_output_gate:            # per head [query | gate] rows -> all queries, all gates
        from ..quant.rows import take_rows  # quant.rows imports models: not at module level

        rows = (np.arange(heads)[:, None] * 2 * d + np.arange(d)).reshape(-1)
        q_proj, gate = take_rows(q_proj, rows), take_rows(q_proj, rows + d)
    return qkv_weights(q_proj, t(p + "k_proj.weight"), t(p + "v_proj.weight"),
                       t(p + "o_proj.weight"), table, gate=gate,
                       q_norm=1.0 + f32(t(p + "q_norm.weight")), k_norm=1.0 + f32(t(p + "k_norm.weight")))


def _gdn(cfg: ModelConfig, t: NamedTensors, p: str) -> GDNWeights:
    return GDNWeights(
        in_proj=fuse_rows(t(p + "in_proj_qkv.weight"), t(p + "in_proj_z.weight"),
                          t(p + "in_proj_a.weight"), t(p + "in_proj_b.weight")),
        conv=f32(t(p + "conv1d.weight").reshape(cfg.conv_dim, -1)),
        a_log=f32(t(p + "A_log")), dt_bias=f32(t(p + "dt_bias")),
        norm=f32(t(p + "norm.weight")), out=dense(t(p + "out_proj.weight")),
    )


def _moe(cfg: ModelConfig, t: NamedTensors, p: str) -> MoEWeights:
    shared = mlp_weights(t, p + "shared_expert.") if t.get(p + "shared_expert.gate_proj.weight") is not None else None
    sg = t.get(p + "shared_expert_gate.weight")
    moe = MoEWeights(
        router=dense(t(p + "gate.weight")), gate_up=dense(t(p + "experts.gate_up_proj")),
        down=dense(t(p + "experts.down_proj")), top_k=cfg.num_experts_per_tok,
        renormalize=True, shared=shared, shared_gate=None if sg is None else dense(sg),
    )
    return fold_shared_expert(moe)


def _mtp(cfg: ModelConfig, t: NamedTensors, table: np.ndarray) -> MTPWeights | None:
    """The MTP head (`mtp.*`) when the checkpoint has a whole one (`fc` of [H, 2H] and its
    layer); None otherwise (HF transformers and many quantized exports drop it)."""
    fc, h = t.get("mtp.fc.weight"), cfg.hidden_size
    if (not isinstance(fc, np.ndarray) or tuple(fc.shape) != (h, 2 * h)   # absent, malformed, or quantized
            or t.get("mtp.layers.0.input_layernorm.weight") is None):
        return None
    p = "mtp.layers.0."
    layer = LayerWeights(
        input_norm=1.0 + f32(t(p + "input_layernorm.weight")),
        post_norm=1.0 + f32(t(p + "post_attention_layernorm.weight")),
        mixer=_attention(cfg, t, p + "self_attn.", table),
        ffn=_moe(cfg, t, p + "mlp.") if cfg.is_moe else mlp_weights(t, p + "mlp."))
    return MTPWeights(fc_embedding=dense(np.ascontiguousarray(fc[:, :h])),      # fc's column halves
                      fc_hidden=dense(np.ascontiguousarray(fc[:, h:])),
                      norm_embedding=1.0 + f32(t("mtp.pre_fc_norm_embedding.weight")),
                      norm_hidden=1.0 + f32(t("mtp.pre_fc_norm_hidden.weight")), layer=layer,
                      norm=1.0 + f32(t("mtp.norm.weight")))


def build_weights(cfg: ModelConfig, weights: Mapping[str, Any], source: str,
                  place: Place = keep) -> ModelWeights:
    """`place` takes each layer (and the embedding, LM head) as soon as it is built (a device
    upload), so the host holds one layer's tensors at a time."""
    t = NamedTensors(weights, source)
    table = rope_table(cfg)                                  # [3, rotary_dim/2], shared by the layers
    layers = []
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        mixer = (_attention(cfg, t, p + "self_attn.", table) if cfg.is_full_attention(i)
                 else _gdn(cfg, t, p + "linear_attn."))
        ffn = _moe(cfg, t, p + "mlp.") if cfg.is_moe else mlp_weights(t, p + "mlp.")
        layers.append(place(LayerWeights(
            input_norm=1.0 + f32(t(p + "input_layernorm.weight")),
            post_norm=1.0 + f32(t(p + "post_attention_layernorm.weight")),
            mixer=mixer, ffn=ffn,
        )))
    embed = place(dense(t("model.embed_tokens.weight")))
    head = t.get("lm_head.weight")
    mtp = _mtp(cfg, t, table)
    return ModelWeights(embed=embed, layers=layers, norm=place(1.0 + f32(t("model.norm.weight"))),
                        lm_head=embed if cfg.tie_word_embeddings or head is None else place(dense(head)),
                        mtp=None if mtp is None else place(mtp))
