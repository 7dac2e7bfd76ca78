"""Runtime weight structures shared by every architecture.

Each architecture module turns a checkpoint's HF-named tensors into these ("sanitize": split
or fuse projections, shift zero-centred norms by +1, reshape conv weights), so the forward code
in `layers.py` sees one layout. Arrays may be host NumPy or device tensors (after upload).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Callable

Weight = Any


@dataclass
class AttentionWeights:
    qkv: Weight                  # [heads*D (+ heads*D gate) + 2*kv*D, H]  rows: q | gate | k | v
    o: Weight                    # [H, heads*D]
    gated: bool = False          # Qwen3.5 output gate rows present (de-interleaved from q_proj)
    qkv_bias: Weight | None = None  # [rows of qkv] (zeros where a part has no bias)
    q_norm: Weight | None = None  # [D]
    k_norm: Weight | None = None  # [D]


@dataclass
class GDNWeights:
    in_proj: Weight     # [2*Hk*Dk + 2*Hv*Dv + 2*Hv, H]  rows: q | k | v (conv input) | z | a | b
    conv: Weight        # [2*Hk*Dk + Hv*Dv, K]  depthwise conv over the q | k | v channels
    a_log: Weight       # [Hv] fp32
    dt_bias: Weight     # [Hv] fp32
    norm: Weight        # [Dv]  plain (not zero-centred) gated-norm weight
    out: Weight         # [H, Hv*Dv]


@dataclass
class MLPWeights:
    gate_up: Weight     # [2I, H]  gate rows first, then up
    down: Weight        # [H, I]


@dataclass
class MoEWeights:
    router: Weight                      # [E (+1), H]  (+1: the shared expert's gate row, last)
    gate_up: Weight                     # [E (+1), 2I, H]
    down: Weight                        # [E (+1), H, I]
    top_k: int
    renormalize: bool
    shared: MLPWeights | None = None
    shared_gate: Weight | None = None   # [1, H]
    # The shared expert folded in as expert E, always routed with weight sigmoid(gate row . x)
    # (when its width equals the experts'): one GEMV and two expert kernels per layer at decode
    # instead of six more kernels for a separate gated MLP. `shared`/`shared_gate` are None then.
    shared_slot: bool = False


@dataclass
class LayerWeights:
    input_norm: Weight
    post_norm: Weight
    mixer: AttentionWeights | GDNWeights
    ffn: MLPWeights | MoEWeights


@dataclass
class ModelWeights:
    embed: Weight        # [V, H]
    layers: list[LayerWeights]
    norm: Weight         # [H]
    lm_head: Weight      # [V, H] (the embedding when tied)


def map_arrays(obj: Any, fn: Callable[[Any], Any], memo: dict[int, Any] | None = None) -> Any:
    """Apply `fn` to every array in a weight structure (e.g. upload to the device), keeping
    shared arrays shared (a tied lm_head stays one buffer)."""
    memo = {} if memo is None else memo
    if is_dataclass(obj):
        return type(obj)(**{f.name: map_arrays(getattr(obj, f.name), fn, memo) for f in fields(obj)})
    if isinstance(obj, list):
        return [map_arrays(x, fn, memo) for x in obj]
    if obj is None or isinstance(obj, (int, float, bool, str)):
        return obj
    key = id(obj)
    if key not in memo:
        memo[key] = fn(obj)
    return memo[key]


def unique_arrays(obj: Any) -> list[Any]:
    """Every distinct array in a weight structure (a tied lm_head counted once)."""
    found: list[Any] = []
    map_arrays(obj, lambda a: found.append(a) or a)
    return found
