"""Immutable configuration: the model's hyper-parameters and the engine's settings.

`ModelConfig` is parsed from a Hugging Face `config.json` (or GGUF metadata) and describes one
text decoder; `EngineConfig` holds what the user chose (device, context, chunking). Neither
knows about weights, kernels or requests.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from .errors import ModelFormatError, UnsupportedModelError
from .ops.kernel_choices import KernelChoices

Architecture = Literal["qwen3_5", "llama"]

# model_type (root or text_config) -> (architecture, is_moe)
_MODEL_TYPES: dict[str, tuple[Architecture, bool]] = {
    "qwen3_5": ("qwen3_5", False),
    "qwen3_5_text": ("qwen3_5", False),
    "qwen3_5_moe": ("qwen3_5", True),
    "qwen3_5_moe_text": ("qwen3_5", True),
    "llama": ("llama", False),
    "mistral": ("llama", False),
    "qwen2": ("llama", False),
    "qwen3": ("llama", False),
}
# model types that look close to a supported one but are not: refused with the reason
_REFUSED_MODEL_TYPES: dict[str, str] = {
    "qwen3_next": "Qwen3-Next's layers (gated attention layout, MoE and norms) differ from Qwen3.5's "
                  "and are not implemented",
}

RopeType = Literal["default", "linear", "llama3", "yarn"]


@dataclass(frozen=True)
class RopeScaling:
    """`rope_parameters` / `rope_scaling` beyond rope_theta and the rotary fraction: how the
    rotary frequencies are stretched for long context (models/rope.py has the formulas, those
    of transformers' modeling_rope_utils). Fields a type does not use keep their defaults."""

    rope_type: RopeType = "default"
    factor: float = 1.0                          # linear, llama3, yarn
    original_max_position_embeddings: int = 0    # llama3, yarn: the pretraining context
    low_freq_factor: float = 1.0                 # llama3
    high_freq_factor: float = 4.0                # llama3
    beta_fast: float = 32.0                      # yarn: rotations bounding the frequency ramp
    beta_slow: float = 1.0                       # yarn
    truncate: bool = True                        # yarn: the ramp's ends rounded to whole dims
    attention_factor: float | None = None        # yarn: cos/sin scale (None: from factor, mscale)
    mscale: float = 0.0                          # yarn
    mscale_all_dim: float = 0.0                  # yarn
    # llama.cpp's rope_freqs (GGUF, models/gguf_rope.py): pair i's frequency divided by factor i
    freq_factors: tuple[float, ...] = ()


# keys every rope dict may carry (mrope sections: text-only positions make them plain RoPE)
_ROPE_COMMON_KEYS = frozenset({"rope_type", "type", "rope_theta", "partial_rotary_factor",
                               "mrope_section", "mrope_interleaved"})
_ROPE_KEYS: dict[str, frozenset[str]] = {
    "default": frozenset(),
    "linear": frozenset({"factor"}),
    "llama3": frozenset({"factor", "low_freq_factor", "high_freq_factor",
                         "original_max_position_embeddings"}),
    "yarn": frozenset({"factor", "original_max_position_embeddings", "attention_factor",
                       "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"}),
}
_ROPE_REQUIRED: dict[str, tuple[str, ...]] = {
    "linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
}
_ROPE_REFUSED: dict[str, str] = {
    "dynamic": "its frequencies follow the running sequence length, so keys cached at one "
               "length would be rotated for another (not graph-safe)",
    "longrope": "it switches frequency sets with the running sequence length, so keys cached "
                "at one length would be rotated for another (not graph-safe)",
}


def _rope_number(field: str, rope: dict[str, Any], key: str, default: float | None = None,
                 positive: bool = True) -> float:
    value = rope.get(key)
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (positive and value <= 0):
        raise ModelFormatError(f"config {field}.{key} must be a positive number, got {value!r}")
    return float(value)


def parse_rope_scaling(field: str, rope: dict[str, Any], original_max: Any,
                       max_position_embeddings: int) -> RopeScaling:
    """The RopeScaling of a config's rope dict (`field` names it in errors); `original_max` is a
    root-level original_max_position_embeddings (it wins, as in transformers). Unknown types,
    unknown keys and bad values are refused: a rope the engine does not compute exactly would
    give wrong logits without a word."""
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type in _ROPE_REFUSED:
        raise UnsupportedModelError(
            f"{field}.rope_type = {rope_type} is not supported: {_ROPE_REFUSED[rope_type]}")
    if rope_type not in _ROPE_KEYS:
        raise UnsupportedModelError(
            f"{field}.rope_type = {rope_type!r} is not supported (supported: {', '.join(_ROPE_KEYS)})")
    unknown = sorted(set(rope) - _ROPE_COMMON_KEYS - _ROPE_KEYS[rope_type])
    if unknown:
        raise UnsupportedModelError(f"{field}: {', '.join(unknown)} not supported for rope_type {rope_type}")
    for key in _ROPE_REQUIRED.get(rope_type, ()):
        if rope.get(key) is None:
            raise ModelFormatError(f"config {field} (rope_type {rope_type}) lacks {key}")
    if rope_type == "default":
        return RopeScaling()
    if rope_type == "linear":
        return RopeScaling("linear", factor=_rope_number(field, rope, "factor"))
    if original_max is None:
        original_max = rope.get("original_max_position_embeddings", max_position_embeddings)
    original = int(_rope_number(field, {"original_max_position_embeddings": original_max},
                                "original_max_position_embeddings"))
    if rope_type == "llama3":
        low = _rope_number(field, rope, "low_freq_factor")
        high = _rope_number(field, rope, "high_freq_factor")
        if high <= low:
            raise ModelFormatError(f"config {field}: high_freq_factor {high} must exceed low_freq_factor {low}")
        return RopeScaling("llama3", factor=_rope_number(field, rope, "factor"),
                           original_max_position_embeddings=original,
                           low_freq_factor=low, high_freq_factor=high)
    factor = rope.get("factor")
    attention = rope.get("attention_factor")
    truncate = rope.get("truncate", True)
    if not isinstance(truncate, bool):
        raise ModelFormatError(f"config {field}.truncate must be true or false, got {truncate!r}")
    return RopeScaling(
        "yarn", original_max_position_embeddings=original,
        factor=(max_position_embeddings / original if factor is None
                else _rope_number(field, rope, "factor")),
        beta_fast=_rope_number(field, rope, "beta_fast", 32.0),
        beta_slow=_rope_number(field, rope, "beta_slow", 1.0),
        truncate=truncate,
        attention_factor=None if attention is None else _rope_number(field, rope, "attention_factor"),
        mscale=_rope_number(field, rope, "mscale", 0.0, positive=False),
        mscale_all_dim=_rope_number(field, rope, "mscale_all_dim", 0.0, positive=False),
    )


def _required(cfg: dict[str, Any], name: str) -> int:
    """A positive integer field a config must have, or a one-line error naming it."""
    value = cfg.get(name)
    if value is None:
        raise ModelFormatError(f"config lacks the required field {name!r}")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value or value <= 0:
        raise ModelFormatError(f"config field {name!r} must be a positive integer, got {value!r}")
    return int(value)


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
    rope_scaling: RopeScaling = RopeScaling()
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
        """Parse a Hugging Face config.json dict (multimodal wrappers nest `text_config`). A value
        of the wrong type is a ModelFormatError, never a traceback."""
        try:
            return ModelConfig._from_hf(raw)
        except (TypeError, ValueError, AttributeError, ZeroDivisionError) as exc:
            raise ModelFormatError(f"config has a malformed value ({exc})") from None

    @staticmethod
    def _from_hf(raw: dict[str, Any]) -> "ModelConfig":
        root_type = str(raw.get("model_type", ""))
        text = raw.get("text_config") or raw
        model_type = str(text.get("model_type") or root_type)
        key = model_type if model_type in _MODEL_TYPES else root_type
        if model_type in _REFUSED_MODEL_TYPES or root_type in _REFUSED_MODEL_TYPES:
            name = model_type if model_type in _REFUSED_MODEL_TYPES else root_type
            raise UnsupportedModelError(f"model_type {name!r} is not supported: {_REFUSED_MODEL_TYPES[name]}")
        if key not in _MODEL_TYPES:
            supported = ", ".join(sorted(_MODEL_TYPES))
            raise UnsupportedModelError(
                f"unsupported model_type {model_type or root_type!r} (supported: {supported})"
            )
        arch, _ = _MODEL_TYPES[key]
        get = text.get
        hidden = _required(text, "hidden_size")
        heads = _required(text, "num_attention_heads")
        head_dim = int(get("head_dim") or hidden // heads)
        rope_field = "rope_parameters" if get("rope_parameters") else "rope_scaling"
        rope = get(rope_field) or {}
        if not isinstance(rope, dict) or any(isinstance(v, dict) for v in rope.values()):
            raise UnsupportedModelError(f"config {rope_field}: expected one flat dict of RoPE "
                                        "parameters (per-layer-type RoPE is not supported)")
        rope_theta = float(rope.get("rope_theta") or get("rope_theta") or 10000.0)
        partial = float(rope.get("partial_rotary_factor") or get("partial_rotary_factor") or 1.0)
        rotary_dim = int(head_dim * partial)
        if rotary_dim <= 0 or rotary_dim % 2 or rotary_dim > head_dim:
            raise UnsupportedModelError(f"config partial_rotary_factor {partial} gives {rotary_dim} "
                                        f"rotary dims of a {head_dim}-dim head (want an even 2..{head_dim})")
        max_positions = int(get("max_position_embeddings") or 32768)
        rope_scaling = parse_rope_scaling(rope_field, rope, get("original_max_position_embeddings"),
                                          max_positions)
        eos = get("eos_token_id", raw.get("eos_token_id"))
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        num_layers = _required(text, "num_hidden_layers")
        common: dict[str, Any] = dict(
            architecture=arch,
            model_type=model_type,
            vocab_size=_required(text, "vocab_size"),
            hidden_size=hidden,
            num_layers=num_layers,
            intermediate_size=int(get("intermediate_size") or 0),
            num_heads=heads,
            num_kv_heads=int(get("num_key_value_heads") or heads),
            head_dim=head_dim,
            rms_norm_eps=float(get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rotary_dim=rotary_dim,
            max_position_embeddings=max_positions,
            rope_scaling=rope_scaling,
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
            linear_num_key_heads=_required(text, "linear_num_key_heads"),
            linear_num_value_heads=_required(text, "linear_num_value_heads"),
            linear_key_head_dim=_required(text, "linear_key_head_dim"),
            linear_value_head_dim=_required(text, "linear_value_head_dim"),
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
    spec: str = "off"                        # speculative decoding: off | ngram (CPU / eager backends)
    draft_tokens: int = 3                    # draft tokens per verify round (spec != off)
    adaptive_draft: bool = False             # spec != off: K from the measured acceptance, up to draft_tokens
    weights: str | None = None               # random:PRESET models: a quantized weight format (int4-g64, ...)
    # requests decoding at once (the scheduler's lanes); None = auto: llm.default_concurrency (CUDA:
    # up to 16, sized by memory; 8 on the CPU; 1 with --spec mtp on CUDA); 1: the one-sequence path (contiguous KV,
    # decode graphs queued ahead)
    max_concurrency: int | None = None
    # KV page pool (64 tokens each); None: on CUDA kv_cache_fraction of the device memory left
    # after the weights, on the CPU every lane's full context
    kv_pages: int | None = None
    kv_cache_fraction: float = 0.9
    # paged lanes: prefixes shared by every request (engine/prefix_cache.py); snapshot slots of
    # GDN state it may fill (None: 2 per lane + 4)
    prefix_cache: bool = True
    prefix_snapshots: int | None = None
    host_cache_mib: int = 0                  # host memory evicted prefix pages / snapshots move to
