"""Forward code for the decoder blocks, written once against the `ops` interface.

`ops` is `ninfer_nb.ops.cpu` or a CUDA ops object with the same functions. Only `.shape`,
`.reshape` and first-axis slicing are used on arrays here, so both backends run this code.
Knows nothing about loading, devices or sampling.
"""
from __future__ import annotations

from typing import Any

from ..config import ModelConfig
from .state import GDNSlots, GDNState, KVCache
from .weights import AttentionWeights, GDNWeights, MLPWeights, MoEWeights

Ops = Any
Array = Any


def attention_block(ops: Ops, cfg: ModelConfig, w: AttentionWeights, x: Array,
                    positions: Array, cache: KVCache, residual: Array, page_table: Array | None = None) -> Array:
    """x [T, H] (normed) -> residual += attention(x), in place. Writes this chunk's K/V into
    the cache (through page_table [B, P] when the cache is a page pool: B sequences of T / B
    tokens)."""
    t = x.shape[0]
    d = cfg.head_dim
    qd, kvd = cfg.num_heads * d, cfg.num_kv_heads * d
    if w.gated:                                              # the fused [T, q | gate | k | v]
        q, gate, k, v = ops.linear_split(x, w.qkv, w.qkv_bias, (qd, qd, kvd, kvd))
    else:
        (q, k, v), gate = ops.linear_split(x, w.qkv, w.qkv_bias, (qd, kvd, kvd)), None
    q = q.reshape(t, cfg.num_heads, d)
    k = k.reshape(t, cfg.num_kv_heads, d)
    v = v.reshape(t, cfg.num_kv_heads, d)
    # q / k head norms, RoPE, and K / V into the cache (one kernel on the GPU)
    # (page_table goes to the ops only when given: the single-sequence calls stay as they were)
    paged = {} if page_table is None else {"page_table": page_table}
    q = ops.qk_norm_rope_store(q, k, v, w.q_norm, w.k_norm, positions, w.rope_table, cfg.rms_norm_eps,
                               cache.k, cache.v, cache.k_scale, cache.v_scale, **paged)
    if gate is not None:                                   # the output gate applied as attention writes
        out = ops.attention_gated(q, cache.k, cache.v, positions, d ** -0.5, gate, cache.k_scale, cache.v_scale,
                                  **paged)
    elif cache.k_scale is not None or page_table is not None:          # int8 KV cache, or paged
        out = ops.attention(q, cache.k, cache.v, positions, d ** -0.5, cache.k_scale, cache.v_scale, **paged)
    else:
        out = ops.attention(q, cache.k, cache.v, positions, d ** -0.5)
    return ops.linear_add(out.reshape(t, qd), w.o, residual)


def gdn_block(ops: Ops, cfg: ModelConfig, w: GDNWeights, x: Array, state: GDNState | GDNSlots,
              chunked: bool, residual: Array, slots: Array | None = None, snapshots: Array | None = None) -> Array:
    """Gated DeltaNet mixer. x [T, H] (normed) -> residual += gdn(x), in place; updates the conv
    and recurrent state: one sequence's (`state` a slot's views), or with slots [B] (a decode
    round) the whole pool's (`state` the layer's GDNSlots), sequence b on slot slots[b];
    snapshots [T] (with slots): the state after token t also into slot snapshots[t] (>= 0)."""
    t = x.shape[0]
    hk, dk = cfg.linear_num_key_heads, cfg.linear_key_head_dim
    hv, dv = cfg.linear_num_value_heads, cfg.linear_value_head_dim
    mixed, z, a, b = ops.linear_split(x, w.in_proj, None,   # the fused [T, q | k | v | z | a | b]
                                      (cfg.conv_dim, hv * dv, hv, hv))
    if not chunked:                          # decode: conv, rule and norm in one op (one kernel)
        pooled = {} if slots is None else {"slots": slots}
        if snapshots is not None:
            pooled["snapshots"] = snapshots
        o = ops.gdn_decode(mixed, z, a, b, state.conv, w.conv, w.a_log, w.dt_bias, state.recurrent,
                           w.norm, cfg.rms_norm_eps, hk, **pooled)              # [T, Hv * Dv]
        return ops.linear_add(o, w.out, residual)
    if slots is not None:
        raise ValueError("gdn_block: the chunked form runs one sequence (a prefill chunk), not slots")
    q, k, v = ops.causal_conv1d_split(mixed, state.conv, w.conv,   # conv over [T, q | k | v]
                                      (hk * dk, hk * dk, hv * dv))
    q, k, v = q.reshape(t, hk, dk), k.reshape(t, hk, dk), v.reshape(t, hv, dv)
    g, beta = ops.gdn_gates(a, b, w.a_log, w.dt_bias)
    o = ops.gated_delta_rule_chunked(q, k, v, g, beta, state.recurrent)     # [T, Hv, Dv]
    o = ops.gated_rms_norm(o.reshape(t * hv, dv), z.reshape(t * hv, dv), w.norm, cfg.rms_norm_eps)
    return ops.linear_add(o.reshape(t, hv * dv), w.out, residual)


def mlp_block(ops: Ops, w: MLPWeights, x: Array, residual: Array | None = None) -> Array:
    """SwiGLU MLP of x [T, H] (normed) -> [T, H], or residual += it in place when given."""
    h = ops.linear_swiglu(x, w.gate_up)
    return ops.linear(h, w.down) if residual is None else ops.linear_add(h, w.down, residual)


def moe_block(ops: Ops, w: MoEWeights, x: Array, residual: Array) -> Array:
    """Routed experts (+ a shared expert) of x [T, H] (normed) -> residual += them, in place."""
    if w.shared is None:                                             # no shared expert, or in a slot
        return ops.moe(x, w.router, w.top_k, w.renormalize, w.shared_slot, w.gate_up, w.down, residual)
    y = ops.moe(x, w.router, w.top_k, w.renormalize, w.shared_slot, w.gate_up, w.down)
    shared = mlp_block(ops, w.shared, x)
    if w.shared_gate is not None:
        shared = ops.sigmoid_mul(shared, ops.linear(x, w.shared_gate))  # gate [T, 1] broadcasts
    return ops.add_into(residual, ops.add(y, shared))
