"""A loaded checkpoint: config, host weights under Hugging Face names, tokenizer.

Every loader (safetensors directory, GGUF file, random preset) produces one of these; the
model builders consume it. Weights are host NumPy arrays, `[out, in]` for linear layers, in the
checkpoint's own precision or float32 (quantized formats are dequantized by the loader).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..config import ModelConfig

if TYPE_CHECKING:
    from ..chat.tokenizer import Tokenizer


@dataclass
class LoadedCheckpoint:
    config: ModelConfig
    weights: dict[str, np.ndarray]          # HF text-decoder names, e.g. "model.layers.0.mlp.up_proj.weight"
    tokenizer: "Tokenizer | None"
    source: str                              # path or preset name, for messages
    name: str                                # short display id, e.g. "SmolLM2-135M-Instruct"
    metadata: dict[str, object] = field(default_factory=dict)
