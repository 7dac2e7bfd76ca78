"""Caches the forward reads and writes: KV for attention layers, GDN conv + recurrent state.

Buffers are allocated once by a backend `zeros(shape)` function (NumPy on the CPU, the device
arena on the GPU). KV: either one contiguous cache at the engine's maximum context (a token's
K / V row is its position; one sequence, `page_table=None` in the ops), or a pool of `num_pages`
pages of PAGE_SIZE rows shared by many sequences (a token at position p of sequence b lives at
row page_table[b, p // PAGE_SIZE] * PAGE_SIZE + p % PAGE_SIZE; engine/kv_pages.py hands the
pages out). GDN state in slots (`GDNSlots`: one conv + recurrent state per slot; a
`ForwardBatch` says which slot each sequence uses). Knows nothing about weights or requests.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal

import numpy as np

from ..config import ModelConfig
from ..errors import InvalidRequestError
from ..ops.base import PAGE_SIZE  # tokens per KV page (paged caches)

Zeros = Callable[..., Any]             # zeros(shape, dtype=np.float32)
KVDtype = Literal["fp32", "bf16", "int8"]
KV_GROUP = 64                          # int8 cache: one fp32 scale per 64 values


@dataclass
class KVCache:
    k: Any                     # [rows, kv_heads, head_dim] fp32 / bf16 / int8 codes
    v: Any                     # [rows, kv_heads, head_dim]; rows = max_context, or num_pages * PAGE_SIZE
    k_scale: Any = None        # [rows, kv_heads, head_dim / 64] fp32 (int8 caches only)
    v_scale: Any = None


@dataclass
class GDNState:
    """One sequence's state of one GDN layer (views into a `GDNSlots` slot)."""

    conv: Any        # [K-1, 2*Hk*Dk + Hv*Dv]  the last K-1 pre-conv q|k|v inputs, oldest first
    recurrent: Any   # [Hv, Dv, Dk] fp32


@dataclass
class GDNSlots:
    """One GDN layer's state for every slot; slot i is `slot(i)`."""

    conv: Any        # [slots, K-1, 2*Hk*Dk + Hv*Dv]
    recurrent: Any   # [slots, Hv, Dv, Dk] fp32

    @property
    def num_slots(self) -> int:
        return int(self.conv.shape[0])

    def slot(self, i: int) -> GDNState:
        return GDNState(conv=self.conv[i], recurrent=self.recurrent[i])


@dataclass
class SequenceState:
    layers: list[KVCache | GDNSlots] = field(default_factory=list)
    max_context: int = 0
    num_pages: int | None = None          # paged KV: pages in the pool; None: one contiguous cache

    def nbytes(self) -> int:
        total = 0
        for layer in self.layers:
            for buf in vars(layer).values():
                total += int(getattr(buf, "nbytes", 0))
        return total

    def kv_bytes(self) -> int:
        total = 0
        for layer in self.layers:
            if isinstance(layer, KVCache):
                total += sum(int(getattr(b, "nbytes", 0)) for b in vars(layer).values())
        return total

    def gdn_slot_bytes(self) -> int:
        """Bytes of one sequence's GDN state (one slot of every GDN layer)."""
        return sum((int(layer.conv.nbytes) + int(layer.recurrent.nbytes)) // layer.num_slots
                   for layer in self.gdn_layers())

    def gdn_layers(self) -> list[GDNSlots]:
        return [layer for layer in self.layers if isinstance(layer, GDNSlots)]


def kv_bytes_per_token(cfg: ModelConfig, kv_dtype: KVDtype) -> int:
    """Bytes one token's K and V take over every attention layer (int8: with its scales)."""
    values = cfg.num_kv_heads * cfg.head_dim
    item = {"fp32": 4, "bf16": 2, "int8": 1}[kv_dtype]
    per_layer = 2 * values * item + (2 * (values // KV_GROUP) * 4 if kv_dtype == "int8" else 0)
    return per_layer * sum(1 for i in range(cfg.num_layers) if cfg.is_full_attention(i))


def gdn_bytes_per_slot(cfg: ModelConfig) -> int:
    """Bytes of one GDN state slot over every GDN layer (fp32 conv + recurrent state)."""
    per_layer = ((cfg.linear_conv_kernel_dim - 1) * cfg.conv_dim + cfg.linear_num_value_heads
                 * cfg.linear_value_head_dim * cfg.linear_key_head_dim)
    return 4 * per_layer * sum(1 for i in range(cfg.num_layers) if not cfg.is_full_attention(i))


def _kv_cache(cfg: ModelConfig, rows: int, zeros: Zeros, kv_dtype: KVDtype) -> KVCache:
    shape = (rows, cfg.num_kv_heads, cfg.head_dim)
    if kv_dtype == "fp32":
        return KVCache(k=zeros(shape), v=zeros(shape))
    if kv_dtype == "bf16":
        from ml_dtypes import bfloat16

        return KVCache(k=zeros(shape, bfloat16), v=zeros(shape, bfloat16))
    if kv_dtype == "int8":
        if cfg.head_dim % KV_GROUP:
            raise InvalidRequestError(f"int8 KV cache needs head_dim % {KV_GROUP} == 0 (got {cfg.head_dim})")
        scales = (rows, cfg.num_kv_heads, cfg.head_dim // KV_GROUP)
        return KVCache(k=zeros(shape, np.int8), v=zeros(shape, np.int8),
                       k_scale=zeros(scales), v_scale=zeros(scales))
    raise InvalidRequestError(f"unknown KV cache type {kv_dtype!r} (fp32, bf16 or int8)")


def new_state(cfg: ModelConfig, max_context: int, zeros: Zeros, kv_dtype: KVDtype = "fp32",
              gdn_slots: int = 1, num_pages: int | None = None) -> SequenceState:
    """Every layer's cache: KV rows for `max_context` tokens (or a pool of `num_pages` pages of
    PAGE_SIZE rows when given), `gdn_slots` GDN state slots."""
    if num_pages is not None and num_pages < 1:
        raise InvalidRequestError(f"a paged KV cache needs at least one page, got {num_pages}")
    rows = max_context if num_pages is None else num_pages * PAGE_SIZE
    layers: list[KVCache | GDNSlots] = []
    for i in range(cfg.num_layers):
        if cfg.is_full_attention(i):
            layers.append(_kv_cache(cfg, rows, zeros, kv_dtype))
        else:
            kw = cfg.linear_conv_kernel_dim - 1
            layers.append(GDNSlots(
                conv=zeros((gdn_slots, kw, cfg.conv_dim)),
                recurrent=zeros((gdn_slots, cfg.linear_num_value_heads,
                                 cfg.linear_value_head_dim, cfg.linear_key_head_dim)),
            ))
    return SequenceState(layers=layers, max_context=max_context, num_pages=num_pages)
