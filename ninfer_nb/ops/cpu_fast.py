"""The CPU backend's fast paths for decode rounds of a few rows (ops.cpu stays the reference).

Linear: x [T, K] @ w [N, K]^T with w
row-major fp32, T <= FAST_MAX_T, in one Numba loop that reads each weight row once for all T
rows (OpenBLAS's GEMM packs the whole weight on every call, so a round of 8 rows cost ~3.5x one
row; this kernel ~2.3x). Single-threaded: on a loaded host a second thread stalls the first.

`linear` falls back to `ops.cpu.linear` (the reference) for other dtypes / layouts,
and whenever `ops.cpu.linear` was replaced (tests inject faults or rounding through it); more
rows (prefill chunks) go to BLAS as w @ x.T, the weight its untransposed left operand.

Attention: a paged decode round (one query per sequence, fp32 caches) in one Numba loop over
rows and heads, instead of ops.cpu's per-sequence gather + NumPy attention.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from ..models.weights import DenseWeight
from . import cpu
from .base import PAGE_SIZE

FAST_MAX_T = 16                   # more rows (prefill chunks): BLAS's GEMM is compute-efficient
_REFERENCE = cpu.linear


@njit(fastmath=True, cache=True)
def _linear_rows(x: np.ndarray, w: np.ndarray, y: np.ndarray) -> None:   # pragma: no cover - numba
    """y[t, n] = sum_k x[t, k] * w[n, k]: 4 weight rows x 4 token rows per tile (16 sums, the
    k loop vectorised); leftover token rows one weight row at a time."""
    t_count, k_count = x.shape
    n_count = w.shape[0]
    n4, t4 = n_count - n_count % 4, t_count - t_count % 4
    for n in range(0, n4, 4):
        for t in range(0, t4, 4):
            a00 = a01 = a02 = a03 = np.float32(0.0)
            a10 = a11 = a12 = a13 = np.float32(0.0)
            a20 = a21 = a22 = a23 = np.float32(0.0)
            a30 = a31 = a32 = a33 = np.float32(0.0)
            for k in range(k_count):
                w0, w1, w2, w3 = w[n, k], w[n + 1, k], w[n + 2, k], w[n + 3, k]
                x0, x1, x2, x3 = x[t, k], x[t + 1, k], x[t + 2, k], x[t + 3, k]
                a00 += x0 * w0
                a01 += x0 * w1
                a02 += x0 * w2
                a03 += x0 * w3
                a10 += x1 * w0
                a11 += x1 * w1
                a12 += x1 * w2
                a13 += x1 * w3
                a20 += x2 * w0
                a21 += x2 * w1
                a22 += x2 * w2
                a23 += x2 * w3
                a30 += x3 * w0
                a31 += x3 * w1
                a32 += x3 * w2
                a33 += x3 * w3
            y[t, n], y[t, n + 1], y[t, n + 2], y[t, n + 3] = a00, a01, a02, a03
            y[t + 1, n], y[t + 1, n + 1], y[t + 1, n + 2], y[t + 1, n + 3] = a10, a11, a12, a13
            y[t + 2, n], y[t + 2, n + 1], y[t + 2, n + 2], y[t + 2, n + 3] = a20, a21, a22, a23
            y[t + 3, n], y[t + 3, n + 1], y[t + 3, n + 2], y[t + 3, n + 3] = a30, a31, a32, a33
        for j in range(n, n + 4):
            for t in range(t4, t_count):
                acc = np.float32(0.0)
                for k in range(k_count):
                    acc += x[t, k] * w[j, k]
                y[t, j] = acc
    for j in range(n4, n_count):
        for t in range(t_count):
            acc = np.float32(0.0)
            for k in range(k_count):
                acc += x[t, k] * w[j, k]
            y[t, j] = acc


def fast_matrix(weight: Any) -> np.ndarray | None:
    """The weight as a row-major fp32 [N, K] array the kernel reads in place, or None."""
    w = weight.data if isinstance(weight, DenseWeight) else weight
    if isinstance(w, np.ndarray) and w.ndim == 2 and w.dtype == np.float32 and w.flags.c_contiguous:
        return w
    return None


def linear(x: Any, weight: Any, bias: Any = None) -> Any:
    """ops.cpu.linear's contract: x [T, K] @ weight [N, K]^T (+ bias [N]) -> [T, N] float32."""
    w = fast_matrix(weight)
    if (w is None or cpu.linear is not _REFERENCE or not isinstance(x, np.ndarray) or x.ndim != 2
            or x.shape[0] == 0 or x.shape[1] != w.shape[1]):
        return cpu.linear(x, weight, bias)
    if x.shape[0] <= FAST_MAX_T:
        y = np.empty((x.shape[0], w.shape[0]), dtype=np.float32)
        _linear_rows(np.ascontiguousarray(x, dtype=np.float32), w, y)
    else:                         # BLAS with the row-major weight as its plain left operand
        y = np.ascontiguousarray((w @ x.astype(np.float32, copy=False).T).T)
    if bias is not None:
        y += bias
    return y


