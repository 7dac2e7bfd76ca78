"""NumPy fp32 reference for every op the models call; also the CPU backend.

Each function here has a CUDA counterpart of the same name and signature in `ops/cuda.py`, and
a GPU test compares the two. Shapes use T = tokens in the batch, H = hidden size, heads x D for
attention, Hk/Hv x Dk/Dv for Gated DeltaNet. Functions return new arrays unless they are
documented as updating a cache or state in place. Linear weights are records
(models/weights.py): dense ones are read as fp32, quantized ones dequantized by the NumPy
reference (quant/dequant.py) first; a bare matrix counts as a dense weight of its dtype.
This module knows nothing about models, weights layout on disk, or requests.
"""
from __future__ import annotations

import contextlib
from functools import lru_cache

import numpy as np

from ..models.weights import LINEAR_TYPES, DenseWeight, LinearWeight, QuantizedWeight
from ..quant.dequant import dequantize, dequantize_rows
from .base import PAGE_SIZE

Array = np.ndarray


def matrix(weight: LinearWeight | Array) -> Array:
    """A linear weight's values as fp32 ([N, K], or [E, N, K] for an expert stack)."""
    if isinstance(weight, QuantizedWeight):
        return dequantize(weight)
    return np.asarray(weight.data if isinstance(weight, DenseWeight) else weight, dtype=np.float32)


# --- elementwise / norms -------------------------------------------------------------------

def embedding(table: LinearWeight | Array, ids: Array) -> Array:
    """table [V, H], ids [T] -> [T, H] float32 (a quantized table dequantizes those rows only)."""
    if isinstance(table, QuantizedWeight):
        return dequantize_rows(table, np.asarray(ids))
    return np.asarray((table.data if isinstance(table, DenseWeight) else table)[ids], dtype=np.float32)


def rms_norm(x: Array, weight: Array, eps: float) -> Array:
    """x [..., D] * rsqrt(mean(x^2) + eps) * weight [D]. Zero-centred norms get weight = 1 + w at load."""
    x = x.astype(np.float32, copy=False)
    inv = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return (x * inv) * weight


def normed(x: Array, weight: Array, eps: float) -> Array:
    """rms_norm(x, weight, eps) for the next op to consume (the CUDA backend defers one token's
    norm into that op's kernel; here it is computed at once)."""
    return rms_norm(x, weight, eps)


def add(x: Array, y: Array) -> Array:
    return x + y


def add_into(acc: Array, y: Array) -> Array:
    """acc += y in place (the residual stream); returns acc."""
    acc += y
    return acc


def add_rms_norm(x: Array, residual: Array, weight: Array, eps: float,
                 out: tuple[Array, Array] | None = None) -> tuple[Array, Array]:
    """Residual add fused with the next norm: (rms_norm(x + residual) * weight, x + residual),
    written into `out` = (normed, sum) when given."""
    total = x + residual
    normed = rms_norm(total, weight, eps)
    if out is None:
        return normed, total
    np.copyto(out[0], normed)
    np.copyto(out[1], total)
    return out


def scope() -> contextlib.AbstractContextManager[None]:
    """The CUDA backend's scratch scope (memory handed back on exit); NumPy frees by itself."""
    return contextlib.nullcontext()


def silu(x: Array) -> Array:
    return x / (1.0 + np.exp(-x))


def sigmoid(x: Array) -> Array:
    return 1.0 / (1.0 + np.exp(-x))


def swiglu(gate_up: Array) -> Array:
    """gate_up [T, 2I] (gate columns first, then up) -> silu(gate) * up, [T, I]."""
    inter = gate_up.shape[-1] // 2
    return silu(gate_up[..., :inter]) * gate_up[..., inter:]


def linear_swiglu(x: Array, gate_up: LinearWeight | Array) -> Array:
    """swiglu(linear(x, gate_up)): an MLP's first half (fused into one GEMV on the GPU)."""
    return swiglu(linear(x, gate_up))


def sigmoid_mul(x: Array, gate: Array) -> Array:
    """x * sigmoid(gate), same shapes (the attention output gate)."""
    return x * sigmoid(gate)


def gated_rms_norm(x: Array, z: Array, weight: Array, eps: float) -> Array:
    """GDN output norm: weight [D] * rmsnorm(x [..., D]) * silu(z [..., D])."""
    return rms_norm(x, weight, eps) * silu(z)


# --- linear layers -------------------------------------------------------------------------

def linear(x: Array, weight: LinearWeight | Array, bias: Array | None = None) -> Array:
    """x [T, K] @ weight [N, K]^T (+ bias [N]) -> [T, N]."""
    y = x @ matrix(weight).T
    if bias is not None:
        y = y + bias
    return y


def linear_add(x: Array, weight: LinearWeight | Array, residual: Array) -> Array:
    """residual += linear(x, weight), in place (a block's output projection into the residual
    stream); returns residual."""
    residual += linear(x, weight)
    return residual


# --- rotary embedding + attention ----------------------------------------------------------

@lru_cache(maxsize=8)
def _cos_sin(pos_bytes: bytes, table_bytes: bytes) -> tuple[Array, Array]:
    """cos/sin [T, 1, rotary_dim/2] for these positions and rotary table (models/rope.py: rows
    inv_freq hi, lo and the amplitude); cached because every attention layer of a decode step
    (and both q and k) rotates by the same positions."""
    positions = np.frombuffer(pos_bytes, dtype=np.int64)
    table = np.frombuffer(table_bytes, dtype=np.float32).reshape(3, -1)
    inv_freq = table[0].astype(np.float64) + table[1].astype(np.float64)
    ang = positions.astype(np.float64)[:, None] * inv_freq[None, :]          # [T, rotary_dim/2]
    amp = table[2].astype(np.float64)
    return ((np.cos(ang) * amp).astype(np.float32)[:, None, :],
            (np.sin(ang) * amp).astype(np.float32)[:, None, :])


def rope(x: Array, positions: Array, table: Array) -> Array:
    """Partial NeoX RoPE on the first rotary_dim = 2 * table.shape[1] dims of each head.
    x [T, heads, D], positions [T], table [3, rotary_dim/2] fp32 (models/rope.py)."""
    table = np.ascontiguousarray(table, dtype=np.float32)
    half = table.shape[1]
    cos, sin = _cos_sin(np.asarray(positions, dtype=np.int64).tobytes(), table.tobytes())
    out = x.astype(np.float32, copy=True)
    x1 = x[..., :half]
    x2 = x[..., half:2 * half]
    out[..., :half] = x1 * cos - x2 * sin
    out[..., half:2 * half] = x2 * cos + x1 * sin
    return out


KV_GROUP = 64


