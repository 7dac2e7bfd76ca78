"""Random weights in a quantized format for benchmarks (`bench --random PRESET --weights FMT`):
which of a preset's weights take the format, and the per-group scale that keeps a random
weight's spread what the dense random weights have.

A preset's weights are laid out by models/presets.py random_weights(cfg, make), one `make`
call per array in a fixed order; `quantized_calls` names the calls whose weight is stored in
the format: the linear matrices, but not the embedding (looked up by row), the MoE routers and
the shared-expert gate (kept as stored, as the checkpoint formats keep them) nor matrices with
a side of at most 8. Expert stacks stay dense until the MoE kernels read quantized stacks.
Knows nothing about devices.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from ..models.presets import random_weights
from ..models.weights import MoEWeights
from .formats import QuantFormat

SMALL_SIDE = 8


def quantized_calls(cfg: Any) -> frozenset[int]:
    """Indices (in call order) of the `make` calls of random_weights(cfg, make) whose weight a
    quantized random model stores in the format."""
    calls: list[SimpleNamespace] = []

    def make(shape: tuple[int, ...], kind: str) -> SimpleNamespace:
        calls.append(SimpleNamespace(shape=tuple(shape), kind=kind, index=len(calls)))
        return calls[-1]

    w = random_weights(cfg, make)
    kept = {id(w.embed)}
    for layer in w.layers + ([w.mtp.layer] if w.mtp is not None else []):
        if isinstance(layer.ffn, MoEWeights):
            kept |= {id(layer.ffn.router), id(layer.ffn.shared_gate)}
    return frozenset(c.index for c in calls
                     if c.kind == "matrix" and min(c.shape) > SMALL_SIDE and id(c) not in kept)


def group_scale(fmt: QuantFormat, half_width: float) -> float:
    """The scale of a group whose codes are uniform over 0 .. 2^bits - 1 (symmetric zero point)
    so the weights spread over about U(-half_width, half_width), as the dense random ones."""
    return half_width / fmt.midpoint
