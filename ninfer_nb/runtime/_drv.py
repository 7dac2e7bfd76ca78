"""Thin helpers over `cuda.bindings.driver`: call a driver function and raise on error.

Knows nothing about tensors or kernels; every runtime module goes through `check`.
"""
from __future__ import annotations

from typing import Any


class CudaDriverError(RuntimeError):
    """A CUDA driver call returned something other than CUDA_SUCCESS."""


def driver() -> Any:
    from cuda.bindings import driver as drv  # imported lazily: no driver needed to import ninfer_nb

    return drv


def check(result: Any) -> Any:
    """Unpack a cuda.bindings result tuple `(err, *values)`; raise CudaDriverError on failure."""
    drv = driver()
    if isinstance(result, tuple):
        err, rest = result[0], result[1:]
    else:
        err, rest = result, ()
    if err != drv.CUresult.CUDA_SUCCESS:
        try:
            _, name = drv.cuGetErrorName(err)
            name = name.decode() if isinstance(name, bytes) else str(name)
        except Exception:  # pragma: no cover - best effort message
            name = str(err)
        raise CudaDriverError(f"CUDA driver error {name}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest
