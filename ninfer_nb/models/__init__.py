"""Model definitions: configs -> runtime weights -> the shared decoder forward."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..config import ModelConfig
from . import llama, qwen3_5
from .decoder import Decoder
from .tensors import Place, keep
from .weights import ModelWeights


def build_weights(cfg: ModelConfig, weights: Mapping[str, Any], source: str,
                  place: Place = keep) -> ModelWeights:
    """Runtime weights from checkpoint tensors (host arrays in their stored dtype or quantized
    records); `place` receives each layer, the embedding, norm and LM head as soon as they are
    built (a backend's upload), so a device load holds one layer on the host at a time."""
    builder = qwen3_5.build_weights if cfg.architecture == "qwen3_5" else llama.build_weights
    return builder(cfg, weights, source, place)


__all__ = ["Decoder", "ModelWeights", "build_weights"]
