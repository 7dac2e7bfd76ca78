"""Which storage each weight takes on the device: the upload policy, in one place.

Rules (a dense linear weight's tag, set here and read by the CUDA ops):
- expert stacks [E, N, K] go up as bf16 (the MoE kernels read bf16);
- small matrices (a side of at most 8: the shared expert's gate row) as fp32;
- other matrices (projections, router, LM head, embedding) as bf16 when every value is a
  bfloat16 (HF bf16 checkpoints: nothing is lost), else fp32, so the GPU computes what the CPU
  does on dequantized GGUF or fp32 weights; random preset weights are bf16 by construction;
- vectors (norms, biases, conv taps, A_log, dt_bias) as fp32;
- a dense record the loader tagged bf16 (a bf16 checkpoint) goes up as bf16 without a scan;
- quantized records keep their format, repacked losslessly into the tiled layout the
  tensor-core GEMVs read (quant/tiled.py: int4 / int8 groupwise and fp8-block matrices and
  expert stacks whose K fits the K-tiles); other groupwise matrices go up as stored (the SIMT
  GEMVs of kernels/linear/gemv_quant.py); device allocations are 256-byte aligned, so every
  code row / K-tile starts 16-byte aligned. Records the CUDA kernels cannot
  read yet (`device_readable`: other layouts, expert stacks) go up as their dense values.
`put(host_array, storage)` is the backend's copy to the device (storage None: as stored).
Knows nothing about devices or kernels beyond these rules.
"""
from __future__ import annotations

from typing import Any, Callable

import ml_dtypes
import numpy as np

from ..models.weights import DenseDtype, DenseWeight, LinearWeight, ModelWeights, QuantizedWeight, map_weights
from ..quant.tiled import device_layout, tileable

SMALL_SIDE = 8                     # a matrix with a side this short stays fp32
STORAGE: dict[str, np.dtype] = {"f32": np.dtype(np.float32), "bf16": np.dtype(ml_dtypes.bfloat16),
                                "f16": np.dtype(np.float16)}

Put = Callable[[np.ndarray, "np.dtype | None"], Any]


def bf16_exact(a: np.ndarray) -> bool:
    """True when every value is a bfloat16 (HF bf16 checkpoints): uploading as bf16 loses
    nothing."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return not bool(np.any(bits & 0xFFFF))


def dense_storage(shape: tuple[int, ...], host: np.ndarray | None = None,
                  tag: DenseDtype | None = None) -> DenseDtype:
    """The device storage of a dense linear weight of `shape`; `host` its values (None: random
    weights, drawn as bf16), `tag` the host record's storage tag."""
    if len(shape) == 3:
        return "bf16"
    if min(shape[-2:]) <= SMALL_SIDE:
        return "f32"
    return "bf16" if host is None or tag == "bf16" or bf16_exact(host) else "f32"


def device_readable(w: QuantizedWeight) -> bool:
    """Whether the CUDA ops read this quantized record (ops/cuda/linear_quant.py, moe.py): in
    the tiled layout (quant/tiled.py: groupwise int4 / int8 and fp8-block matrices and expert
    stacks), or as stored (other groupwise matrices)."""
    return tileable(w.format, w.shape) or (w.format.layout == "groupwise" and w.ndim == 2)


def upload_linear(w: LinearWeight, put: Put) -> LinearWeight:
    """One linear record on the device: a dense one in its policy storage, tagged with it."""
    if isinstance(w, QuantizedWeight) and not device_readable(w):
        from ..quant.dequant import dequantize

        w = DenseWeight(dequantize(w), "f32")
    if isinstance(w, DenseWeight):
        storage = dense_storage(w.shape, np.asarray(w.data), w.dtype)
        return DenseWeight(put(np.asarray(w.data), STORAGE[storage]), storage)
    return device_layout(w).map_arrays(lambda a: put(np.asarray(a), None))


def upload_weights(weights: ModelWeights, put: Put) -> ModelWeights:
    """Every weight on the device by the rules above; shared records stay shared (a tied
    lm_head is the embedding's record)."""
    return map_weights(weights, lambda w: upload_linear(w, put),
                       lambda a: put(np.asarray(a), STORAGE["f32"]))


def random_storage(shape: tuple[int, ...], kind: str) -> DenseDtype:
    """The storage of a random preset weight of this presets.Kind (linear kinds by the dense
    rule, everything else fp32)."""
    return dense_storage(shape) if kind in ("matrix", "experts") else "f32"
