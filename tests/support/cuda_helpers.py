"""Test-only helpers around CudaOps: host stand-ins for the CUDA simulator (NUMBA_ENABLE_CUDASIM=1:
HostArena, SimStream) and `upload_weights` (the product uploads through engine/upload_policy.py)."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ninfer_nb.runtime.tensor import bfloat16


class SimStream:
    """Stand-in for runtime.stream.Stream under the CUDA simulator."""

    numba = 0
    cu = None

    def synchronize(self) -> None:
        pass


def default_keep_fp32(name: str, arr: np.ndarray) -> bool:
    """Small parameters stay fp32: vectors (norms, biases, A_log, dt_bias) and conv1d weights."""
    return arr.ndim < 2 or "conv1d" in name


def upload_weights(weights: dict[str, np.ndarray], dtype: Any = bfloat16, *, arena: Any, stream: Any,
                   progress: Callable[[int, int, str], None] | None = None,
                   keep_fp32: Callable[[str, np.ndarray], bool] = default_keep_fp32) -> dict[str, Any]:
    """Upload host arrays into `arena`: matrices as `dtype` (bf16 by default), small parameters
    (per `keep_fp32`) as fp32, through a pinned staging buffer. progress(done_bytes, total, name)."""
    from ninfer_nb.runtime.pinned import PinnedStaging

    items = []
    total = 0
    for name, a in weights.items():
        want = np.dtype(np.float32) if (keep_fp32(name, a) or a.dtype == np.int32) else np.dtype(dtype)
        if a.dtype in (np.int32, np.int64):
            want = np.dtype(a.dtype)
        items.append((name, a, want))
        total += int(np.prod(a.shape, dtype=np.int64)) * want.itemsize
    out: dict[str, Any] = {}
    if isinstance(arena, _HostLike):
        for name, a, want in items:
            out[name] = np.ascontiguousarray(np.asarray(a).astype(want))
        return out
    staging = PinnedStaging(min(64 << 20, max(total, 1 << 20)))
    done = 0
    try:
        for name, a, want in items:
            host = np.ascontiguousarray(np.asarray(a).astype(want, copy=False))
            t = arena.empty(host.shape, want)
            staging.upload(t, host, stream)
            out[name] = t
            done += host.nbytes
            if progress is not None:
                progress(done, total, name)
    finally:
        staging.close()
    return out


class _HostLike:
    """Marker base for host arenas (simulator)."""


class HostArena(_HostLike):
    """Simulator stand-in for ScratchArena: NumPy arrays, `reset()` does nothing."""

    def empty(self, shape: Any, dtype: Any = np.float32) -> np.ndarray:
        return np.full(shape, np.nan, dtype=dtype) if np.dtype(dtype).kind == "f" else np.zeros(shape, dtype)

    def reset(self) -> None:
        pass

