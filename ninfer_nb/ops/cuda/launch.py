"""Launch plumbing of the CUDA ops: `CudaOpsBase` holds the arenas and the engine stream,
makes tensors (empty / zeros / from_numpy), scopes scratch, and launches kernels (`_go`), with
programmatic dependent launch inside `programmatic_launches()`. Knows no op family.

Under NUMBA_ENABLE_CUDASIM=1, pass host arenas and a stream stand-in (tests/support/sim_host.py):
tensors are NumPy arrays and launches go through numba's simulator.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import numpy as np
from numba import config

from ninfer_nb.ops.kernel_choices import KernelChoices
from ninfer_nb.runtime.launch import Launcher, NotDeviceArgs
from ninfer_nb.runtime.tensor import Tensor, bfloat16

SIM = bool(getattr(config, "ENABLE_CUDASIM", 0))   # NUMBA_ENABLE_CUDASIM=1: the CUDA simulator
# Kernels on trial (name: what), off unless `bench --experimental NAME` puts the name into
# CudaOps.experimental; none at present (the ones tried, kept and dropped: docs/perf-log.md).
EXPERIMENTAL: dict[str, str] = {}
F32 = np.dtype(np.float32)
I32 = np.dtype(np.int32)


def _kv(t: Any) -> Any:
    """Kernel-facing view: NumPy bf16 arrays become uint16 (Tensors already export '<u2')."""
    if isinstance(t, np.ndarray) and t.dtype == bfloat16:
        return t.view(np.uint16)
    return t


def _ptr(t: Any) -> int:
    return t.ptr if isinstance(t, Tensor) else int(t.ctypes.data)


def _rows(t: Any, d: int) -> Any:
    return t.reshape(-1, d)


def _part_bounds(sizes: tuple[int, ...], slots: int) -> list[int]:
    """The inner boundaries of `sizes` laid side by side, padded with the total to `slots`
    entries (the split kernels' b1, b2, ...: a part past the last real one is empty)."""
    total = sum(sizes)
    return [sum(sizes[:i + 1]) for i in range(len(sizes) - 1)] + [total] * (slots - len(sizes) + 1)


def _flat_parts(flat: Any, t: int, sizes: tuple[int, ...]) -> tuple[Any, ...]:
    """Views [T, size_i] of the parts a split kernel wrote back to back into flat [T * sum]."""
    parts, off = [], 0
    for size in sizes:
        parts.append(flat[off * t:(off + size) * t].reshape(t, size))
        off += size
    return tuple(parts)

def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


class CudaOpsBase:
    def __init__(self, scratch: Any, stream: Any, persistent: Any = None,
                 arch: tuple[int, int] | None = None, sm_count: int = 132,
                 choices: KernelChoices | None = None) -> None:
        """arch: the device's compute capability; sm_count: its multiprocessors (sizes the
        decode attention split grid); choices: the kernels of the A/B-able ops (the defaults)."""
        choices = choices or KernelChoices()
        self.arch: tuple[int, int] | None = None if arch is None else (int(arch[0]), int(arch[1]))
        self.sm_count = sm_count
        self.hopper = self.arch == (9, 0)
        _need(choices.prefill_gemm != "wgmma" or self.hopper,
              f"prefill_gemm=wgmma needs a cc 9.0 GPU (this is {arch})")
        self.choices = choices
        self.use_wgmma = self.hopper and choices.prefill_gemm != "mma"   # prefill GEMMs: wgmma, else mma.sync
        self.scratch = scratch
        self.stream = stream
        self.persistent = persistent
        # Names from EXPERIMENTAL turned on (bench --experimental); a kernel on trial reads it.
        self.experimental: frozenset[str] = frozenset()
        self._router_counter: Any = None   # fused_router's arrival counter [1] int32 (persistent)
        self._launchers: dict[str, Launcher] = {}                     # kernel name -> direct launcher
        self._cluster_ok: dict[tuple[str, int], bool] = {}           # (kernel, cluster size) -> launchable
        self._cu_stream = None if SIM else stream.cu                  # CUstream for cuLaunchKernel
        # Programmatic dependent launch (cc >= 9.0) inside `programmatic_launches()`: a kernel
        # that directly follows another kernel of ours on the stream is launched with the PDL
        # attribute. `_after_kernel` is False after a memset or copy, which keep plain order.
        self._pdl = False
        self._after_kernel = False

    # --- buffers ---------------------------------------------------------------------
    def empty(self, shape: Any, dtype: Any = np.float32) -> Any:
        return self.scratch.empty(tuple(shape) if not isinstance(shape, int) else (shape,), dtype)

    def zeros(self, shape: Any, dtype: Any = np.float32, persistent: bool = False) -> Any:
        arena = self.persistent if persistent else self.scratch
        t = arena.empty(tuple(shape) if not isinstance(shape, int) else (shape,), dtype)
        if isinstance(t, np.ndarray):
            t[...] = 0
        else:
            from ninfer_nb.runtime._drv import check, driver

            n = t.nbytes
            if n:
                check(driver().cuMemsetD8Async(t.ptr, 0, n, self.stream.cu))
                self._after_kernel = False
        return t

    def from_numpy(self, arr: np.ndarray, dtype: Any = None, persistent: bool = True) -> Any:
        a = np.ascontiguousarray(arr if dtype is None else np.asarray(arr).astype(dtype))
        arena = self.persistent if (persistent and self.persistent is not None) else self.scratch
        t = arena.empty(a.shape, a.dtype)
        if isinstance(t, np.ndarray):
            t[...] = a
        else:
            t.copy_from_numpy(a, self.stream)
            self._after_kernel = False
        return t

    def to_numpy(self, t: Any) -> np.ndarray:
        return np.array(t) if isinstance(t, np.ndarray) else t.numpy(self.stream)

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """Scratch allocated inside is handed back on exit: intermediates of one op (the grouped
        MoE sort and GEMM rows, the chunked GDN's W / Q' / U) or of one decoder layer do not
        pile up over the layers. Nothing allocated inside may be used after the exit.
        Safe because every kernel runs on the one engine stream, in order; the rewind is
        deterministic, so a captured step still allocates the same addresses every time."""
        mark = getattr(self.scratch, "offset", None)
        try:
            yield
        finally:
            if mark is not None:
                self.scratch.offset = mark

    @contextlib.contextmanager
    def programmatic_launches(self, enabled: bool = True) -> Iterator[None]:
        """Launch with programmatic dependent launch inside (cc >= 9.0 and `enabled`; else a
        no-op): each kernel that follows another kernel on the stream may start its blocks
        while that one finishes (see runtime/launch.py). The CUDA backend captures its decode
        graph inside, so the graph's kernel-to-kernel edges are programmatic."""
        before = self._pdl
        self._pdl = enabled and not SIM and self.arch is not None and self.arch >= (9, 0)
        self._after_kernel = False                   # the first launch follows whatever came before
        try:
            yield
        finally:
            self._pdl = before

    def _launcher(self, spec: Any) -> Launcher:
        launcher = self._launchers.get(spec.name)
        if launcher is None:
            launcher = self._launchers[spec.name] = Launcher(spec.get())
        return launcher

    def _go(self, spec: Any, grid: Any, block: Any, *args: Any, smem: int = 0, cluster: int = 0) -> None:
        """Launch `spec` on the engine stream: straight through cuLaunchKernel
        (runtime/launch.py) when every array argument is a device Tensor, else (the simulator,
        host arrays) through numba's dispatcher. `cluster` > 0: as thread-block clusters of
        that many blocks (device Tensors only)."""
        if not SIM:
            try:
                self._launcher(spec)(grid, block, self._cu_stream, args, smem, self._pdl and self._after_kernel,
                                     cluster)
                self._after_kernel = True
                return
            except NotDeviceArgs:
                if cluster:
                    raise
        self._after_kernel = True
        if smem:
            spec[grid, block, self.stream.numba, smem](*[_kv(a) for a in args])
        else:
            spec[grid, block, self.stream.numba](*[_kv(a) for a in args])

    def _cluster_fits(self, spec: Any, args: tuple[Any, ...], grid: int, block: int, c: int) -> bool:
        """Whether the GPU can launch `spec` as clusters of c blocks (cuOccupancyMaxActiveClusters;
        a GPU without non-portable cluster sizes refuses c > 8 outright). Cached per kernel and c."""
        ok = self._cluster_ok.get((spec.name, c))
        if ok is None:
            from ninfer_nb.runtime._drv import CudaDriverError

            try:
                ok = self._launcher(spec).max_active_clusters(args, grid, block, c) > 0
            except CudaDriverError:
                ok = False
            self._cluster_ok[(spec.name, c)] = ok
        return ok

