"""Helpers the architecture builders share: named access to checkpoint tensors with a clear
error for a missing one, fp32 contiguous copies, row-fused projections (one GEMV instead of
several at decode), and the fused SwiGLU MLP weights. Linear weights come out as host fp32
`DenseWeight` records (`dense`); where they go on a device is engine/upload_policy.py's call."""
from __future__ import annotations

import numpy as np

from ..errors import ModelFormatError
from .weights import AttentionWeights, DenseWeight, MLPWeights, MoEWeights


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


def dense(x: np.ndarray) -> DenseWeight:
    """A checkpoint matrix (or expert stack) as a host fp32 linear weight."""
    return DenseWeight(f32(x), "f32")


def fuse_rows(*parts: np.ndarray) -> DenseWeight:
    """Stack projection matrices [N_i, H] into one [sum N_i, H] fp32 linear weight."""
    return dense(np.concatenate(parts, axis=0))


def fuse_biases(biases: list[np.ndarray | None], rows: list[int]) -> np.ndarray | None:
    """One bias for row-fused projections (zeros for parts without one); None if none has one."""
    if all(b is None for b in biases):
        return None
    return f32(np.concatenate([np.zeros(n, np.float32) if b is None else b
                               for b, n in zip(biases, rows)]))


def qkv_weights(q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray, rope_table: np.ndarray,
                gate: np.ndarray | None = None, biases: tuple = (None, None, None),
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
    return MoEWeights(
        router=fuse_rows(_host(moe.router), _host(gate)),
        gate_up=dense(np.concatenate([_host(moe.gate_up), _host(shared.gate_up)[None]], axis=0)),
        down=dense(np.concatenate([_host(moe.down), _host(shared.down)[None]], axis=0)),
        top_k=moe.top_k, renormalize=moe.renormalize, shared_slot=True)


def _host(w: object) -> np.ndarray:
    """The host array of a dense linear weight built here (the builders fold before upload)."""
    assert isinstance(w, DenseWeight), type(w)
    return w.data


def mlp_weights(t: NamedTensors, p: str) -> MLPWeights:
    gate_up = np.concatenate([t(p + "gate_proj.weight"), t(p + "up_proj.weight")])
    return MLPWeights(gate_up=dense(gate_up), down=dense(t(p + "down_proj.weight")))
