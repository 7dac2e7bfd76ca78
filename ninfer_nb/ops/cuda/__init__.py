"""CUDA backend of the op interface (ops/base.py): same names and signatures as `ops/cpu.py`,
over device Tensors (fp32 activations, bf16 or fp32 weights, fp32 GDN/conv state, fp32, bf16 or
int8 KV cache).

`CudaOps(scratch, stream)` is the `ops` object a model receives: outputs come from the
per-step `ScratchArena` (reset by the runner at the start of each step, so addresses repeat
and the step is graph-capturable), kernels launch on the engine stream. Index inputs (ids,
positions) must be int32 device tensors. Ops documented in ops/cpu.py as in-place (kv_store,
causal_conv1d state, gated_delta_rule state) are in place here too. `normed` of one token
returns a `Normed` record that the decode kernels normalise as they read it; `plain`
materialises one for a consumer without such a kernel.

One module per op family (norm, linear, attention, gdn, moe, sampling), each a mixin over
launch.CudaOpsBase holding its kernel-choice rules; limits.py says which model shapes the
kernels cannot run.
"""
from __future__ import annotations

from .attention import DECODE_MAX_T, AttentionOps
from .gdn import GdnOps
from .launch import EXPERIMENTAL
from .limits import check_model, unsupported_shapes
from .linear import one_token_build, one_token_build_x8
from .moe import MoeOps
from .norm import Normed
from .sampling import SamplingOps


class CudaOps(AttentionOps, GdnOps, MoeOps, SamplingOps):
    """Every op of the contract (ops/base.py) on one device stream; see the package docstring."""


__all__ = ["DECODE_MAX_T", "EXPERIMENTAL", "CudaOps", "Normed", "check_model", "one_token_build",
           "one_token_build_x8", "unsupported_shapes"]
