"""Kernel launches straight through `cuLaunchKernel`, in numba's kernel parameter ABI.

`dispatcher[grid, block, stream](*args)` types every argument and wraps every CUDA-array-
interface object in a DeviceNDArray on each call, then packs the parameters through
cuda.core: tens of microseconds of host time per launch with the engine's 6-12 array
arguments. Decode runs from CUDA graphs and does not care; prefill launches ~1000 kernels
per chunk eagerly, so that host time bounds it. `Launcher` packs the same parameters itself:
per array argument numba's data model (meminfo, parent, nitems, itemsize, data, shape...,
strides... in bytes), per scalar its C type, each parameter in its own 8-byte slot of a
buffer made once per compiled overload; a launch is one `struct.pack_into` and one
`cuLaunchKernel` on the kernel's CUfunction.

Arguments must be `Tensor`s (C-contiguous device memory) or scalars; the overload is picked by
the arrays' storage dtype and ndim, and a mismatch raises TypeError as numba would. Launches
from one thread at a time per kernel (the packing buffer is shared; a lock guards it).
Knows nothing about what the kernels compute. GPU only: the simulator keeps numba's path.
"""
from __future__ import annotations

import ctypes
import struct
import threading
from typing import Any

import numpy as np

from ninfer_nb.runtime._drv import check, driver
from ninfer_nb.runtime.tensor import Tensor, storage_dtype

_SLOT = 8
# scalar parameter types: struct format of one 8-byte slot
_SCALAR_FORMATS = {"int8": "b7x", "uint8": "B7x", "int16": "h6x", "uint16": "H6x", "int32": "i4x",
                   "uint32": "I4x", "int64": "q", "uint64": "Q", "float32": "f4x", "float64": "d"}


class _Overload:
    """One compiled signature: its CUfunction, argument kinds and packing buffer."""

    def __init__(self, kernel: Any) -> None:
        from numba.cuda import types
        from numba.cuda.np.numpy_support import as_dtype

        self.kinds: list[tuple[np.dtype, int] | None] = []    # (dtype, ndim) per array arg, None per scalar
        fmt = "<"
        for ty in kernel.argument_types:
            if isinstance(ty, types.Array):
                if ty.layout != "C":
                    raise TypeError(f"{kernel}: only C-contiguous array parameters launch directly")
                self.kinds.append((np.dtype(as_dtype(ty.dtype)), ty.ndim))
                fmt += "q" * (5 + 2 * ty.ndim)
            else:
                self.kinds.append(None)
                fmt += _SCALAR_FORMATS[str(ty)]
        self.struct = struct.Struct(fmt)
        n_params = self.struct.size // _SLOT
        self.buf = ctypes.create_string_buffer(self.struct.size)
        base = ctypes.addressof(self.buf)
        self.ptrs = (ctypes.c_void_p * max(n_params, 1))(*[base + _SLOT * i for i in range(n_params)])
        self.params = ctypes.addressof(self.ptrs)
        self.lock = threading.Lock()
        handle = kernel._codelibrary.get_cufunc().handle              # a CUkernel (cuLibrary loading)
        self.function = check(driver().cuKernelGetFunction(handle))

    def matches(self, args: tuple[Any, ...]) -> bool:
        if len(args) != len(self.kinds):
            return False
        for a, kind in zip(args, self.kinds):
            if kind is None:
                if isinstance(a, Tensor):
                    return False
            elif not isinstance(a, Tensor) or a.ndim != kind[1] or storage_dtype(a.dtype) != kind[0]:
                return False
        return True

    def values(self, args: tuple[Any, ...]) -> list[Any]:
        vals: list[Any] = []
        for a, kind in zip(args, self.kinds):
            if kind is None:
                vals.append(a)
                continue
            item = a.dtype.itemsize
            shape = a.shape
            vals += (0, 0, a.size, item, a.ptr)
            vals += shape
            strides = [0] * len(shape)
            acc = item
            for i in range(len(shape) - 1, -1, -1):
                strides[i] = acc
                acc *= shape[i]
            vals += strides
        return vals


class Launcher:
    """Launches one KernelSpec's compiled overloads: `launcher(grid, block, stream, args, smem)`."""

    def __init__(self, dispatcher: Any) -> None:
        self.name = getattr(dispatcher, "__name__", str(dispatcher))
        self.overloads = [_Overload(k) for k in dispatcher.overloads.values()]
        drv = driver()
        self._launch = drv.cuLaunchKernel
        self._ok = drv.CUresult.CUDA_SUCCESS

    def __call__(self, grid: Any, block: Any, stream: Any, args: tuple[Any, ...], smem: int = 0) -> None:
        for ov in self.overloads:
            if ov.matches(args):
                break
        else:
            got = [(str(storage_dtype(a.dtype)), a.ndim) if isinstance(a, Tensor) else type(a).__name__ for a in args]
            raise TypeError(f"{self.name}: no compiled signature takes {got}")
        gx, gy, gz = (grid, 1, 1) if isinstance(grid, int) else (tuple(grid) + (1, 1))[:3]
        bx, by, bz = (block, 1, 1) if isinstance(block, int) else (tuple(block) + (1, 1))[:3]
        with ov.lock:
            ov.struct.pack_into(ov.buf, 0, *ov.values(args))
            err = self._launch(ov.function, gx, gy, gz, bx, by, bz, smem, stream, ov.params, 0)
        if err[0] != self._ok:
            check(err)
