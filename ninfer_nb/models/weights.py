"""Runtime weight structures shared by every architecture.

Each architecture module turns a checkpoint's HF-named tensors into these ("sanitize": split
or fuse projections, shift zero-centred norms by +1, reshape conv weights), so the forward code
in `layers.py` sees one layout.

A linear weight (a projection matrix [N, K], an expert stack [E, N, K], the router, the LM head
and the embedding table [V, H]) is a record, `LinearWeight`:
- `DenseWeight`: one array and its storage tag ("f32" | "bf16" | "f16"), set by whoever
  creates or uploads it (engine/upload_policy.py for the device);
- `QuantizedWeight`: a format from `quant/formats.py`, the logical shape and the format's named
  arrays (codes, scales, zero points).
Ops dispatch on the record type and the tag, never on an array's dtype; a new format is a new
record value, not new model code. Vectors (norms, biases, conv taps, A_log, dt_bias) stay plain
arrays. Arrays may be host NumPy or device tensors; this module knows nothing about devices.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Any, Callable, Literal, Mapping, Union

import numpy as np

from ..quant.formats import QuantFormat

Array = Any                       # a host NumPy array or a device tensor
DenseDtype = Literal["f32", "bf16", "f16"]
DENSE_DTYPES: tuple[str, ...] = ("f32", "bf16", "f16")


@dataclass(frozen=True, eq=False)
class DenseWeight:
    """A matrix [N, K] or an expert stack [E, N, K] stored as `dtype`."""

    data: Array
    dtype: DenseDtype

    def __post_init__(self) -> None:
        if self.dtype not in DENSE_DTYPES:
            raise ValueError(f"DenseWeight dtype must be one of {DENSE_DTYPES}, not {self.dtype!r}")

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def ndim(self) -> int:
        return len(self.data.shape)

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def expert(self, e: int) -> DenseWeight:
        """Expert e of a stack [E, N, K] as a matrix [N, K] (a view)."""
        return DenseWeight(self.data[e], self.dtype)

    def map_arrays(self, fn: Callable[[Array], Array]) -> DenseWeight:
        return replace(self, data=fn(self.data))


@dataclass(frozen=True, eq=False)
class QuantizedWeight:
    """A matrix [N, K] or an expert stack [E, N, K] in a quantized `format`; `arrays` holds the
    format's named arrays (quant/formats.py describes their layout)."""

    format: QuantFormat
    shape: tuple[int, ...]
    arrays: Mapping[str, Array]

    def __post_init__(self) -> None:
        if set(self.arrays) != set(self.format.arrays):
            raise ValueError(f"{self.format.name} holds arrays {self.format.arrays}, "
                             f"got {tuple(self.arrays)}")
        if len(self.shape) not in (2, 3):
            raise ValueError(f"a quantized weight is [N, K] or [E, N, K], not {self.shape}")

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays.values())

    def expert(self, e: int) -> QuantizedWeight:
        """Expert e of a stack [E, N, K] as a matrix [N, K] (views of its arrays)."""
        return QuantizedWeight(self.format, self.shape[1:], {k: a[e] for k, a in self.arrays.items()})

    def map_arrays(self, fn: Callable[[Array], Array]) -> QuantizedWeight:
        return replace(self, arrays={k: fn(a) for k, a in self.arrays.items()})


LinearWeight = Union[DenseWeight, QuantizedWeight]
LINEAR_TYPES = (DenseWeight, QuantizedWeight)


def dense_dtype(dtype: Any) -> DenseDtype:
    """The storage tag of an array dtype (float32, bfloat16 or float16); TypeError otherwise."""
    name = np.dtype(dtype).name
    tags: dict[str, DenseDtype] = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}
    if name not in tags:
        raise TypeError(f"no dense weight storage for dtype {name}")
    return tags[name]


def as_linear(w: LinearWeight | Array) -> LinearWeight:
    """`w` itself when it is a record; a bare matrix (kernel tests and probes hand ops those)
    as a DenseWeight tagged by its dtype."""
    if isinstance(w, LINEAR_TYPES):
        return w
    return DenseWeight(w, dense_dtype(w.dtype))


@dataclass
class AttentionWeights:
    qkv: LinearWeight            # [heads*D (+ heads*D gate) + 2*kv*D, H]  rows: q | gate | k | v
    o: LinearWeight              # [H, heads*D]
    rope_table: Array            # [3, rotary_dim/2] fp32 (models/rope.py); one array shared by the layers
    gated: bool = False          # Qwen3.5 output gate rows present (de-interleaved from q_proj)
    qkv_bias: Array | None = None  # [rows of qkv] (zeros where a part has no bias)
    q_norm: Array | None = None  # [D]
    k_norm: Array | None = None  # [D]


