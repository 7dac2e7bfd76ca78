"""Per-sequence caches: KV for attention layers, conv + recurrent state for GDN layers.

Buffers are allocated once, at the sequence's maximum context, by a backend `zeros(shape)`
function (NumPy on the CPU, the device arena on the GPU). Knows nothing about weights.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..config import ModelConfig

Zeros = Callable[[tuple[int, ...]], Any]


@dataclass
class KVCache:
    k: Any      # [max_context, kv_heads, head_dim]
    v: Any      # [max_context, kv_heads, head_dim]


@dataclass
class GDNState:
    conv_q: Any      # [K-1, Hk*Dk]  the last K-1 pre-conv inputs, oldest first
    conv_k: Any      # [K-1, Hk*Dk]
    conv_v: Any      # [K-1, Hv*Dv]
    recurrent: Any   # [Hv, Dv, Dk] fp32


@dataclass
class SequenceState:
    layers: list[KVCache | GDNState] = field(default_factory=list)
    max_context: int = 0

    def nbytes(self) -> int:
        total = 0
        for layer in self.layers:
            for buf in vars(layer).values():
                total += int(getattr(buf, "nbytes", 0))
        return total

    def kv_bytes(self) -> int:
        return sum(int(l.k.nbytes + l.v.nbytes) for l in self.layers if isinstance(l, KVCache))


def new_state(cfg: ModelConfig, max_context: int, zeros: Zeros) -> SequenceState:
    layers: list[KVCache | GDNState] = []
    for i in range(cfg.num_layers):
        if cfg.is_full_attention(i):
            shape = (max_context, cfg.num_kv_heads, cfg.head_dim)
            layers.append(KVCache(k=zeros(shape), v=zeros(shape)))
        else:
            kw = cfg.linear_conv_kernel_dim - 1
            qk = cfg.linear_num_key_heads * cfg.linear_key_head_dim
            vd = cfg.linear_num_value_heads * cfg.linear_value_head_dim
            layers.append(GDNState(
                conv_q=zeros((kw, qk)), conv_k=zeros((kw, qk)), conv_v=zeros((kw, vd)),
                recurrent=zeros((cfg.linear_num_value_heads, cfg.linear_value_head_dim,
                                 cfg.linear_key_head_dim)),
            ))
    return SequenceState(layers=layers, max_context=max_context)
