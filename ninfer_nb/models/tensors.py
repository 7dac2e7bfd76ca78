"""Helpers the architecture builders share: named access to checkpoint tensors with a clear
error for a missing one, fp32 contiguous copies, and the fused SwiGLU MLP weights."""
from __future__ import annotations

import numpy as np

from ..errors import ModelFormatError
from .weights import MLPWeights


class NamedTensors:
    """Named access with a clear error for a missing tensor."""

    def __init__(self, weights: dict[str, np.ndarray], source: str) -> None:
        self.w, self.source = weights, source

    def __call__(self, name: str) -> np.ndarray:
        try:
            return self.w[name]
        except KeyError:
            raise ModelFormatError(f"{self.source}: missing tensor {name}") from None

    def get(self, name: str) -> np.ndarray | None:
        return self.w.get(name)


def f32(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32)


def mlp_weights(t: NamedTensors, p: str) -> MLPWeights:
    gate_up = np.concatenate([t(p + "gate_proj.weight"), t(p + "up_proj.weight")])
    return MLPWeights(gate_up=f32(gate_up), down=f32(t(p + "down_proj.weight")))
