"""Which storage each weight takes on the device: the upload policy, in one place.

Rules (a dense linear weight's tag, set here and read by the CUDA ops):
- expert stacks [E, N, K] go up as bf16 (the MoE kernels read bf16);
- small matrices (a side of at most 8: the shared expert's gate row) as fp32;
- other matrices (projections, router, LM head, embedding) as bf16 when every value is a
  bfloat16 (HF bf16 checkpoints: nothing is lost), else fp32, so the GPU computes what the CPU
  does on dequantized GGUF or fp32 weights; random preset weights are bf16 by construction;
- vectors (norms, biases, conv taps, A_log, dt_bias) as fp32;
- quantized records keep their format: their arrays go up as stored, in the canonical layout
  the quantized GEMVs read (kernels/linear/gemv_quant.py: no repack); device allocations are
  256-byte aligned, so every code row starts 16-byte aligned.
`put(host_array, storage)` is the backend's copy to the device (storage None: as stored).
Knows nothing about devices or kernels beyond these rules.
"""
from __future__ import annotations

from typing import Any, Callable

import ml_dtypes
import numpy as np

from ..models.weights import DenseDtype, DenseWeight, LinearWeight, ModelWeights, map_weights

SMALL_SIDE = 8                     # a matrix with a side this short stays fp32
STORAGE: dict[str, np.dtype] = {"f32": np.dtype(np.float32), "bf16": np.dtype(ml_dtypes.bfloat16),
                                "f16": np.dtype(np.float16)}

Put = Callable[[np.ndarray, "np.dtype | None"], Any]


def bf16_exact(a: np.ndarray) -> bool:
    """True when every value is a bfloat16 (HF bf16 checkpoints): uploading as bf16 loses
    nothing."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return not bool(np.any(bits & 0xFFFF))


def dense_storage(shape: tuple[int, ...], host: np.ndarray | None = None) -> DenseDtype:
    """The device storage of a dense linear weight of `shape`; `host` its values (None: random
    weights, drawn as bf16)."""
    if len(shape) == 3:
        return "bf16"
    if min(shape[-2:]) <= SMALL_SIDE:
        return "f32"
    return "bf16" if host is None or bf16_exact(host) else "f32"


def upload_linear(w: LinearWeight, put: Put) -> LinearWeight:
    """One linear record on the device: a dense one in its policy storage, tagged with it."""
    if isinstance(w, DenseWeight):
        storage = dense_storage(w.shape, np.asarray(w.data))
        return DenseWeight(put(np.asarray(w.data), STORAGE[storage]), storage)
    return w.map_arrays(lambda a: put(np.asarray(a), None))


def upload_weights(weights: ModelWeights, put: Put) -> ModelWeights:
    """Every weight on the device by the rules above; shared records stay shared (a tied
    lm_head is the embedding's record)."""
    return map_weights(weights, lambda w: upload_linear(w, put),
                       lambda a: put(np.asarray(a), STORAGE["f32"]))


def random_storage(shape: tuple[int, ...], kind: str) -> DenseDtype:
    """The storage of a random preset weight of this presets.Kind (linear kinds by the dense
    rule, everything else fp32)."""
    return dense_storage(shape) if kind in ("matrix", "experts") else "f32"
