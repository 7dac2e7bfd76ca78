"""Model definitions: configs -> runtime weights -> the shared decoder forward."""
from __future__ import annotations

import numpy as np

from ..config import ModelConfig
from . import llama, qwen3_5
from .decoder import Decoder
from .weights import ModelWeights


def build_weights(cfg: ModelConfig, weights: dict[str, np.ndarray], source: str) -> ModelWeights:
    builder = qwen3_5.build_weights if cfg.architecture == "qwen3_5" else llama.build_weights
    return builder(cfg, weights, source)


__all__ = ["Decoder", "ModelWeights", "build_weights"]