@dataclass
class GDNWeights:
    in_proj: LinearWeight  # [2*Hk*Dk + 2*Hv*Dv + 2*Hv, H]  rows: q | k | v (conv input) | z | a | b
    conv: Array         # [2*Hk*Dk + Hv*Dv, K]  depthwise conv over the q | k | v channels
    a_log: Array        # [Hv] fp32
    dt_bias: Array      # [Hv] fp32
    norm: Array         # [Dv]  plain (not zero-centred) gated-norm weight
    out: LinearWeight   # [H, Hv*Dv]


@dataclass
class MLPWeights:
    gate_up: LinearWeight     # [2I, H]  gate rows first, then up
    down: LinearWeight        # [H, I]


@dataclass
class MoEWeights:
    router: LinearWeight                # [E (+1), H]  (+1: the shared expert's gate row, last)
    gate_up: LinearWeight               # [E (+1), 2I, H]
    down: LinearWeight                  # [E (+1), H, I]
    top_k: int
    renormalize: bool
    shared: MLPWeights | None = None
    shared_gate: LinearWeight | None = None   # [1, H]
    # The shared expert folded in as expert E, always routed with weight sigmoid(gate row . x)
    # (when its width equals the experts'): one GEMV and two expert kernels per layer at decode
    # instead of six more kernels for a separate gated MLP. `shared`/`shared_gate` are None then.
    shared_slot: bool = False


@dataclass
class LayerWeights:
    input_norm: Array
    post_norm: Array
    mixer: AttentionWeights | GDNWeights
    ffn: MLPWeights | MoEWeights


@dataclass
class MTPWeights:
    """The checkpoint's multi-token-prediction head (Qwen3.5 / 3.6 `mtp.*`): the next token's
    embedding and the target's final-normed hidden, each normed, concatenated and projected by
    `fc` (kept as its two column halves: two GEMVs instead of a concatenation), then one
    full-attention decoder layer (its own KV cache) and a final norm; the target's embedding
    and LM head are shared (models/mtp.py runs it)."""

    fc_embedding: LinearWeight   # [H, H]  fc's columns 0..H-1 (fc [H, 2H] takes [e | h])
    fc_hidden: LinearWeight      # [H, H]  fc's columns H..2H-1
    norm_embedding: Array   # [H]  zero-centred norm weights, +1 applied
    norm_hidden: Array      # [H]
    layer: LayerWeights     # a full-attention layer; MLP (dense) or MoE (35B-A3B)
    norm: Array             # [H]  before the shared LM head


@dataclass
class ModelWeights:
    embed: LinearWeight     # [V, H]
    layers: list[LayerWeights]
    norm: Array             # [H]
    lm_head: LinearWeight   # [V, H] (the same record as embed when tied)
    mtp: MTPWeights | None = None   # the MTP draft head, when the checkpoint has one


def map_weights(obj: Any, on_linear: Callable[[LinearWeight], Any], on_array: Callable[[Array], Any],
                memo: dict[int, Any] | None = None) -> Any:
    """Rebuild a weight structure with `on_linear` applied to every linear record and
    `on_array` to every plain array (vectors), each object once: what was shared stays shared
    (a tied lm_head stays the embedding's record)."""
    memo = {} if memo is None else memo
    if obj is None or isinstance(obj, (int, float, bool, str)):
        return obj
    key = id(obj)
    if key in memo:
        return memo[key]
    if isinstance(obj, LINEAR_TYPES):
        out = on_linear(obj)
    elif is_dataclass(obj) and not isinstance(obj, type):
        out = type(obj)(**{f.name: map_weights(getattr(obj, f.name), on_linear, on_array, memo)
                           for f in fields(obj)})
    elif isinstance(obj, list):
        out = [map_weights(x, on_linear, on_array, memo) for x in obj]
    else:
        out = on_array(obj)
    memo[key] = out
    return out


def map_arrays(obj: Any, fn: Callable[[Array], Any]) -> Any:
    """Apply `fn` to every array in a weight structure, the arrays inside linear records
    included, keeping shared arrays and records shared."""
    seen: dict[int, Any] = {}

    def once(a: Array) -> Any:
        if id(a) not in seen:
            seen[id(a)] = fn(a)
        return seen[id(a)]

    return map_weights(obj, lambda w: w.map_arrays(once), once)


def unique_arrays(obj: Any) -> list[Any]:
    """Every distinct array in a weight structure (a tied lm_head counted once)."""
    found: list[Any] = []

    def collect(a: Array) -> Array:
        found.append(a)
        return a

    map_arrays(obj, collect)
    return found
