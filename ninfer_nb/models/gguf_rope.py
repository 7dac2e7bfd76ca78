"""The RoPE scaling a GGUF file declares, as its ModelConfig's RopeScaling (config.py).

llama.cpp's converter stores Llama 3.x's frequency scaling as the tensor `rope_freqs.weight`
([rotary_dim/2] factors: pair i's frequency is divided by factor i) and other scaling as
`{arch}.rope.scaling.*` metadata. The factors and linear scaling are taken; any other scaling
type (YaRN, LongRoPE, ...) is refused with its key named, so no file loads with a RoPE the
engine does not compute. Knows nothing about the rest of the file.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

import numpy as np

from ..config import ModelConfig, RopeScaling
from ..errors import ModelFormatError, UnsupportedModelError

ROPE_FREQS = "rope_freqs.weight"


def with_gguf_rope(cfg: ModelConfig, arch: str, fields: Mapping[str, Any], tensors: Mapping[str, Any],
                   name: str) -> ModelConfig:
    """cfg with the file's RoPE scaling; `fields` the metadata values, `tensors` the GGUF tensors
    by name (ReaderTensor: .data), `name` the file's name for errors."""
    key = f"{arch}.rope.scaling.type"
    kind = str(fields.get(key) or "none")
    scaling = RopeScaling()
    if kind == "linear":
        factor = fields.get(f"{arch}.rope.scaling.factor")
        if not isinstance(factor, (int, float)) or factor <= 0:
            raise ModelFormatError(f"{name}: {arch}.rope.scaling.factor must be a positive number, got {factor!r}")
        scaling = RopeScaling("linear", factor=float(factor))
    elif kind != "none":
        raise UnsupportedModelError(f"{name}: {key} = {kind} is not supported (none, linear; "
                                    "Llama 3 scaling as the rope_freqs tensor)")
    longrope = sorted(t for t in tensors if t.startswith("rope_factors_"))
    if longrope:
        raise UnsupportedModelError(f"{name}: LongRoPE factor tensors ({', '.join(longrope)}) are not supported")
    if ROPE_FREQS in tensors:
        factors = np.asarray(tensors[ROPE_FREQS].data, dtype=np.float64).reshape(-1)
        if factors.shape != (cfg.rotary_dim // 2,) or not np.all(np.isfinite(factors) & (factors > 0)):
            raise ModelFormatError(f"{name}: {ROPE_FREQS} must hold {cfg.rotary_dim // 2} positive "
                                   f"factors, got shape {factors.shape}")
        scaling = replace(scaling, freq_factors=tuple(float(f) for f in factors))
    return replace(cfg, rope_scaling=scaling)