def kv_quantize_int8(x: Array) -> tuple[Array, Array]:
    """INT8-G64 with fp32 scales: x [..., D] -> (codes int8 [..., D], scales fp32 [..., D/64]);
    s = amax / 127 per 64 values, code = clamp(rint(x / s), -127, 127), s = 0 -> codes 0."""
    g = x.astype(np.float32).reshape(*x.shape[:-1], x.shape[-1] // KV_GROUP, KV_GROUP)
    scale = (np.abs(g).max(axis=-1) / np.float32(127.0)).astype(np.float32)
    inv = np.divide(np.float32(1.0), scale, out=np.zeros_like(scale), where=scale > 0)
    codes = np.clip(np.rint(g * inv[..., None]), -127, 127).astype(np.int8)
    return codes.reshape(x.shape), scale


def kv_dequantize_int8(codes: Array, scales: Array) -> Array:
    g = codes.astype(np.float32).reshape(*codes.shape[:-1], scales.shape[-1], KV_GROUP)
    return (g * scales[..., None]).reshape(codes.shape)


def _kv_rows(cache: Array, scales: Array | None, rows: int) -> Array:
    """The first `rows` cache rows as float32 (dequantized for int8 caches)."""
    if scales is not None:
        return kv_dequantize_int8(cache[:rows], scales[:rows])
    return cache[:rows].astype(np.float32, copy=False)


def cache_rows(positions: Array, page_table: Array | None) -> Array:
    """The cache row [T] of each token's K / V: its position without a page table; with
    page_table [B, P] (T % B == 0), token i of sequence b = i // (T / B) at position p is row
    page_table[b, p // PAGE_SIZE] * PAGE_SIZE + p % PAGE_SIZE."""
    pos = np.asarray(positions, dtype=np.int64)
    if page_table is None:
        return pos
    table = np.asarray(page_table, dtype=np.int64)
    t, n_seq = pos.shape[0], table.shape[0]
    if t % n_seq:
        raise ValueError(f"{t} tokens do not split into {n_seq} sequences of equal length")
    seq = np.arange(t) // max(t // n_seq, 1)
    return table[seq, pos // PAGE_SIZE] * PAGE_SIZE + pos % PAGE_SIZE


def kv_store(k_cache: Array, v_cache: Array, k: Array, v: Array, positions: Array,
             k_scale: Array | None = None, v_scale: Array | None = None) -> None:
    """Write k, v [T, Hkv, D] into caches [S, Hkv, D] at rows `positions` [T] (in place; the
    rows, for paged caches cache_rows(positions, page_table)). With scales [S, Hkv, D/64] the
    caches are int8 codes (kv_quantize_int8)."""
    if k_scale is not None and v_scale is not None:
        k_cache[positions], k_scale[positions] = kv_quantize_int8(k)
        v_cache[positions], v_scale[positions] = kv_quantize_int8(v)
        return
    k_cache[positions] = k
    v_cache[positions] = v


def qk_norm_rope_store(q: Array, k: Array, v: Array, q_norm: Array | None, k_norm: Array | None,
                       positions: Array, rope_table: Array, eps: float, k_cache: Array,
                       v_cache: Array, k_scale: Array | None = None, v_scale: Array | None = None,
                       page_table: Array | None = None) -> Array:
    """An attention layer's prologue: q, k [T, H, D] head-normed (when the norms are given) and
    rotated (`rope` with rope_table); k and v [T, Hkv, D] stored into the caches at the rows of
    `positions` (cache_rows: through page_table [B, P] when given). Returns the rotated q."""
    if q_norm is not None and k_norm is not None:          # a model has both head norms or neither
        q = rms_norm(q, q_norm, eps)
        k = rms_norm(k, k_norm, eps)
    kv_store(k_cache, v_cache, rope(k, positions, rope_table), v, cache_rows(positions, page_table),
             k_scale, v_scale)
    return rope(q, positions, rope_table)


def attention(q: Array, k_cache: Array, v_cache: Array, positions: Array, scale: float,
              k_scale: Array | None = None, v_scale: Array | None = None,
              page_table: Array | None = None) -> Array:
    """Causal GQA attention. q [T, Hq, D] at absolute `positions` [T]; caches [S, Hkv, D] hold
    every key up to max(positions) (int8 codes when scales are given). Query i sees keys
    0..positions[i]. Returns [T, Hq, D]. With page_table [B, P] (T % B == 0) token i belongs to
    sequence b = i // (T / B) and its keys are that sequence's rows (cache_rows): the paged
    result is the contiguous one of each sequence's keys gathered in order."""
    if page_table is not None:
        return _attention_paged(q, k_cache, v_cache, positions, scale, k_scale, v_scale, page_table)
    t, hq, d = q.shape
    hkv = k_cache.shape[1]
    group = hq // hkv
    s = int(positions.max()) + 1
    k = _kv_rows(k_cache, k_scale, s).transpose(1, 0, 2)                    # [Hkv, S, D]
    v = _kv_rows(v_cache, v_scale, s).transpose(1, 0, 2)
    qg = q.reshape(t, hkv, group, d).transpose(1, 2, 0, 3)                  # [Hkv, G, T, D]
    scores = (qg @ k[:, None].transpose(0, 1, 3, 2)) * scale                # [Hkv, G, T, S]
    mask = np.arange(s)[None, :] > positions[:, None]                       # [T, S]
    scores = np.where(mask, -np.inf, scores)
    scores = scores - scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    out = p @ v[:, None]                                                    # [Hkv, G, T, D]
    return out.transpose(2, 0, 1, 3).reshape(t, hq, d).astype(np.float32, copy=False)


def _attention_paged(q: Array, k_cache: Array, v_cache: Array, positions: Array, scale: float,
                     k_scale: Array | None, v_scale: Array | None, page_table: Array) -> Array:
    """`attention` through a page table: per sequence, its keys 0..max position gathered from
    their pages into contiguous rows, then the contiguous attention of its queries."""
    t, hq, d = q.shape
    table = np.asarray(page_table, dtype=np.int64)
    n_seq = table.shape[0]
    if t % n_seq:
        raise ValueError(f"attention: {t} tokens do not split into {n_seq} sequences of equal length")
    out = np.empty((t, hq, d), dtype=np.float32)
    n = t // n_seq
    pos = np.asarray(positions)
    for b in range(n_seq if n else 0):
        toks = slice(b * n, (b + 1) * n)
        keys = np.arange(int(pos[toks].max()) + 1)
        rows = table[b, keys // PAGE_SIZE] * PAGE_SIZE + keys % PAGE_SIZE
        out[toks] = attention(q[toks], k_cache[rows], v_cache[rows], pos[toks], scale,
                              None if k_scale is None else k_scale[rows],
                              None if v_scale is None else v_scale[rows])
    return out


def attention_gated(q: Array, k_cache: Array, v_cache: Array, positions: Array, scale: float, gate: Array,
                    k_scale: Array | None = None, v_scale: Array | None = None,
                    page_table: Array | None = None) -> Array:
    """The gated attention's output: attention(..) [T, Hq, D] * sigmoid(gate [T, Hq * D]) as
    [T, Hq * D] (on the GPU the gate is applied as the decode kernels write the output)."""
    t, hq, d = q.shape
    out = attention(q, k_cache, v_cache, positions, scale, k_scale, v_scale, page_table)
    return sigmoid_mul(out.reshape(t, hq * d), gate)


# --- Gated DeltaNet ------------------------------------------------------------------------

def split(x: Array, sizes: tuple[int, ...]) -> tuple[Array, ...]:
    """Split x [T, sum(sizes)] along its last axis into contiguous [T, size_i] arrays (fused
    projections -> their parts)."""
    assert x.shape[-1] == sum(sizes), (x.shape, sizes)
    bounds = np.cumsum((0,) + tuple(sizes))
    return tuple(np.ascontiguousarray(x[..., a:b]) for a, b in zip(bounds[:-1], bounds[1:]))


def linear_split(x: Array, weight: LinearWeight | Array, bias: Array | None,
                 sizes: tuple[int, ...]) -> tuple[Array, ...]:
    """A fused projection straight to its parts: split(linear(x, weight, bias), sizes)."""
    return split(linear(x, weight, bias), sizes)


def causal_conv1d(x: Array, conv_state: Array, weight: Array) -> Array:
    """Depthwise causal conv + SiLU. x [T, C]; conv_state [K-1, C] holds the previous K-1 inputs
    (oldest first) and is updated in place; weight [C, K] (tap K-1 multiplies the current input)."""
    kw = weight.shape[1]
    full = np.concatenate([conv_state, x], axis=0)                          # [K-1+T, C]
    t = x.shape[0]
    y = np.zeros_like(x, dtype=np.float32)
    for j in range(kw):
        y += full[j : j + t] * weight[:, j]
    conv_state[...] = full[t:]
    return silu(y)


def causal_conv1d_split(x: Array, conv_state: Array, weight: Array, sizes: tuple[int, ...]) -> tuple[Array, ...]:
    """split(causal_conv1d(x, conv_state, weight), sizes): the GDN's q | k | v after its conv
    (one kernel writing each part to its own buffer on the GPU)."""
    return split(causal_conv1d(x, conv_state, weight), sizes)


def gdn_gates(a: Array, b: Array, a_log: Array, dt_bias: Array) -> tuple[Array, Array]:
    """a, b [T, Hv] -> (g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b)), both [T, Hv]."""
    x = a + dt_bias
    softplus = np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))
    g = -np.exp(a_log) * softplus
    return g.astype(np.float32), sigmoid(b).astype(np.float32)


def _l2norm(x: Array) -> Array:
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + 1e-6)