def linear_add(x: Any, weight: Any, residual: Any) -> Any:
    """ops.cpu.linear_add with this linear: residual += linear(x, weight), in place."""
    residual += linear(x, weight)
    return residual


def linear_swiglu(x: Any, gate_up: Any) -> Any:
    """ops.cpu.linear_swiglu with this linear."""
    return cpu.swiglu(linear(x, gate_up))


def linear_split(x: Any, weight: Any, bias: Any, sizes: tuple[int, ...]) -> tuple[Any, ...]:
    """ops.cpu.linear_split with this linear."""
    return cpu.split(linear(x, weight, bias), sizes)


@njit(fastmath=True, cache=True)
def _paged_decode_attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, positions: np.ndarray,
                            table: np.ndarray, scale: float, out: np.ndarray) -> None:   # pragma: no cover
    """out[b, h] = softmax(q[b, h] . K[0..positions[b]]) @ V, the keys of row b through its page
    table row (cache row = table[b, p // PAGE_SIZE] * PAGE_SIZE + p % PAGE_SIZE); each key and
    value row is read once for all query heads (1-D views: the dot and axpy loops vectorise)."""
    n_rows, hq, d = q.shape
    group = hq // k_cache.shape[1]
    sc = np.float32(scale)
    for b in range(n_rows):
        length = positions[b] + 1
        p = np.empty((hq, length), np.float32)
        for j in range(length):
            r = table[b, j // PAGE_SIZE] * PAGE_SIZE + j % PAGE_SIZE
            for h in range(hq):
                kr, qh = k_cache[r, h // group], q[b, h]
                acc = np.float32(0.0)
                for i in range(d):
                    acc += qh[i] * kr[i]
                p[h, j] = acc * sc
        for h in range(hq):
            top = np.float32(-np.inf)
            for j in range(length):
                top = max(top, p[h, j])
            total = np.float32(0.0)
            for j in range(length):
                e = np.exp(p[h, j] - top)
                p[h, j] = e
                total += e
            inv = np.float32(1.0) / total
            for j in range(length):
                p[h, j] *= inv
        acc_out = np.zeros((hq, d), np.float32)
        for j in range(length):
            r = table[b, j // PAGE_SIZE] * PAGE_SIZE + j % PAGE_SIZE
            for h in range(hq):
                vr, row, pj = v_cache[r, h // group], acc_out[h], p[h, j]
                for i in range(d):
                    row[i] += pj * vr[i]
        out[b] = acc_out


def attention(q: Any, k_cache: Any, v_cache: Any, positions: Any, scale: float, k_scale: Any = None,
              v_scale: Any = None, page_table: Any = None) -> Any:
    """ops.cpu.attention's contract; a paged round of one fp32 query per sequence runs here."""
    if (page_table is None or k_scale is not None or v_scale is not None or not isinstance(q, np.ndarray)
            or q.ndim != 3 or q.shape[0] != np.shape(page_table)[0]
            or not (isinstance(k_cache, np.ndarray) and k_cache.dtype == np.float32 and k_cache.flags.c_contiguous)
            or not (isinstance(v_cache, np.ndarray) and v_cache.dtype == np.float32 and v_cache.flags.c_contiguous)):
        return cpu.attention(q, k_cache, v_cache, positions, scale, k_scale, v_scale, page_table)
    out = np.empty(q.shape, dtype=np.float32)
    _paged_decode_attention(np.ascontiguousarray(q, dtype=np.float32), k_cache, v_cache,
                            np.asarray(positions, dtype=np.int64), np.asarray(page_table, dtype=np.int64),
                            float(scale), out)
    return out


def attention_gated(q: Any, k_cache: Any, v_cache: Any, positions: Any, scale: float, gate: Any,
                    k_scale: Any = None, v_scale: Any = None, page_table: Any = None) -> Any:
    """ops.cpu.attention_gated with this attention."""
    t, hq, d = q.shape
    out = attention(q, k_cache, v_cache, positions, scale, k_scale, v_scale, page_table)
    return cpu.sigmoid_mul(out.reshape(t, hq * d), gate)
