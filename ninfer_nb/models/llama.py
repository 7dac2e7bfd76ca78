"""Llama family (llama, mistral, qwen2, qwen3): HF tensors -> runtime weights.

Plain RMSNorm (no zero-centring), full RoPE, optional q/k/v biases (qwen2) and per-head
q/k norms (qwen3), dense SwiGLU. Forward code is shared (`layers.py`, `decoder.py`).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..config import ModelConfig
from .rope import rope_table
from .tensors import NamedTensors, Place, dense, f32, keep, mlp_weights, qkv_weights
from .weights import LayerWeights, ModelWeights


def _opt(t: NamedTensors, name: str) -> np.ndarray | None:
    x = t.get(name)
    return None if x is None else f32(x)


def build_weights(cfg: ModelConfig, weights: Mapping[str, Any], source: str,
                  place: Place = keep) -> ModelWeights:
    """`place`: as in qwen3_5.build_weights (each part where it will run, once built)."""
    t = NamedTensors(weights, source)
    table = rope_table(cfg)                                  # [3, rotary_dim/2], shared by the layers
    layers = []
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        mixer = qkv_weights(
            t(a + "q_proj.weight"), t(a + "k_proj.weight"), t(a + "v_proj.weight"),
            t(a + "o_proj.weight"), table,
            biases=(_opt(t, a + "q_proj.bias"), _opt(t, a + "k_proj.bias"), _opt(t, a + "v_proj.bias")),
            q_norm=_opt(t, a + "q_norm.weight"), k_norm=_opt(t, a + "k_norm.weight"),
        )
        layers.append(place(LayerWeights(
            input_norm=f32(t(p + "input_layernorm.weight")),
            post_norm=f32(t(p + "post_attention_layernorm.weight")),
            mixer=mixer, ffn=mlp_weights(t, p + "mlp."),
        )))
    embed = place(dense(t("model.embed_tokens.weight")))
    head = t.get("lm_head.weight")
    return ModelWeights(embed=embed, layers=layers, norm=place(f32(t("model.norm.weight"))),
                        lm_head=embed if cfg.tie_word_embeddings or head is None else place(dense(head)))
