"""Kernel launches straight through `cuLaunchKernel`, in numba's kernel parameter ABI.

numba's `dispatcher[grid, block, stream](*args)` types and wraps every argument on each call
(over 100 us of host time per launch); decode replays graphs and does not care, but an eager
prefill chunk launches ~1000 kernels, so that host time bounded prefill (docs/perf-log.md).

`Launcher` packs the same parameters itself: per array argument numba's data model (meminfo,
parent, nitems, itemsize, data, shape..., strides... in bytes), per scalar its C type, each
parameter in its own 8-byte slot of a buffer made once per compiled overload; a launch is one
`struct.pack_into` and one `cuLaunchKernel` on the kernel's CUfunction (~10 us of host time).

Arguments must be `Tensor`s (C-contiguous device memory; each caches its packed parameters,
`Tensor.kernel_abi`) or scalars; a host array raises `NotDeviceArgs` (the caller falls back to
numba, which copies it). The overload is picked by the arrays' storage dtype and ndim, and a
mismatch raises TypeError as numba would. A lock guards each overload's packing buffer, so
threads may launch the same kernel. `pdl=True` launches through `cuLaunchKernelEx` with the
programmatic-stream-serialization attribute (programmatic dependent launch, cc >= 9.0): the
kernel's blocks may start while the previous kernel in the stream is still running, and they
wait in `griddepcontrol.wait`, which every registered kernel runs first (kernels/registry.py).
Captured into a CUDA graph it becomes a programmatic edge. `cluster=n` launches the grid as
thread-block clusters of n blocks (cc >= 9.0), through the same call. The calling thread must have the
context current (CudaBackend binds it). Knows nothing about what the kernels compute. GPU only: the simulator
keeps numba's path.
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


def param_layout(argument_types: Any) -> tuple[list[tuple[np.dtype, int] | None], str]:
    """(kind per argument: (dtype, ndim) for arrays, None for scalars; the struct format of the
    kernel's parameters, one 8-byte slot each) for a numba signature's argument types."""
    from numba.cuda import types
    from numba.cuda.np.numpy_support import as_dtype

    kinds: list[tuple[np.dtype, int] | None] = []
    fmt = "<"
    for ty in argument_types:
        if isinstance(ty, types.Array):
            if ty.layout != "C":
                raise TypeError(f"{ty}: only C-contiguous array parameters launch directly")
            kinds.append((np.dtype(as_dtype(ty.dtype)), ty.ndim))
            fmt += "q" * (5 + 2 * ty.ndim)          # meminfo, parent, nitems, itemsize, data, shape, strides
        else:
            kinds.append(None)
            fmt += _SCALAR_FORMATS[str(ty)]
    return kinds, fmt


class _Overload:
    """One compiled signature: its CUfunction, argument kinds and packing buffer."""

    def __init__(self, kernel: Any) -> None:
        self.kinds, fmt = param_layout(kernel.argument_types)
        self.struct = struct.Struct(fmt)
        n_params = self.struct.size // _SLOT
        self.buf = ctypes.create_string_buffer(self.struct.size)
        base = ctypes.addressof(self.buf)
        self.ptrs = (ctypes.c_void_p * max(n_params, 1))(*[base + _SLOT * i for i in range(n_params)])
        self.params = ctypes.addressof(self.ptrs)
        self.lock = threading.Lock()
        handle = kernel._codelibrary.get_cufunc().handle              # a CUkernel (cuLibrary loading)
        self.function = check(driver().cuKernelGetFunction(handle))
        self.configs: dict[tuple[bool, int], Any] = {}                # (pdl, cluster) -> CUlaunchConfig
        self.non_portable = False                                     # cluster sizes > 8 allowed

    def launch_config(self, pdl: bool, cluster: int) -> Any:
        """The CUlaunchConfig of a launch with programmatic dependent launch (`pdl`) and / or
        thread-block clusters of `cluster` blocks along x (grid, block, shared memory and
        stream are set per launch, under `lock`)."""
        cfg = self.configs.get((pdl, cluster))
        if cfg is None:
            drv = driver()
            attrs = []
            if pdl:
                attr = drv.CUlaunchAttribute()
                attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
                attr.value.programmaticStreamSerializationAllowed = 1
                attrs.append(attr)
            if cluster:
                if cluster > 8 and not self.non_portable:
                    check(drv.cuFuncSetAttribute(
                        self.function, drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1))
                    self.non_portable = True
                attr = drv.CUlaunchAttribute()
                attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
                attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = cluster, 1, 1
                attrs.append(attr)
            cfg = drv.CUlaunchConfig()
            cfg.attrs = attrs
            cfg.numAttrs = len(attrs)
            self.configs[(pdl, cluster)] = cfg
        return cfg

    def pack(self, args: tuple[Any, ...]) -> list[Any] | None:
        """The parameter values for `args`, or None if they do not fit this signature."""
        if len(args) != len(self.kinds):
            return None
        vals: list[Any] = []
        for a, kind in zip(args, self.kinds):
            if kind is None:
                if a.__class__ is Tensor:
                    return None
                vals.append(a)
                continue
            if a.__class__ is not Tensor:
                raise NotDeviceArgs
            key, abi = a.kernel_abi()
            if key != kind:
                return None
            vals += abi
        return vals


class NotDeviceArgs(TypeError):
    """An array argument is not a device Tensor (a host array): launch through numba instead."""


class Launcher:
    """Launches one KernelSpec's compiled overloads: `launcher(grid, block, stream, args, smem)`."""

    def __init__(self, dispatcher: Any) -> None:
        self.name = getattr(dispatcher, "__name__", str(dispatcher))
        self.overloads = [_Overload(k) for k in dispatcher.overloads.values()]
        drv = driver()
        self._launch = drv.cuLaunchKernel
        self._launch_ex = drv.cuLaunchKernelEx
        self._ok = drv.CUresult.CUDA_SUCCESS

    def _overload(self, args: tuple[Any, ...]) -> tuple[_Overload, list[Any]]:
        for ov in self.overloads:
            vals = ov.pack(args)
            if vals is not None:
                return ov, vals
        got = [(str(storage_dtype(a.dtype)), a.ndim) if isinstance(a, Tensor) else type(a).__name__ for a in args]
        raise TypeError(f"{self.name}: no compiled signature takes {got}")

    def __call__(self, grid: Any, block: Any, stream: Any, args: tuple[Any, ...], smem: int = 0,
                 pdl: bool = False, cluster: int = 0) -> None:
        """Launch on `stream`; `cluster` > 0: as clusters of that many blocks along x (cc >= 9.0;
        the grid's x must be a multiple of it)."""
        ov, vals = self._overload(args)
        gx, gy, gz = (tuple(grid) + (1, 1))[:3] if isinstance(grid, (tuple, list)) else (int(grid), 1, 1)
        bx, by, bz = (tuple(block) + (1, 1))[:3] if isinstance(block, (tuple, list)) else (int(block), 1, 1)
        with ov.lock:
            ov.struct.pack_into(ov.buf, 0, *vals)
            if pdl or cluster:
                cfg = ov.launch_config(pdl, cluster)
                cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = gx, gy, gz
                cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = bx, by, bz
                cfg.sharedMemBytes = smem
                cfg.hStream = stream
                err = self._launch_ex(cfg, ov.function, ov.params, 0)
            else:
                err = self._launch(ov.function, gx, gy, gz, bx, by, bz, smem, stream, ov.params, 0)
        if err[0] != self._ok:
            check(err)

    def max_active_clusters(self, args: tuple[Any, ...], grid: int, block: int, cluster: int, smem: int = 0) -> int:
        """How many clusters of `cluster` blocks of `block` threads the GPU can hold at once
        (cuOccupancyMaxActiveClusters) for the overload that takes `args`; 0: such a launch fails."""
        ov, _ = self._overload(args)
        with ov.lock:
            cfg = ov.launch_config(False, cluster)
            cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid, 1, 1
            cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block, 1, 1
            cfg.sharedMemBytes = smem
            cfg.hStream = 0
            return int(check(driver().cuOccupancyMaxActiveClusters(ov.function, cfg)))
