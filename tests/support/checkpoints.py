"""Tiny random Hugging Face checkpoints of every supported architecture, for tests.

Built with transformers (torch, CPU) so that the HF model object is the outside oracle and the
files on disk are exactly what users bring: config.json, sharded safetensors with an index,
tokenizer files with the real Qwen3.6 vocabulary and chat template.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

QWEN_VOCAB = 248320

BASE_QWEN35: dict[str, Any] = dict(
    vocab_size=QWEN_VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
    linear_value_head_dim=16, linear_conv_kernel_dim=4, full_attention_interval=4,
    rms_norm_eps=1e-6, max_position_embeddings=4096, tie_word_embeddings=False,
    rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                     "partial_rotary_factor": 0.25, "mrope_section": [1, 1, 2],
                     "mrope_interleaved": True},
    bos_token_id=None, eos_token_id=248046, pad_token_id=248044,
)
BASE_MOE: dict[str, Any] = dict(
    BASE_QWEN35, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
    shared_expert_intermediate_size=48,
)
BASE_LLAMA: dict[str, Any] = dict(
    vocab_size=QWEN_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0,
    max_position_embeddings=4096, tie_word_embeddings=True, bos_token_id=None,
    eos_token_id=248046, pad_token_id=248044,
)


def build_hf_model(kind: str, seed: int = 0, **overrides: Any):
    """A randomly initialised transformers model (fp32, eval mode) of a tiny shape."""
    import torch
    import transformers as tf

    torch.manual_seed(seed)
    if kind == "qwen35":
        model = tf.Qwen3_5ForCausalLM(tf.Qwen3_5TextConfig(**dict(BASE_QWEN35, **overrides)))
    elif kind == "qwen35_moe":
        model = tf.Qwen3_5MoeForCausalLM(tf.Qwen3_5MoeTextConfig(**dict(BASE_MOE, **overrides)))
    elif kind == "llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(**dict(BASE_LLAMA, **overrides)))
    elif kind == "qwen3":
        cfg = dict(BASE_LLAMA, head_dim=32, tie_word_embeddings=False, **overrides)
        model = tf.Qwen3ForCausalLM(tf.Qwen3Config(**cfg))
    elif kind == "qwen2":
        model = tf.Qwen2ForCausalLM(tf.Qwen2Config(**dict(BASE_LLAMA, **overrides)))
    else:
        raise ValueError(kind)
    with torch.no_grad():
        # Random, decisive weights: norms away from their init so the +1 shift is exercised,
        # matrices large enough that logits are not near-ties.
        for name, p in model.named_parameters():
            if name.endswith("A_log") or name.endswith("dt_bias"):
                continue
            if p.ndim == 1:
                p.normal_(0.0, 0.3)
            else:
                p.normal_(0.0, 1.0 / max(p.shape[-1], 1) ** 0.5)
    return model.eval()


def mtp_tensors(model: Any, seed: int = 0) -> dict[str, Any]:
    """Random `mtp.*` tensors of a Qwen3.5 / 3.6 model's MTP head (what real checkpoints ship and
    HF transformers ignores): fc [H, 2H], the two pre-fc norms and the final norm [H], and one
    full-attention decoder layer named like the model's own full-attention layers (dense MLP
    or MoE), drawn like build_hf_model's weights."""
    import torch

    cfg = model.config
    fa = [i for i, kind in enumerate(cfg.layer_types) if kind == "full_attention"][0]
    prefix = f"model.layers.{fa}."
    gen = torch.Generator().manual_seed(1000 + seed)
    h = cfg.hidden_size

    def rand(shape: tuple[int, ...]) -> Any:
        if len(shape) == 1:
            return torch.randn(shape, generator=gen) * 0.3
        return torch.randn(shape, generator=gen) / max(shape[-1], 1) ** 0.5

    out = {f"mtp.layers.0.{k[len(prefix):]}": rand(tuple(v.shape))
           for k, v in model.state_dict().items() if k.startswith(prefix)}
    out["mtp.fc.weight"] = rand((h, 2 * h))
    for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        out[f"mtp.{name}.weight"] = rand((h,))
    return out


def write_tiny_checkpoint(dest: Path, kind: str, *, seed: int = 0, wrapper: bool = False,
                          tokenizer: bool = True, bf16: bool = False, drop: str | None = None,
                          mtp: bool = False, **overrides: Any):
    """Write a checkpoint directory; returns the HF model it was made from.

    bf16=True stores the weights in bfloat16 (the returned model is bf16 too).
    drop: a regex; matching tensors are left out of the files and zeroed in the returned model
    (e.g. the MoE shared expert, to check checkpoints that have none).
    mtp=True (Qwen3.5 kinds) adds a random MTP head (`mtp_tensors`; the returned model has none:
    transformers does not run it).
    wrapper=True writes the multimodal layout (`model.language_model.` names, nested
    `text_config`, plus a stray vision and MTP tensor that loaders must ignore)."""
    import torch
    from safetensors.torch import save_file

    model = build_hf_model(kind, seed, **overrides)
    if bf16:        # stored like real checkpoints: every engine backend then sees the same values
        model = model.to(torch.bfloat16)
    dest.mkdir(parents=True, exist_ok=True)
    if drop is not None:
        import re

        with torch.no_grad():
            for name, p in model.named_parameters():
                if re.search(drop, name):
                    p.zero_()
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()
             if drop is None or not __import__("re").search(drop, k)}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    text_cfg = model.config.to_dict()
    if mtp:
        text_cfg["mtp_num_hidden_layers"] = 1
    if wrapper:
        state = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v
                 for k, v in state.items()}
        state["model.visual.patch_embed.proj.weight"] = torch.zeros(4, 4)
        if not mtp:                                 # a stray MTP tensor the loader must ignore
            state["mtp.fc.weight"] = torch.zeros(4, 4)
        root = {"model_type": "qwen3_5_moe" if kind == "qwen35_moe" else "qwen3_5",
                "architectures": ["Qwen3_5ForConditionalGeneration"],
                "text_config": text_cfg, "vision_config": {"depth": 1},
                "tie_word_embeddings": text_cfg.get("tie_word_embeddings", False)}
    else:
        root = text_cfg
    if mtp:
        dtype = torch.bfloat16 if bf16 else torch.float32
        state.update({k: v.to(dtype).contiguous() for k, v in mtp_tensors(model, seed).items()})
    (dest / "config.json").write_text(json.dumps(root, indent=1, default=str))
    names = sorted(state)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half],
              "model-00002-of-00002.safetensors": names[half:]}
    weight_map = {}
    for fname, keys in shards.items():
        save_file({k: state[k] for k in keys}, str(dest / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in keys})
    (dest / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
    if tokenizer:
        from .qwen_tokenizer import write_qwen_tokenizer_files

        write_qwen_tokenizer_files(dest)
    return model
