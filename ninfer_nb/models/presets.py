"""Named model shapes with random weights, for benchmarks: `--model random:qwen3.6-27b`.

Shapes come from the published configs (the models' config.json files).
`random_weights(cfg, make)` lays out a full `ModelWeights` whose arrays come from
`make(shape, kind)`, so a backend can build them directly in device memory (the 27B preset is
54 GB in bf16: it never exists on the host). For the linear kinds ("matrix", "experts") make
returns a linear weight record (models/weights.py), or a host NumPy array that becomes a
DenseWeight tagged by its dtype; anything else it returns is kept as is. Knows nothing about
devices itself.
"""
from __future__ import annotations

from typing import Any, Callable, Literal

import numpy as np

from ..config import ModelConfig
from ..errors import ModelNotFoundError
from .rope import rope_table
from .weights import (
    AttentionWeights,
    DenseWeight,
    GDNWeights,
    LayerWeights,
    MLPWeights,
    ModelWeights,
    MoEWeights,
    MTPWeights,
    dense_dtype,
)

_QWEN36_COMMON: dict[str, Any] = dict(
    vocab_size=248320, head_dim=256, linear_key_head_dim=128, linear_value_head_dim=128,
    linear_num_key_heads=16, linear_conv_kernel_dim=4, full_attention_interval=4,
    rms_norm_eps=1e-6, max_position_embeddings=262144, tie_word_embeddings=False,
    rope_parameters={"rope_theta": 1e7, "partial_rotary_factor": 0.25}, eos_token_id=248046,
    mtp_num_hidden_layers=1,           # the checkpoints ship one MTP layer (ModelWeights.mtp)
)
PRESETS: dict[str, dict[str, Any]] = {
    "qwen3.6-27b": dict(_QWEN36_COMMON, model_type="qwen3_5_text", hidden_size=5120,
                        num_hidden_layers=64, intermediate_size=17408, num_attention_heads=24,
                        num_key_value_heads=4, linear_num_value_heads=48),
    "qwen3.6-35b-a3b": dict(_QWEN36_COMMON, model_type="qwen3_5_moe_text", hidden_size=2048,
                            num_hidden_layers=40, num_attention_heads=16, num_key_value_heads=2,
                            linear_num_value_heads=32, num_experts=256, num_experts_per_tok=8,
                            moe_intermediate_size=512, shared_expert_intermediate_size=512),
    "tiny-qwen3.5": dict(_QWEN36_COMMON, model_type="qwen3_5_text", hidden_size=256,
                         num_hidden_layers=4, intermediate_size=512, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=64, linear_num_key_heads=2,
                         linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32),
    "tiny-qwen3.5-moe": dict(_QWEN36_COMMON, model_type="qwen3_5_moe_text", hidden_size=256,
                             num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                             head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
                             linear_key_head_dim=32, linear_value_head_dim=32, num_experts=16,
                             num_experts_per_tok=4, moe_intermediate_size=64,
                             shared_expert_intermediate_size=64),
}

Kind = Literal["matrix", "norm", "vector", "conv", "experts"]
Make = Callable[[tuple[int, ...], Kind], Any]
LINEAR_KINDS: tuple[Kind, ...] = ("matrix", "experts")


def preset_config(name: str) -> ModelConfig:
    if name not in PRESETS:
        raise ModelNotFoundError(f"unknown preset {name!r} (presets: {', '.join(sorted(PRESETS))})")
    return ModelConfig.from_hf(PRESETS[name])


def random_weights(cfg: ModelConfig, make_array: Make) -> ModelWeights:
    h, d = cfg.hidden_size, cfg.head_dim

    def make(shape: tuple[int, ...], kind: Kind) -> Any:
        a = make_array(shape, kind)
        if kind in LINEAR_KINDS and isinstance(a, np.ndarray):
            return DenseWeight(a, dense_dtype(a.dtype))
        return a

    table = rope_table(cfg)          # computed, not random: a host array the backend places

    def attention() -> AttentionWeights:
        rows = (2 if cfg.attn_output_gate else 1) * cfg.num_heads * d + 2 * cfg.num_kv_heads * d
        return AttentionWeights(
            qkv=make((rows, h), "matrix"), o=make((h, cfg.num_heads * d), "matrix"), rope_table=table,
            gated=cfg.attn_output_gate, q_norm=make((d,), "norm"), k_norm=make((d,), "norm"))

    def ffn_weights() -> MLPWeights | MoEWeights:
        if cfg.is_moe:
            e, m, s = cfg.num_experts, cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size
            if s == m:                  # the shared expert folded in as expert E (MoEWeights)
                return MoEWeights(
                    router=make((e + 1, h), "matrix"), gate_up=make((e + 1, 2 * m, h), "experts"),
                    down=make((e + 1, h, m), "experts"), top_k=cfg.num_experts_per_tok,
                    renormalize=True, shared_slot=True)
            return MoEWeights(
                router=make((e, h), "matrix"), gate_up=make((e, 2 * m, h), "experts"),
                down=make((e, h, m), "experts"), top_k=cfg.num_experts_per_tok, renormalize=True,
                shared=MLPWeights(make((2 * s, h), "matrix"), make((h, s), "matrix")),
                shared_gate=make((1, h), "matrix"))
        return MLPWeights(make((2 * cfg.intermediate_size, h), "matrix"),
                          make((h, cfg.intermediate_size), "matrix"))

    layers = []
    for i in range(cfg.num_layers):
        if cfg.is_full_attention(i):
            mixer: AttentionWeights | GDNWeights = attention()
        else:
            vd = cfg.linear_num_value_heads * cfg.linear_value_head_dim
            hv, kw = cfg.linear_num_value_heads, cfg.linear_conv_kernel_dim
            mixer = GDNWeights(
                in_proj=make((cfg.conv_dim + vd + 2 * hv, h), "matrix"),
                conv=make((cfg.conv_dim, kw), "conv"), a_log=make((hv,), "vector"),
                dt_bias=make((hv,), "vector"), norm=make((cfg.linear_value_head_dim,), "norm"),
                out=make((h, vd), "matrix"))
        ffn = ffn_weights()
        layers.append(LayerWeights(make((h,), "norm"), make((h,), "norm"), mixer, ffn))
    embed = make((cfg.vocab_size, h), "matrix")
    norm = make((h,), "norm")
    lm_head = embed if cfg.tie_word_embeddings else make((cfg.vocab_size, h), "matrix")
    mtp = None
    if cfg.mtp_num_hidden_layers > 0:   # the MTP head (made last: the target's weights keep their draws)
        mtp = MTPWeights(fc_embedding=make((h, h), "matrix"), fc_hidden=make((h, h), "matrix"),
                         norm_embedding=make((h,), "norm"), norm_hidden=make((h,), "norm"),
                         layer=LayerWeights(make((h,), "norm"), make((h,), "norm"), attention(), ffn_weights()),
                         norm=make((h,), "norm"))
    return ModelWeights(embed=embed, layers=layers, norm=norm, lm_head=lm_head, mtp=mtp)