def _prepare_qk(q: Array, k: Array, hv: int) -> tuple[Array, Array]:
    """L2-normalise q, k [T, Hk, Dk], scale q by 1/sqrt(Dk), repeat heads to Hv."""
    rep = hv // q.shape[1]
    q = _l2norm(q) / np.sqrt(q.shape[-1])
    k = _l2norm(k)
    if rep > 1:
        q = np.repeat(q, rep, axis=1)
        k = np.repeat(k, rep, axis=1)
    return q.astype(np.float32), k.astype(np.float32)


def gated_delta_rule(q: Array, k: Array, v: Array, g: Array, beta: Array, state: Array) -> Array:
    """Recurrent gated delta rule, token by token. q, k [T, Hk, Dk] (raw: l2-norm and the
    1/sqrt(Dk) scale happen here); v [T, Hv, Dv]; g, beta [T, Hv]; state [Hv, Dv, Dk] fp32,
    updated in place. Returns o [T, Hv, Dv]."""
    t, hv, dv = v.shape
    qh, kh = _prepare_qk(q, k, hv)
    out = np.empty((t, hv, dv), dtype=np.float32)
    s = state
    for i in range(t):
        s *= np.exp(g[i])[:, None, None]
        kv_mem = np.einsum("hvk,hk->hv", s, kh[i])
        delta = (v[i] - kv_mem) * beta[i][:, None]
        s += delta[:, :, None] * kh[i][:, None, :]
        out[i] = np.einsum("hvk,hk->hv", s, qh[i])
    return out


