"""`Tensor`: a C-contiguous view of device memory (pointer + shape + dtype), CAI v3 only.

It exposes nothing but `__cuda_array_interface__` (stream None, no `__dlpack__`), so numba
launches it cheaply and graph capture never touches another stream. bfloat16 tensors
(dtype ml_dtypes.bfloat16) export their storage type, uint16 ('<u2'): kernels bit-cast.
Views (reshape, first-axis slicing) share memory and keep the owner alive. This module knows
nothing about arenas beyond "something that owns the memory".
"""
from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from ninfer_nb.runtime._drv import check, driver

bfloat16 = np.dtype(ml_dtypes.bfloat16)

_TYPESTR = {bfloat16: "<u2"}


def storage_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype kernels see: uint16 for bfloat16, else the dtype itself."""
    dtype = np.dtype(dtype)
    return np.dtype(np.uint16) if dtype == bfloat16 else dtype


class Tensor:
    __slots__ = ("ptr", "shape", "dtype", "owner", "host", "_cai", "_abi")

    def __init__(self, ptr: int, shape: tuple[int, ...], dtype: Any, owner: Any = None) -> None:
        self.ptr = int(ptr)
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.owner = owner
        # A NumPy copy of the contents, set by whoever uploads a small input that no kernel
        # writes afterwards (a prefill chunk's positions), so launches can be sized on the
        # host without a device read-back. None otherwise; views do not inherit it.
        self.host: np.ndarray | None = None
        self._cai: dict | None = None
        self._abi: tuple | None = None

    # --- array-like surface used by the models -----------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize

    def __len__(self) -> int:
        return self.shape[0]

    def reshape(self, *shape: Any) -> "Tensor":
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = list(shape)
        if shape.count(-1) > 1:
            raise ValueError("only one -1 allowed in reshape")
        if -1 in shape:
            known = 1
            for s in shape:
                if s != -1:
                    known *= s
            if known == 0 or self.size % known:
                raise ValueError(f"cannot reshape {self.shape} to {tuple(shape)}")
            shape[shape.index(-1)] = self.size // known
        new = tuple(int(s) for s in shape)
        n = 1
        for s in new:
            n *= s
        if n != self.size:
            raise ValueError(f"cannot reshape {self.shape} to {new}")
        return Tensor(self.ptr, new, self.dtype, self._root())

    def view(self, dtype: Any) -> "Tensor":
        """Reinterpret the bytes (last axis rescaled), like ndarray.view."""
        dtype = np.dtype(dtype)
        if not self.shape:
            raise ValueError("cannot view a 0-d tensor")
        last = self.shape[-1] * self.itemsize
        if last % dtype.itemsize:
            raise ValueError("last axis does not divide the new itemsize")
        return Tensor(self.ptr, self.shape[:-1] + (last // dtype.itemsize,), dtype, self._root())

    def __getitem__(self, key: Any) -> "Tensor":
        if isinstance(key, tuple):
            if len(key) != 1:
                raise IndexError("Tensor supports indexing along the first axis only")
            key = key[0]
        if not self.shape:
            raise IndexError("cannot index a 0-d tensor")
        n = self.shape[0]
        row = self.nbytes // n if n else 0
        if isinstance(key, slice):
            start, stop, step = key.indices(n)
            if step != 1:
                raise IndexError("Tensor slicing needs step 1")
            stop = max(stop, start)
            return Tensor(self.ptr + start * row, (stop - start,) + self.shape[1:], self.dtype, self._root())
        i = int(key)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"index {key} out of range for axis 0 of size {n}")
        return Tensor(self.ptr + i * row, self.shape[1:], self.dtype, self._root())

    def _root(self) -> Any:
        return self.owner if self.owner is not None else self

    def kernel_abi(self) -> tuple:
        """((storage dtype, ndim), numba's kernel parameters for this array: meminfo, parent,
        nitems, itemsize, data, shape..., strides in bytes...), cached (runtime/launch.py)."""
        abi = self._abi
        if abi is None:
            item = self.itemsize
            strides = [0] * len(self.shape)
            acc = item
            for i in range(len(self.shape) - 1, -1, -1):
                strides[i] = acc
                acc *= self.shape[i]
            abi = self._abi = ((storage_dtype(self.dtype), len(self.shape)),
                               (0, 0, self.size, item, self.ptr) + self.shape + tuple(strides))
        return abi

    # --- CUDA array interface ----------------------------------------------------------
    @property
    def __cuda_array_interface__(self) -> dict:
        cai = self._cai
        if cai is None:
            typestr = _TYPESTR.get(self.dtype, self.dtype.str)
            cai = {"shape": self.shape, "typestr": typestr, "data": (self.ptr, False),
                   "strides": None, "version": 3, "stream": None}
            self._cai = cai
        return cai

    # --- host transfers ----------------------------------------------------------------
    def numpy(self, stream: Any = None) -> np.ndarray:
        """Copy to a new host array. Waits for `stream` (or the whole context when None)."""
        drv = driver()
        out = np.empty(self.shape, dtype=self.dtype)
        if stream is None:
            check(drv.cuCtxSynchronize())
        else:
            stream.synchronize()
        if self.nbytes:
            check(drv.cuMemcpyDtoH(out.ctypes.data, self.ptr, self.nbytes))
        return out

    def copy_from_numpy(self, arr: np.ndarray, stream: Any = None) -> None:
        """Synchronous host -> device copy into this tensor (same shape and dtype)."""
        drv = driver()
        a = np.ascontiguousarray(arr, dtype=self.dtype)
        if a.shape != self.shape:
            raise ValueError(f"shape mismatch {a.shape} vs {self.shape}")
        if stream is not None:
            stream.synchronize()
        if self.nbytes:
            check(drv.cuMemcpyHtoD(self.ptr, a.ctypes.data, self.nbytes))

    def __repr__(self) -> str:
        return f"Tensor(shape={self.shape}, dtype={self.dtype}, ptr=0x{self.ptr:x})"


def from_numpy(arr: np.ndarray, arena: Any = None, dtype: Any = None, stream: Any = None) -> Tensor:
    """Upload `arr` (cast to `dtype` if given) into `arena` (or a standalone allocation)."""
    a = np.ascontiguousarray(arr if dtype is None else np.asarray(arr).astype(dtype))
    if arena is None:
        from ninfer_nb.runtime.arena import standalone

        arena = standalone(max(a.nbytes, 1))
    t = arena.empty(a.shape, a.dtype)
    t.copy_from_numpy(a, stream)
    return t
