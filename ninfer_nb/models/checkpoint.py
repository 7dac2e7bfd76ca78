"""A loaded checkpoint: config, host weights under Hugging Face names, tokenizer.

Every loader (safetensors directory, GGUF file, random preset) produces one of these; the
model builders consume it. Weights are a mapping (possibly read lazily, tensor by tensor, from
memory-mapped files) of host NumPy arrays in the checkpoint's stored dtype (float32, float16,
ml_dtypes.bfloat16), `[out, in]` for linear layers, or QuantizedWeight records for weights the
loader keeps quantized (formats without an exact record are dequantized to float32).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..config import ModelConfig

if TYPE_CHECKING:
    from ..chat.tokenizer import Tokenizer


@dataclass
class LoadedCheckpoint:
    config: ModelConfig
    weights: Mapping[str, Any]               # HF text-decoder names, e.g. "model.layers.0.mlp.up_proj.weight"
    tokenizer: "Tokenizer | None"
    source: str                              # path or preset name, for messages
    name: str                                # short display id, e.g. "SmolLM2-135M-Instruct"
    metadata: dict[str, object] = field(default_factory=dict)
