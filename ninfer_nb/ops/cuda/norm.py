"""Norms, elementwise ops and the embedding lookup on the GPU (kernels/norm.py,
kernels/elementwise.py, kernels/embedding.py), and `Normed`: one decode token's RMSNorm left
for the consuming kernel to apply as it reads the row."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ninfer_nb.kernels import elementwise as K_ew
from ninfer_nb.kernels import embedding as K_emb
from ninfer_nb.kernels import norm as K_norm

from .launch import (
    F32,
    I32,
    SIM,
    CudaOpsBase,
    _flat_parts,
    _need,
    _part_bounds,
    _ptr,
    _rows,
)
from .records import dense


@dataclass(frozen=True)
class Normed:
    """rms_norm(x, weight, eps) of one token's residual row, left for the consumer to compute
    (`CudaOps.normed`): the decode GEMVs, the router and the MoE gate_up scale x by the norm
    weight as they stream it and apply 1 / rms at the end (kernels/linear/linear.py
    gemv_one_token "normed"), so the norm costs no launch. Consumers without such a kernel
    call `CudaOps.plain` first."""
    x: Any          # [1, H] fp32 device tensor (the residual stream)
    weight: Any     # [H] fp32
    eps: float

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape)

    @property
    def size(self) -> int:
        return int(self.x.size)


class NormOps(CudaOpsBase):
    def embedding(self, table: Any, ids: Any) -> Any:
        _need(ids.dtype == I32, "embedding: ids must be int32")
        w = dense(table, "embedding")
        t, h = ids.shape[0], w.shape[1]
        out = self.empty((t, h))                                     # [T, H] fp32
        if t:
            spec = K_emb.embedding_f32_kernel if w.dtype == "f32" else K_emb.embedding_bf16_kernel
            self._go(spec, ((h + 255) // 256, t), 256, w.data, ids, out)
        return out

    def rms_norm(self, x: Any, weight: Any, eps: float) -> Any:
        d = x.shape[-1]
        out = self.empty(x.shape)
        rows = x.size // d if d else 0
        if rows:
            self._go(K_norm.rms_norm_kernel, rows, K_norm.threads_for(d), _rows(x, d), weight, _rows(out, d), np.float32(eps))
        return out

    def add_rms_norm(self, x: Any, residual: Any, weight: Any, eps: float,
                     out: tuple[Any, Any] | None = None) -> tuple[Any, Any]:
        """(rms_norm(x + residual) * weight, x + residual) in one kernel; `out` = (normed, sum)
        buffers to write instead of new ones (they must not alias x or residual)."""
        d = x.shape[-1]
        _need(d <= K_norm.MAX_D, f"norm rows of {d} > {K_norm.MAX_D}")
        normed, res = out if out is not None else (self.empty(x.shape), self.empty(x.shape))
        rows = x.size // d if d else 0
        if (rows >= K_norm.ROWS_MIN_R and d % (4 * K_norm.ROWS_THREADS) == 0
                and all(_ptr(a) % 16 == 0 for a in (x, residual, weight, normed, res))):
            self._go(K_norm.add_rms_norm_rows_kernel, rows, K_norm.ROWS_THREADS, x.reshape(-1), residual.reshape(-1),
                     weight, normed.reshape(-1), res.reshape(-1), np.int32(d), np.float32(eps))
        elif rows:
            self._go(K_norm.add_rms_norm_kernel, rows, K_norm.threads_for(d), _rows(x, d), _rows(residual, d), weight,
                     _rows(normed, d), _rows(res, d), np.float32(eps))
        return normed, res

    def normed(self, x: Any, weight: Any, eps: float) -> Any:
        """rms_norm(x, weight, eps) for a consumer to read: one fp32 token row (the decode
        step) comes back as a `Normed` that the next kernel normalises as it reads it; more
        rows (prefill) are normalised here."""
        d = x.shape[-1]
        if (not SIM and x.size == d and d % 8 == 0 and x.dtype == F32 and weight.dtype == F32
                and _ptr(x) % 16 == 0 and _ptr(weight) % 16 == 0):
            return Normed(x, weight, float(eps))
        return self.rms_norm(x, weight, eps)

    def plain(self, x: Any) -> Any:
        """x itself, or a `Normed` computed into a new tensor."""
        return self.rms_norm(x.x, x.weight, x.eps) if isinstance(x, Normed) else x

    def add_into(self, acc: Any, y: Any) -> Any:
        """acc += y in place (the residual stream); returns acc."""
        _need(tuple(acc.shape) == tuple(y.shape), f"add_into: shapes differ {acc.shape} vs {y.shape}")
        if acc.size:
            self._go(K_ew.add_kernel, K_ew.grid_for(acc.size), K_ew.BLOCK, acc.reshape(-1), y.reshape(-1),
                     acc.reshape(-1))
        return acc

    def _unary(self, spec: Any, x: Any) -> Any:
        out = self.empty(x.shape)
        n = x.size
        if n:
            self._go(spec, K_ew.grid_for(n), K_ew.BLOCK, x.reshape(-1), out.reshape(-1))
        return out

    def add(self, x: Any, y: Any) -> Any:
        _need(tuple(x.shape) == tuple(y.shape), f"add: shapes differ {x.shape} vs {y.shape}")
        out = self.empty(x.shape)
        n = x.size
        if n:
            self._go(K_ew.add_kernel, K_ew.grid_for(n), K_ew.BLOCK, x.reshape(-1), y.reshape(-1), out.reshape(-1))
        return out

    def silu(self, x: Any) -> Any:
        return self._unary(K_ew.silu_kernel, x)

    def sigmoid(self, x: Any) -> Any:
        return self._unary(K_ew.sigmoid_kernel, x)

    def swiglu(self, gate_up: Any) -> Any:
        two_i = gate_up.shape[-1]
        inter = two_i // 2
        out = self.empty(tuple(gate_up.shape[:-1]) + (inter,))
        n = out.size
        if n:
            self._go(K_ew.swiglu_kernel, K_ew.grid_for(n), K_ew.BLOCK, _rows(gate_up, two_i), _rows(out, inter))
        return out

    def sigmoid_mul(self, x: Any, gate: Any) -> Any:
        """x * sigmoid(gate); gate may be [T, 1] against x [T, N] (per-row gate, broadcast)."""
        _need(gate.size > 0 and x.size % gate.size == 0, f"sigmoid_mul: gate {gate.shape} vs x {x.shape}")
        out = self.empty(x.shape)
        n = x.size
        if n:
            self._go(K_ew.sigmoid_mul_kernel, K_ew.grid_for(n), K_ew.BLOCK, x.reshape(-1), gate.reshape(-1),
                     out.reshape(-1), np.int32(x.size // gate.size))
        return out

    def split(self, x: Any, sizes: tuple[int, ...]) -> tuple[Any, ...]:
        """x [T, sum(sizes)] -> contiguous parts [T, size_i] (at most 4). One token: views into
        x, no copy (the decode path); more: one kernel copies the parts into one scratch buffer."""
        n = x.shape[-1]
        _need(sum(sizes) == n and 0 < len(sizes) <= 4, f"split: sizes {sizes} vs {x.shape}")
        t = x.size // n if n else 0
        flat = x.reshape(-1)
        if t > 1:
            flat = self.empty((t * n,))                                   # the parts, back to back
            self._go(K_ew.split_rows_kernel, K_ew.row_grid(t, n), K_ew.BLOCK, _rows(x, n), flat,
                     *(np.int32(b) for b in _part_bounds(sizes, 3)))
        return _flat_parts(flat, t, sizes)

    def gated_rms_norm(self, x: Any, z: Any, weight: Any, eps: float) -> Any:
        """Rows up to WARP_ROW_MAX_D wide (the GDN heads' 128): one warp per row; wider rows:
        one block per row."""
        d = x.shape[-1]
        out = self.empty(x.shape)
        rows = x.size // d if d else 0
        if rows and d <= K_norm.WARP_ROW_MAX_D:
            self._go(K_norm.gated_rms_norm_warp_kernel, (rows + K_norm.WARP_ROWS - 1) // K_norm.WARP_ROWS,
                     32 * K_norm.WARP_ROWS, _rows(x, d), _rows(z, d), weight, _rows(out, d), np.float32(eps))
        elif rows:
            self._go(K_norm.gated_rms_norm_kernel, rows, K_norm.threads_for(d), _rows(x, d), _rows(z, d), weight,
                     _rows(out, d), np.float32(eps))
        return out

