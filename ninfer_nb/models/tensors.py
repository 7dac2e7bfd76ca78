"""Helpers the architecture builders share: named access to checkpoint tensors with a clear
error for a missing one, fp32 contiguous copies of vectors, row-fused projections (one GEMV
instead of several at decode), and the fused SwiGLU MLP weights. Linear weights keep the
checkpoint's stored format (`dense`: f32 / bf16 / f16 `DenseWeight`, or the loader's
`QuantizedWeight`; quant/rows.py does the row operations on both); where they go on a device
is engine/upload_policy.py's call."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

import numpy as np

from ..errors import ModelFormatError
from .weights import AttentionWeights, DenseWeight, LinearWeight, MLPWeights, MoEWeights, QuantizedWeight

Place = Callable[[Any], Any]        # a built part -> the same part where it will run (a device)


def keep(part: Any) -> Any:
    """The default `place`: the host part as it is."""
    return part


class NamedTensors:
    """Named access with a clear error for a missing tensor. Values are host arrays in their
    stored dtype or quantized records (the checkpoint mapping may read them lazily)."""

    def __init__(self, weights: Mapping[str, Any], source: str) -> None:
        self.w, self.source = weights, source

    def __call__(self, name: str) -> Any:
        try:
            return self.w[name]
        except KeyError:
            raise ModelFormatError(f"{self.source}: missing tensor {name}") from None

    def get(self, name: str) -> Any:
        return self.w.get(name)


def f32(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32)


def dense(x: Any) -> LinearWeight:
    """A checkpoint matrix (or expert stack) as a host linear weight in its stored format."""
    from ..quant.rows import dense_record  # quant.rows imports models: not at module level

    return dense_record(x)


def fuse_rows(*parts: Any) -> LinearWeight:
    """Stack projection matrices [N_i, H] into one [sum N_i, H] linear weight (their common
    stored format; float32 when they differ)."""
    from ..quant.rows import concat_rows

    return concat_rows(parts)


def fuse_biases(biases: list[np.ndarray | None], rows: list[int]) -> np.ndarray | None:
    """One bias for row-fused projections (zeros for parts without one); None if none has one."""
    if all(b is None for b in biases):
        return None
    return f32(np.concatenate([np.zeros(n, np.float32) if b is None else b
                               for b, n in zip(biases, rows)]))


def qkv_weights(q: Any, k: Any, v: Any, o: Any, rope_table: np.ndarray,
                gate: Any = None, biases: tuple = (None, None, None),
                q_norm: np.ndarray | None = None, k_norm: np.ndarray | None = None
                ) -> AttentionWeights:
    """Attention weights with q | gate | k | v fused row-wise (gate: the output-gate rows)."""
    parts = [q] + ([gate] if gate is not None else []) + [k, v]
    qb, kb, vb = biases
    bias_parts = [qb] + ([None] if gate is not None else []) + [kb, vb]
    return AttentionWeights(
        qkv=fuse_rows(*parts), o=dense(o), rope_table=rope_table, gated=gate is not None,
        qkv_bias=fuse_biases(bias_parts, [p.shape[0] for p in parts]),
        q_norm=None if q_norm is None else f32(q_norm), k_norm=None if k_norm is None else f32(k_norm),
    )


def fold_shared_expert(moe: MoEWeights) -> MoEWeights:
    """The gated shared expert as expert E (see MoEWeights.shared_slot), when it has the routed
    experts' width and a gate; otherwise `moe` unchanged."""
    shared, gate = moe.shared, moe.shared_gate
    if shared is None or gate is None or shared.gate_up.shape != moe.gate_up.shape[1:]:
        return moe
    from ..quant.rows import concat_rows

    return MoEWeights(
        router=fuse_rows(moe.router, gate),
        gate_up=concat_rows([moe.gate_up, _as_stack(shared.gate_up)], axis_rows=0),
        down=concat_rows([moe.down, _as_stack(shared.down)], axis_rows=0),
        top_k=moe.top_k, renormalize=moe.renormalize, shared_slot=True)


def _as_stack(w: LinearWeight) -> LinearWeight:
    """A matrix [N, K] as a one-expert stack [1, N, K] (views)."""
    if isinstance(w, QuantizedWeight):
        return QuantizedWeight(w.format, (1,) + tuple(w.shape), {k: a[None] for k, a in w.arrays.items()})
    return DenseWeight(w.data[None], w.dtype)


def mlp_weights(t: NamedTensors, p: str) -> MLPWeights:
    return MLPWeights(gate_up=fuse_rows(t(p + "gate_proj.weight"), t(p + "up_proj.weight")),
                      down=dense(t(p + "down_proj.weight")))