def gated_delta_rule_raw_gates(q: Array, k: Array, v: Array, a: Array, b: Array, a_log: Array,
                               dt_bias: Array, state: Array) -> Array:
    """gated_delta_rule with the gates from the raw projections a, b [T, Hv] (gdn_gates fused
    in: the CUDA backend computes them inside the recurrent kernel, for decode steps)."""
    g, beta = gdn_gates(a, b, a_log, dt_bias)
    return gated_delta_rule(q, k, v, g, beta, state)


def gdn_decode(mixed: Array, z: Array, a: Array, b: Array, conv_state: Array, conv_w: Array,
               a_log: Array, dt_bias: Array, state: Array, norm_w: Array, eps: float,
               n_k_heads: int, slots: Array | None = None, snapshots: Array | None = None) -> Array:
    """The GDN mixer between its projections, recurrent form (decode-sized T): causal conv +
    SiLU over mixed [T, q | k | v], the gated delta rule with its gates from the raw a, b [T, Hv],
    the gated RMS norm by z [T, Hv * Dv] -> [T, Hv * Dv]. conv_state and state [Hv, Dv, Dk] are
    updated in place (one kernel on the GPU: kernels/gdn/gdn_decode.py). With slots [B]: the
    pools conv_state [S, K-1, C] and state [S, Hv, Dv, Dk], sequence b's T / B tokens in order
    on slot slots[b] (each sequence exactly as alone on its slot's views). snapshots [T] (with
    slots): where snapshots[t] >= 0 the conv and recurrent state after token t are also copied
    to that slot (a speculative verify's per-token states; the tokens then run one at a time)."""
    if snapshots is not None:
        if slots is None:
            raise ValueError("gdn_decode: snapshots need slot pools (slots)")
        ids = np.asarray(slots, dtype=np.int64)
        n = mixed.shape[0] // ids.shape[0]
        out = np.empty((mixed.shape[0], z.shape[-1]), dtype=np.float32)
        for t, into in enumerate(np.asarray(snapshots).tolist() + [-1] * (mixed.shape[0] - len(snapshots))):
            slot = int(ids[t // n])
            r = slice(t, t + 1)
            out[r] = gdn_decode(mixed[r], z[r], a[r], b[r], conv_state[slot], conv_w, a_log, dt_bias, state[slot],
                                norm_w, eps, n_k_heads)
            if into >= 0:
                conv_state[into] = conv_state[slot]
                state[into] = state[slot]
        return out
    if slots is not None:
        ids = np.asarray(slots, dtype=np.int64)
        t, n_seq = mixed.shape[0], ids.shape[0]
        if t % n_seq or len(set(ids.tolist())) != n_seq:
            raise ValueError(f"gdn_decode: {t} tokens over slots {ids.tolist()} (equal shares, distinct slots)")
        n = t // n_seq
        out = np.empty((t, z.shape[-1]), dtype=np.float32)
        for i, slot in enumerate(ids.tolist()):
            r = slice(i * n, (i + 1) * n)
            out[r] = gdn_decode(mixed[r], z[r], a[r], b[r], conv_state[slot], conv_w, a_log, dt_bias,
                                state[slot], norm_w, eps, n_k_heads)
        return out
    t = mixed.shape[0]
    hv, dv, dk = state.shape
    qk = n_k_heads * dk
    q, k, v = causal_conv1d_split(mixed, conv_state, conv_w, (qk, qk, hv * dv))
    o = gated_delta_rule_raw_gates(q.reshape(t, n_k_heads, dk), k.reshape(t, n_k_heads, dk),
                                   v.reshape(t, hv, dv), a, b, a_log, dt_bias, state)
    return gated_rms_norm(o.reshape(t * hv, dv), z.reshape(t * hv, dv), norm_w, eps).reshape(t, hv * dv)


def gdn_snapshots_ok(hv: int, n_k_heads: int, dk: int, dv: int, conv_k: int) -> bool:
    """gdn_decode takes snapshots= for these GDN shapes (here: every shape)."""
    return True


def gated_delta_rule_chunked(
    q: Array, k: Array, v: Array, g: Array, beta: Array, state: Array, chunk: int = 64
) -> Array:
    """Chunked (WY/UT) form of `gated_delta_rule`, same contract; exact up to fp32 rounding."""
    t, hv, dv = v.shape
    qh, kh = _prepare_qk(q, k, hv)
    out = np.empty((t, hv, dv), dtype=np.float32)
    s_t = state.transpose(0, 2, 1).copy()                                   # [Hv, Dk, Dv]
    for c0 in range(0, t, chunk):
        c1 = min(c0 + chunk, t)
        n = c1 - c0
        Q = qh[c0:c1].transpose(1, 0, 2)                                    # [Hv, n, Dk]
        K = kh[c0:c1].transpose(1, 0, 2)
        V = v[c0:c1].transpose(1, 0, 2).astype(np.float32)                  # [Hv, n, Dv]
        B = beta[c0:c1].T[:, :, None]                                       # [Hv, n, 1]
        gam = np.cumsum(g[c0:c1].T, axis=1)                                 # [Hv, n]
        diff = gam[:, :, None] - gam[:, None, :]
        lower = np.tril(np.ones((n, n), dtype=bool))
        decay = np.exp(np.where(lower, diff, -np.inf))                      # [Hv, n, n], incl. diag
        strict = decay * (~np.eye(n, dtype=bool))
        A = ((B * K) @ K.transpose(0, 2, 1)) * strict                       # strict lower
        eye = np.eye(n, dtype=np.float32)
        T_inv = np.linalg.solve(eye + A, np.broadcast_to(eye, A.shape))     # (I + A)^-1
        U = T_inv @ (B * V)
        W = T_inv @ (B * np.exp(gam)[:, :, None] * K)
        Vp = U - W @ s_t                                                    # [Hv, n, Dv]
        O = (Q * np.exp(gam)[:, :, None]) @ s_t + ((Q @ K.transpose(0, 2, 1)) * decay) @ Vp
        out[c0:c1] = O.transpose(1, 0, 2)
        g_end = gam[:, -1]
        kdec = K * np.exp(g_end[:, None] - gam)[:, :, None]
        s_t = np.exp(g_end)[:, None, None] * s_t + kdec.transpose(0, 2, 1) @ Vp
    state[...] = s_t.transpose(0, 2, 1)
    return out


# --- mixture of experts --------------------------------------------------------------------

def moe_router(x: Array, weight: LinearWeight | Array, top_k: int, renormalize: bool = True,
               shared_slot: bool = False) -> tuple[Array, Array]:
    """The MoE router: moe_route(linear(x, weight), ...) (the CUDA backend can fuse the two for
    one token)."""
    return moe_route(linear(x, weight), top_k, renormalize, shared_slot)


def moe(x: Array, router: LinearWeight | Array, top_k: int, renormalize: bool, shared_slot: bool,
        gate_up: LinearWeight | Array, down: LinearWeight | Array, residual: Array | None = None) -> Array:
    """moe_experts(x, *moe_router(x, router, ...), gate_up, down, residual): routed experts,
    the shared expert included when it is a slot (the CUDA backend fuses the norm, the router
    and the top-k for one token)."""
    ids, w = moe_router(x, router, top_k, renormalize, shared_slot)
    return moe_experts(x, ids, w, gate_up, down, residual)


def moe_route(logits: Array, top_k: int, renormalize: bool = True,
              shared_slot: bool = False) -> tuple[Array, Array]:
    """Softmax router. logits [T, E] -> (ids [T, k] int32, weights [T, k] fp32); ties -> lower id.

    shared_slot: logits are [T, E + 1], the last column the shared expert's gate; the result
    gets a slot k with id E and weight sigmoid(gate) (the shared expert folded in as expert E)."""
    if shared_slot:
        ids, w = moe_route(logits[:, :-1], top_k, renormalize)
        n_exp = logits.shape[1] - 1
        ids = np.concatenate([ids, np.full((ids.shape[0], 1), n_exp, np.int32)], axis=1)
        w = np.concatenate([w, sigmoid(logits[:, -1:]).astype(np.float32)], axis=1)
        return ids, w
    z = logits - logits.max(axis=-1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=-1, keepdims=True)
    ids = np.argsort(-p, axis=-1, kind="stable")[:, :top_k].astype(np.int32)
    w = np.take_along_axis(p, ids, axis=-1)
    if renormalize:
        w = w / w.sum(axis=-1, keepdims=True)
    return ids, w.astype(np.float32)


def _expert(stack: LinearWeight | Array, e: int) -> LinearWeight | Array:
    """Expert e [N, K] of a stack [E, N, K]."""
    return stack.expert(e) if isinstance(stack, LINEAR_TYPES) else stack[e]


def moe_experts(x: Array, ids: Array, weights: Array, gate_up: LinearWeight | Array,
                down: LinearWeight | Array, residual: Array | None = None) -> Array:
    """Routed SwiGLU experts. x [T, H]; ids, weights [T, k]; gate_up [E, 2I, H]; down [E, H, I].
    Returns their weighted sum [T, H], or adds it into `residual` in place and returns that."""
    out = np.zeros_like(x, dtype=np.float32)
    for e in np.unique(ids):
        rows, slots = np.nonzero(ids == e)
        h = swiglu(linear(x[rows], _expert(gate_up, int(e))))
        out[rows] += linear(h, _expert(down, int(e))) * weights[rows, slots][:, None]
    return out if residual is None else add_into(residual, out)
