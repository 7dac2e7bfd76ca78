"""GGUF files of llama.cpp's `qwen35` / `qwen35moe` architectures -> HF config and HF tensors.

llama.cpp's converter (`conversion/qwen.py`, `_LinearAttentionVReorderBase` on top of
Qwen3-Next's conversion) changes the Hugging Face tensors in three ways, undone here:

- **V-head order.** HF groups the Gated DeltaNet V heads by K head (v = k*r + j, r = Hv/Hk);
  the GGUF stores them tiled (j*Hk + k) in `attn_qkv` (V rows), `attn_gate` (in_proj_z rows),
  `ssm_alpha` / `ssm_beta` rows, `ssm_a`, `ssm_dt.bias`, `ssm_conv1d` (V channels) and the
  *columns* of `ssm_out`. The order is put back here, so the engine sees HF order: rows of
  quantized records move as they are (quant/rows.py); `ssm_out`'s columns move in head-wide
  chunks inside quantization blocks, which no quantized layout can follow, so a quantized
  `ssm_out` is dequantized to float32 (running the GDN mixer in the tiled order instead, which
  would keep it quantized, is not done yet).
- **Norm offsets.** Zero-centred RMSNorm weights are stored with the +1 added (`attn_norm`,
  `post_attention_norm`, `attn_q_norm`, `attn_k_norm`, `output_norm`); the GDN output norm
  (`ssm_norm`) is not. The +1 is subtracted here because the model code adds it.
- **A_log.** Stored as `ssm_a = -exp(A_log)`; A_log = log(-ssm_a).

Also: `ssm_conv1d` is stored squeezed ([C, K] -> HF [C, 1, K]), experts are stacked per
projection (`ffn_{gate,up,down}_exps`, fused here into HF's `gate_up_proj`). The MTP block
(`{arch}.nextn_predict_layers` extra blocks after the decoder; `block_count` counts them, so the
decoder has block_count - nextn layers) comes back under HF's `mtp.*` names: `blk.N.nextn.eh_proj`
-> `mtp.fc` (dequantized: models/qwen3_5.py splits its columns), `.nextn.enorm` / `.hnorm` /
`.shared_head_norm` -> `mtp.pre_fc_norm_embedding` / `pre_fc_norm_hidden` / `norm` (stored +1,
like every zero-centred norm), and the block's attention-layer tensors -> `mtp.layers.0.*`. A
second MTP block and the converter's optional `nextn.embed_tokens` / `shared_head_head` (the
target's own embedding and head) stay unmapped. The q projection keeps HF's per-head
[query | gate] rows. RoPE scaling metadata is read by `gguf_rope` (the caller). Not handled:
Qwen3-Next's `qwen3next` files, vision towers (separate mmproj files).
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from gguf import ReaderTensor

from ..config import ModelConfig
from ..errors import ModelFormatError, UnsupportedModelError
from ..progress import Progress
from ..quant.rows import concat_rows, take_rows, values

ARCHITECTURES: dict[str, str] = {"qwen35": "qwen3_5_text", "qwen35moe": "qwen3_5_moe_text"}

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# GGUF part (without .weight / .bias) -> HF name under model.layers.N.
_LAYER_NAMES = {
    "attn_norm": "input_layernorm.weight",
    "post_attention_norm": "post_attention_layernorm.weight",
    "attn_q": "self_attn.q_proj.weight",
    "attn_k": "self_attn.k_proj.weight",
    "attn_v": "self_attn.v_proj.weight",
    "attn_output": "self_attn.o_proj.weight",
    "attn_q_norm": "self_attn.q_norm.weight",
    "attn_k_norm": "self_attn.k_norm.weight",
    "attn_qkv": "linear_attn.in_proj_qkv.weight",
    "attn_gate": "linear_attn.in_proj_z.weight",
    "ssm_alpha": "linear_attn.in_proj_a.weight",
    "ssm_beta": "linear_attn.in_proj_b.weight",
    "ssm_conv1d": "linear_attn.conv1d.weight",
    "ssm_a": "linear_attn.A_log",
    "ssm_dt": "linear_attn.dt_bias",
    "ssm_norm": "linear_attn.norm.weight",
    "ssm_out": "linear_attn.out_proj.weight",
    "ffn_gate": "mlp.gate_proj.weight",
    "ffn_up": "mlp.up_proj.weight",
    "ffn_down": "mlp.down_proj.weight",
    "ffn_gate_inp": "mlp.gate.weight",
    "ffn_gate_exps": "mlp.experts.gate_proj",      # fused with ffn_up_exps below
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj.weight",
    "ffn_up_shexp": "mlp.shared_expert.up_proj.weight",
    "ffn_down_shexp": "mlp.shared_expert.down_proj.weight",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate.weight",
}
# the MTP block's own tensors (blk.N.nextn.*) -> HF names
_NEXTN_NAMES = {
    "nextn.eh_proj": "mtp.fc.weight",
    "nextn.enorm": "mtp.pre_fc_norm_embedding.weight",
    "nextn.hnorm": "mtp.pre_fc_norm_hidden.weight",
    "nextn.shared_head_norm": "mtp.norm.weight",
}
_ZERO_CENTRED_NORMS = frozenset({"attn_norm", "post_attention_norm", "attn_q_norm", "attn_k_norm",
                                 "nextn.enorm", "nextn.hnorm", "nextn.shared_head_norm"})
_LAYER_RE = re.compile(r"blk\.(\d+)\.([\w.]+?)(?:\.(weight|bias))?")

Dequantize = Callable[[ReaderTensor], Any]     # a tensor as an array or a quantized record


def hf_config(arch: str, fields: Mapping[str, Any], tensors: dict[str, ReaderTensor],
              path: Path) -> dict[str, Any]:
    """A Hugging Face text config dict (for `ModelConfig.from_hf`) from the GGUF metadata."""

    def get(key: str, default: Any = None) -> Any:
        value = fields.get(f"{arch}.{key}", default)
        if value is None:
            raise ModelFormatError(f"{path.name}: missing GGUF metadata key {arch}.{key}")
        return value

    def scalar(key: str, default: Any = None) -> int:
        value = get(key, default)
        if isinstance(value, list):             # per-layer arrays: only uniform ones here
            if len(set(value)) != 1:
                raise UnsupportedModelError(f"{path.name}: per-layer {arch}.{key} is not supported")
            value = value[0]
        return int(value)

    mtp_layers = int(get("nextn_predict_layers", 0))
    head_dim = scalar("attention.key_length")
    v_heads = scalar("ssm.time_step_rank")
    if "token_embd.weight" not in tensors:
        raise ModelFormatError(f"{path.name}: GGUF file has no token_embd.weight tensor")
    eos = [fields.get(k) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                   "tokenizer.ggml.eom_token_id")]
    config: dict[str, Any] = {
        "model_type": ARCHITECTURES[arch],
        "hidden_size": scalar("embedding_length"),
        "num_hidden_layers": scalar("block_count") - mtp_layers,
        "num_attention_heads": scalar("attention.head_count"),
        "num_key_value_heads": scalar("attention.head_count_kv"),
        "head_dim": head_dim,
        "partial_rotary_factor": scalar("rope.dimension_count", head_dim) / head_dim,
        "rope_theta": _float32_value(get("rope.freq_base", 10000.0)),
        "rms_norm_eps": _float32_value(get("attention.layer_norm_rms_epsilon", 1e-6)),
        "intermediate_size": scalar("feed_forward_length", 0),
        "vocab_size": int(tensors["token_embd.weight"].shape[-1]),
        "max_position_embeddings": scalar("context_length", 4096),
        "tie_word_embeddings": "output.weight" not in tensors,
        "full_attention_interval": scalar("full_attention_interval", 4),
        "linear_num_key_heads": scalar("ssm.group_count"),
        "linear_num_value_heads": v_heads,
        "linear_key_head_dim": scalar("ssm.state_size"),
        "linear_value_head_dim": scalar("ssm.inner_size") // v_heads,
        "linear_conv_kernel_dim": scalar("ssm.conv_kernel", 4),
        "mtp_num_hidden_layers": mtp_layers,
        "bos_token_id": fields.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": list(dict.fromkeys(int(e) for e in eos if e is not None)),
    }
    if arch == "qwen35moe":
        config |= {
            "num_experts": scalar("expert_count"),
            "num_experts_per_tok": scalar("expert_used_count"),
            "moe_intermediate_size": scalar("expert_feed_forward_length"),
            "shared_expert_intermediate_size": scalar("expert_shared_feed_forward_length", 0),
        }
    return config


def _float32_value(value: Any) -> float:
    """A float32 metadata value as the decimal it was written from (1e-6, not 9.99999997e-07)."""
    return float(str(np.float32(value)))


def untile_v_heads(x: np.ndarray, axis: int, k_heads: int, v_per_k: int, width: int) -> np.ndarray:
    """llama.cpp's tiled V-head order (j*Hk + k) -> HF's grouped order (k*r + j) along `axis`,
    which holds Hk*r heads of `width` entries each."""
    x = np.moveaxis(x, axis, 0)
    rest = x.shape[1:]
    out = x.reshape(v_per_k, k_heads, width, *rest).swapaxes(0, 1).reshape(x.shape)
    return np.ascontiguousarray(np.moveaxis(out, 0, axis))


def _untile_rows(w: Any, start: int, k_heads: int, v_per_k: int, width: int) -> Any:
    """untile_v_heads on the rows from `start` on (the rows before stay), for arrays and
    quantized records alike."""
    if isinstance(w, np.ndarray):
        return np.concatenate([w[:start], untile_v_heads(w[start:], 0, k_heads, v_per_k, width)])
    n = w.shape[0]
    order = untile_v_heads(np.arange(start, n), 0, k_heads, v_per_k, width)
    return take_rows(w, np.concatenate([np.arange(start), order]))


def _to_hf(part: str, w: Any, c: ModelConfig) -> Any:
    """One layer tensor in GGUF layout -> its HF layout (reorder, offsets, shapes)."""
    hk, dk, dv = c.linear_num_key_heads, c.linear_key_head_dim, c.linear_value_head_dim
    r = c.linear_num_value_heads // max(hk, 1)
    qk_rows = 2 * hk * dk
    if part in ("ssm_out", "nextn.eh_proj") and not isinstance(w, np.ndarray):
        w = values(w)                   # columns cannot move (or split) inside quantized groups
    if part in ("attn_qkv", "attn_gate", "ssm_alpha", "ssm_beta") and not isinstance(w, np.ndarray):
        return _untile_rows(w, qk_rows if part == "attn_qkv" else 0, hk, r, dv if part in ("attn_qkv", "attn_gate") else 1)
    if isinstance(w, np.ndarray) and w.dtype != np.float32 and part not in ("ssm_out",) and w.ndim == 1:
        w = w.astype(np.float32)
    if part in _ZERO_CENTRED_NORMS:
        return w - np.float32(1.0)
    if part == "attn_qkv":
        return np.concatenate([w[:qk_rows], untile_v_heads(w[qk_rows:], 0, hk, r, dv)])
    if part == "attn_gate":
        return untile_v_heads(w, 0, hk, r, dv)
    if part in ("ssm_alpha", "ssm_beta", "ssm_dt"):
        return untile_v_heads(w, 0, hk, r, 1)
    if part == "ssm_a":
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.log(-untile_v_heads(w, 0, hk, r, 1))
    if part == "ssm_conv1d":
        conv = np.concatenate([w[:qk_rows], untile_v_heads(w[qk_rows:], 0, hk, r, dv)])
        return conv.reshape(conv.shape[0], 1, -1)
    if part == "ssm_out":
        return untile_v_heads(w, 1, hk, r, dv)
    return w


def load_weights(path: Path, tensors: dict[str, ReaderTensor], config: ModelConfig,
                 dequantize: Dequantize, show_progress: bool
                 ) -> tuple[dict[str, Any], list[str]]:
    """Weights under HF text-decoder names (as `dequantize` gives them: arrays in their stored
    dtype or quantized records), and the GGUF names not used."""
    weights: dict[str, Any] = {}
    unmapped: list[str] = []
    bar = Progress(f"loading {path.name}", sum(int(t.n_bytes) for t in tensors.values()),
                   enabled=show_progress)
    for name, t in tensors.items():
        hf = _hf_name(name, config)
        if hf is None:
            unmapped.append(name)
        else:
            layer_part = _LAYER_RE.fullmatch(name)
            w = dequantize(t)
            if name == "output_norm.weight":
                w = np.asarray(w, dtype=np.float32) - np.float32(1.0)
            elif layer_part is not None:
                w = _to_hf(layer_part.group(2), w, config)
            weights[hf] = w
        bar.update(int(t.n_bytes))
    bar.close()
    _fuse_experts(path, weights)
    _check_shapes(path, weights, config)
    return weights, unmapped


def _hf_name(gguf_name: str, config: ModelConfig) -> str | None:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _LAYER_RE.fullmatch(gguf_name)
    if match is None:
        return None
    layer, part = int(match.group(1)), match.group(2)
    if layer < config.num_layers:
        return f"model.layers.{layer}.{_LAYER_NAMES[part]}" if part in _LAYER_NAMES else None
    if layer > config.num_layers:               # a second MTP block: the head uses one
        return None
    if part in _NEXTN_NAMES:                    # the MTP block
        return _NEXTN_NAMES[part]
    return f"mtp.layers.0.{_LAYER_NAMES[part]}" if part in _LAYER_NAMES else None


def _fuse_experts(path: Path, weights: dict[str, Any]) -> None:
    """ffn_gate_exps [E, I, H] + ffn_up_exps [E, I, H] -> HF gate_up_proj [E, 2I, H]."""
    for gate_name in [n for n in weights if n.endswith(".mlp.experts.gate_proj")]:
        prefix = gate_name.removesuffix("gate_proj")
        up = weights.pop(prefix + "up_proj", None)
        if up is None:
            raise ModelFormatError(f"{path.name}: {gate_name} has no matching up_proj experts")
        weights[prefix + "gate_up_proj"] = concat_rows([weights.pop(gate_name), up])


def _check_shapes(path: Path, weights: dict[str, Any], config: ModelConfig) -> None:
    """The shapes the metadata promises for the embedding and each mixer's input projection."""
    c = config
    expected = {"model.embed_tokens.weight": (c.vocab_size, c.hidden_size)}
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        if c.is_full_attention(i):
            rows = c.num_heads * c.head_dim * (2 if c.attn_output_gate else 1)
            expected[p + "self_attn.q_proj.weight"] = (rows, c.hidden_size)
        else:
            expected[p + "linear_attn.in_proj_qkv.weight"] = (c.conv_dim, c.hidden_size)
            expected[p + "linear_attn.out_proj.weight"] = (
                c.hidden_size, c.linear_num_value_heads * c.linear_value_head_dim)
    for name, shape in expected.items():
        if name not in weights:
            raise ModelFormatError(f"{path.name}: tensor {name} is missing")
        if tuple(weights[name].shape) != shape:
            raise ModelFormatError(f"{path.name}: tensor {name} has shape "
                                   f"{weights[name].shape}, the metadata implies {shape}")
