"""Row operations on linear weight records, in their stored format: concatenate projections
row-wise (fused q | gate | k | v, gate | up, expert stacks), pick rows (q / gate de-interleave,
llama.cpp's Q/K row permutation). The model builders use these so a quantized or 16-bit
checkpoint is never widened to float32 while it is assembled.

Rows of the groupwise layouts are independent (scales and zero points are per row), so the
row operations act on every array's row axis (-2) and stay exact. fp8-block scales cover 128
rows, so its rows move only in whole blocks; anything else (mixed formats or dtypes, rows that
split an fp8 block) falls back to float32 values, which is exact too, just larger. Knows
nothing about models or devices.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..models.weights import DenseWeight, LinearWeight, QuantizedWeight, as_linear, dense_dtype

Matrix = Any            # a LinearWeight record or a bare array [N, K] / [E, N, K]


def dense_record(x: Matrix) -> LinearWeight:
    """A record for a checkpoint tensor: records as they are; arrays tagged by their dtype
    (f32 / bf16 / f16 kept as stored; other dtypes become float32)."""
    if isinstance(x, (DenseWeight, QuantizedWeight)):
        return x
    x = np.asarray(x)
    try:
        return DenseWeight(x, dense_dtype(x.dtype))
    except TypeError:
        return DenseWeight(np.ascontiguousarray(x, dtype=np.float32), "f32")


def values(w: Matrix) -> np.ndarray:
    """float32 values of a record or array (the fallback path)."""
    w = as_linear(w) if not isinstance(w, np.ndarray) else dense_record(w)
    if isinstance(w, QuantizedWeight):
        from .dequant import dequantize

        return dequantize(w)
    return np.asarray(w.data, dtype=np.float32)


def _block_aligned(w: QuantizedWeight, starts: Sequence[int]) -> bool:
    if w.format.layout != "fp8-block":
        return True
    b = w.format.group_size
    return all(s % b == 0 for s in starts)


def concat_rows(parts: Sequence[Matrix], axis_rows: int = -2) -> LinearWeight:
    """Stack matrices [N_i, K] (or stacks [E, N_i, K]) into [sum N_i, K] in their common stored
    format; float32 when they differ. axis_rows=0 appends expert stacks [E_i, N, K] instead."""
    recs = [dense_record(p) for p in parts]
    if len(recs) == 1:
        return recs[0]
    dense = [r for r in recs if isinstance(r, DenseWeight)]
    q = [r for r in recs if isinstance(r, QuantizedWeight)]
    if len(dense) == len(recs) and len({r.dtype for r in dense}) == 1:
        return DenseWeight(np.concatenate([np.asarray(r.data) for r in dense], axis=axis_rows),
                           dense[0].dtype)
    if len(q) == len(recs) and all(r.format == q[0].format and r.shape[-1] == q[0].shape[-1] for r in q):
        sizes = [int(r.shape[axis_rows]) for r in q]
        starts = [int(s) for s in np.cumsum([0] + sizes)[:-1]]
        if axis_rows == 0 or _block_aligned(q[0], starts):
            shape = list(q[0].shape)
            shape[axis_rows] = sum(sizes)
            arrays = {k: np.concatenate([np.asarray(r.arrays[k]) for r in q], axis=axis_rows)
                      for k in q[0].format.arrays}
            return QuantizedWeight(q[0].format, tuple(shape), arrays)
    return DenseWeight(np.concatenate([values(r) for r in recs], axis=axis_rows), "f32")


def take_rows(w: Matrix, rows: np.ndarray) -> LinearWeight:
    """w[rows] of a matrix [N, K] (rows: an index array) in its stored format; float32 when the
    rows split fp8 blocks."""
    rec = dense_record(w)
    rows = np.asarray(rows)
    if isinstance(rec, DenseWeight):
        return DenseWeight(np.ascontiguousarray(np.asarray(rec.data)[rows]), rec.dtype)
    fmt = rec.format
    if fmt.layout == "fp8-block":
        b = fmt.group_size
        blocks = rows.reshape(-1, b) if rows.size % b == 0 else None
        if (blocks is None or not np.all(blocks[:, 0] % b == 0)
                or not np.all(blocks == blocks[:, :1] + np.arange(b))):
            return DenseWeight(np.ascontiguousarray(values(rec)[rows]), "f32")
        picked = {"codes": np.asarray(rec.arrays["codes"])[rows],
                  "scales": np.asarray(rec.arrays["scales"])[blocks[:, 0] // b]}
    else:
        picked = {k: np.ascontiguousarray(np.asarray(a)[rows]) for k, a in rec.arrays.items()}
    return QuantizedWeight(fmt, (len(rows),) + tuple(rec.shape[1:]), picked)


def row_slice(w: Matrix, start: int, stop: int) -> LinearWeight:
    """Rows [start, stop) of a matrix [N, K] in its stored format."""
    return take_rows(w, np.arange(start, stop))


def stack_experts(parts: Sequence[Matrix]) -> LinearWeight:
    """Expert matrices [N, K] -> a stack [E, N, K] in their common format (float32 when mixed)."""
    recs = [dense_record(p) for p in parts]
    dense = [r for r in recs if isinstance(r, DenseWeight)]
    q = [r for r in recs if isinstance(r, QuantizedWeight)]
    if len(dense) == len(recs) and len({r.dtype for r in dense}) == 1:
        return DenseWeight(np.stack([np.asarray(r.data) for r in dense]), dense[0].dtype)
    if len(q) == len(recs) and all(r.format == q[0].format and r.shape == q[0].shape for r in q):
        return QuantizedWeight(q[0].format, (len(q),) + tuple(q[0].shape),
                               {k: np.stack([np.asarray(r.arrays[k]) for r in q]) for k in q[0].format.arrays})
    return DenseWeight(np.stack([values(r) for r in recs]), "f32")
