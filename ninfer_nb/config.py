"""Immutable configuration: the model's hyper-parameters and the engine's settings.

`ModelConfig` is parsed from a Hugging Face `config.json` (or GGUF metadata) and describes one
text decoder; `EngineConfig` holds what the user chose (device, context, chunking). Neither
knows about weights, kernels or requests.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from .errors import UnsupportedModelError
from .ops.kernel_choices import KernelChoices

Architecture = Literal["qwen3_5", "llama"]

# model_type (root or text_config) -> (architecture, is_moe)
_MODEL_TYPES: dict[str, tuple[Architecture, bool]] = {
    "qwen3_5": ("qwen3_5", False),
    "qwen3_5_text": ("qwen3_5", False),
    "qwen3_5_moe": ("qwen3_5", True),
    "qwen3_5_moe_text": ("qwen3_5", True),
    "qwen3_next": ("qwen3_5", True),
    "llama": ("llama", False),
    "mistral": ("llama", False),
    "qwen2": ("llama", False),
    "qwen3": ("llama", False),
}


@dataclass(frozen=True)
class ModelConfig:
    """One decoder's shapes. Llama-family models use only the common and attention fields."""

    architecture: Architecture
    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rotary_dim: int = 0                     # rotated dims per head (partial RoPE); = head_dim for Llama
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    attention_bias: bool = False            # qwen2: q/k/v biases
    qk_norm: bool = False                   # qwen3 / qwen3_5: per-head RMSNorm on q and k
    # --- qwen3_5 hybrid ---
    layer_types: tuple[str, ...] = ()       # "linear_attention" | "full_attention" per layer
    attn_output_gate: bool = False          # q_proj rows interleave query and gate per head
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 4
    # --- MoE ---
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = True
    mtp_num_hidden_layers: int = 0
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_hybrid(self) -> bool:
        return self.architecture == "qwen3_5"

    @property
    def conv_dim(self) -> int:
        return 2 * self.linear_num_key_heads * self.linear_key_head_dim + (
            self.linear_num_value_heads * self.linear_value_head_dim
        )

    def is_full_attention(self, layer: int) -> bool:
        if not self.layer_types:
            return True
        return self.layer_types[layer] == "full_attention"

    @staticmethod
    def from_hf(raw: dict[str, Any]) -> "ModelConfig":
        """Parse a Hugging Face config.json dict (multimodal wrappers nest `text_config`)."""
        root_type = str(raw.get("model_type", ""))
        text = raw.get("text_config") or raw
        model_type = str(text.get("model_type") or root_type)
        key = model_type if model_type in _MODEL_TYPES else root_type
        if key not in _MODEL_TYPES:
            supported = ", ".join(sorted(_MODEL_TYPES))
            raise UnsupportedModelError(
                f"unsupported model_type {model_type or root_type!r} (supported: {supported})"
            )
        arch, _ = _MODEL_TYPES[key]
        get = text.get
        hidden = int(get("hidden_size"))
        heads = int(get("num_attention_heads"))
        head_dim = int(get("head_dim") or hidden // heads)
        rope = get("rope_parameters") or get("rope_scaling") or {}
        rope_theta = float(rope.get("rope_theta") or get("rope_theta") or 10000.0)
        partial = float(rope.get("partial_rotary_factor") or get("partial_rotary_factor") or 1.0)
        eos = get("eos_token_id", raw.get("eos_token_id"))
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        num_layers = int(get("num_hidden_layers"))
        common: dict[str, Any] = dict(
            architecture=arch,
            model_type=model_type,
            vocab_size=int(get("vocab_size")),
            hidden_size=hidden,
            num_layers=num_layers,
            intermediate_size=int(get("intermediate_size") or 0),
            num_heads=heads,
            num_kv_heads=int(get("num_key_value_heads") or heads),
            head_dim=head_dim,
            rms_norm_eps=float(get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rotary_dim=int(head_dim * partial),
            max_position_embeddings=int(get("max_position_embeddings") or 32768),
            tie_word_embeddings=bool(
                raw.get("tie_word_embeddings", get("tie_word_embeddings", False))
            ),
            attention_bias=bool(get("attention_bias", model_type == "qwen2")),
            qk_norm=model_type in ("qwen3",) or arch == "qwen3_5",
            bos_token_id=get("bos_token_id", raw.get("bos_token_id")),
            eos_token_ids=tuple(int(e) for e in eos_ids),
        )
        if arch == "llama":
            return ModelConfig(**common)
        interval = int(get("full_attention_interval") or 4)
        layer_types = tuple(get("layer_types") or ())
        if not layer_types:
            layer_types = tuple(
                "full_attention" if (i + 1) % interval == 0 else "linear_attention"
                for i in range(num_layers)
            )
        return ModelConfig(
            **common,
            layer_types=layer_types,
            attn_output_gate=bool(get("attn_output_gate", True)),
            linear_num_key_heads=int(get("linear_num_key_heads")),
            linear_num_value_heads=int(get("linear_num_value_heads")),
            linear_key_head_dim=int(get("linear_key_head_dim")),
            linear_value_head_dim=int(get("linear_value_head_dim")),
            linear_conv_kernel_dim=int(get("linear_conv_kernel_dim") or 4),
            num_experts=int(get("num_experts") or 0),
            num_experts_per_tok=int(get("num_experts_per_tok") or 0),
            moe_intermediate_size=int(get("moe_intermediate_size") or 0),
            shared_expert_intermediate_size=int(get("shared_expert_intermediate_size") or 0),
            norm_topk_prob=bool(get("norm_topk_prob", True)),
            mtp_num_hidden_layers=int(get("mtp_num_hidden_layers") or 0),
        )


# KV cache storage: "auto" takes the backend's default_kv_cache (bf16 on CUDA, fp32 on the CPU).
KV_CACHE_KINDS = ("auto", "fp32", "bf16", "int8")


@dataclass(frozen=True)
class DecodeChoices:
    """A/B switches of the decode loop (bench flags and tests), not user settings."""

    # the decode graph picks the next token itself (argmax, or Gumbel-max sampling for requests
    # with temperature alone): 4 bytes come back per token instead of the logits row
    device_pick: bool = True
    # with device_pick: each step is queued before the host reads the token it consumes
    # (Generator.decode_token(ahead=True)); a stop leaves the queued step's token fed
    decode_ahead: bool = True


@dataclass(frozen=True)
class EngineConfig:
    """What the user chose. Each CLI / server flag is one field, but `kernels` and `decode`:
    A/B switches for bench and tests."""

    model: str | None = None                 # HF dir, GGUF file, or preset; None = default model
    device: str = "auto"                     # auto | cpu | cuda | cuda:N
    max_context: int = 4096
    prefill_chunk: int = 1024
    cuda_graphs: bool = True
    # auto (the backend's default: bf16 on CUDA, fp32 on the CPU) | fp32 | bf16 | int8 (one fp32
    # scale per 64 values)
    kv_cache: str = "auto"
    kernels: KernelChoices = KernelChoices()  # which CUDA kernel serves an op (A/B runs: bench, tests)
    decode: DecodeChoices = DecodeChoices()
    enable_thinking: bool = True
    show_progress: bool = True
    seed: int | None = None
