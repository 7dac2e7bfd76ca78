"""Which linear weight records (models/weights.py) the CUDA kernels run.

Dense records run on the bf16 or fp32 kernels their storage tag names (engine/upload_policy.py
sets it); the ops branch on the tag, never on the tensor's dtype. Quantized formats and fp16
storage have no kernels yet: they are refused with an UnsupportedModelError naming the op.
"""
from __future__ import annotations

from typing import Any

from ...errors import UnsupportedModelError
from ...models.weights import DenseWeight, QuantizedWeight, as_linear

KERNEL_DTYPES = ("bf16", "f32")


def dense(weight: Any, op: str) -> DenseWeight:
    """The dense record of a linear weight the kernels can read (a bare tensor counts as a
    DenseWeight of its dtype)."""
    w = as_linear(weight)
    if isinstance(w, QuantizedWeight):
        raise UnsupportedModelError(f"{op}: no CUDA kernel for {w.format.name} weights yet")
    if w.dtype not in KERNEL_DTYPES:
        raise UnsupportedModelError(f"{op}: no CUDA kernel for {w.dtype} weights yet")
    return w
