"""Kernel registry: every kernel with its explicit signatures and compile options.

Kernels are plain Python functions registered with `@kernel(...)`; the numba dispatcher is
built lazily on first launch (an explicit signature compiles eagerly, which needs a GPU), so
importing kernels/ needs no driver. `all_specs()` lets the compile test see every kernel.
In the simulator, `get()` returns the simulator kernel and ignores signatures.

On the GPU every kernel is compiled through a generated entry point with the same parameters
that calls `ptx.grid_dependency_sync()` (cc >= 9.0: griddepcontrol.wait, then
launch_dependents) and then the kernel body as an inlined device function. So any kernel may
be launched with programmatic dependent launch (runtime/launch.py `pdl=True`): its blocks can
be scheduled while the previous kernel in the stream finishes, and they wait there until that
kernel's memory is visible. Launched without the attribute, the wait returns at once. A kernel
registered with `self_sync=True` makes the call itself, after issuing its first weight loads
(weights depend on no kernel), so those loads overlap the previous kernel's tail. ptxas on
the H200's kernels: the same registers, two instructions more. The entry is compiled from the
kernel module's file name, so numba's on-disk cache keys it to that file as before.
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

from numba import config, cuda

# Every module that registers kernels, relative to ninfer_nb.kernels (the compile test walks them).
MODULES = ("elementwise", "embedding", "norm", "sampling", "sample_pick", "logprobs", "random_fill",
           "linear.linear", "linear.gemv_mma", "linear.gemm_mma", "linear.gemm_wgmma", "linear.gemv_quant", "linear.gemv_tiled",
           "attention.attention", "attention.attention_decode_mma", "attention.attention_gemm",
           "attention.attention_flash", "attention.rope", "attention.paging",
           "gdn.conv1d", "gdn.gdn", "gdn.gdn_decode", "gdn.gdn_chunked", "gdn.gdn_chunked_mma",
           "gdn.gdn_prepare_mma",
           "moe.moe", "moe.moe_grouped", "moe.moe_pipelined", "moe.moe_wgmma", "moe.moe_rows")

_SPECS: dict[str, "KernelSpec"] = {}


@dataclass
class KernelSpec:
    name: str
    fn: Callable[..., None]
    sigs: tuple[Any, ...]
    options: dict[str, Any] = field(default_factory=dict)
    sim: bool = True  # runs in the CUDA simulator (no warp shuffles, no inline PTX)
    dynamic_smem: int = 0  # bytes of dynamic shared memory the kernel is launched with
    # The body calls ptx.grid_dependency_sync() itself, after issuing its first weight loads
    # (which depend on no earlier kernel), instead of the entry calling it first.
    self_sync: bool = False
    _disp: Any = None
    _entry: Any = None

    def get(self) -> Any:
        if self._disp is None:
            if config.ENABLE_CUDASIM:
                self._disp = cuda.jit(self.fn)
            else:
                disp = cuda.jit(list(self.sigs), cache=True, **self.options)(self.entry())
                if self.dynamic_smem > 48 * 1024:
                    _allow_dynamic_smem(disp, self.dynamic_smem)
                self._disp = disp
        return self._disp

    def __getitem__(self, cfg: Any) -> Any:
        return self.get()[cfg]

    def compile_ptx(self, sig: Any, cc: tuple[int, int]) -> str:
        ptx, _ = cuda.compile_ptx(self.entry(), sig, cc=cc, **self.options)
        return ptx

    def entry(self) -> Callable[..., None]:
        """The GPU entry point: `grid_dependency_sync()`, then the body (see the module doc)."""
        if self._entry is not None:
            return self._entry
        from ninfer_nb.kernels.common.ptx import grid_dependency_sync

        body = cuda.jit(device=True, fastmath=self.options.get("fastmath", False))(self.fn)
        names = ", ".join(inspect.signature(self.fn).parameters)
        sync = "" if self.self_sync else "    _grid_dependency_sync()\n"
        src = f"def {self.name}({names}):\n{sync}    _body({names})\n"
        namespace: dict[str, Any] = {"_grid_dependency_sync": grid_dependency_sync, "_body": body}
        exec(compile(src, inspect.getfile(self.fn), "exec"), namespace)
        self._entry = namespace[self.name]
        return self._entry


def _allow_dynamic_smem(disp: Any, nbytes: int) -> None:
    """Opt every compiled overload in to more than 48 KB of dynamic shared memory. numba-cuda
    loads modules through cuLibrary*, so the handle is a CUkernel: cuKernelSetAttribute (the
    call numba itself uses for the shared-memory carveout), not cuFuncSetAttribute."""
    from numba.cuda.cudadrv.driver import binding, driver

    attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    for overload in disp.overloads.values():
        f = overload._codelibrary.get_cufunc()
        driver.cuKernelSetAttribute(attr, int(nbytes), f.handle, f.device.id)


def kernel(*sigs: Any, sim: bool = True, dynamic_smem: int = 0, self_sync: bool = False,
           **options: Any) -> Callable[[Callable[..., None]], KernelSpec]:
    def deco(fn: Callable[..., None]) -> KernelSpec:
        spec = KernelSpec(fn.__name__, fn, tuple(sigs), options, sim, dynamic_smem, self_sync)
        if spec.name in _SPECS:
            raise ValueError(f"duplicate kernel name {spec.name}")
        _SPECS[spec.name] = spec
        return spec

    return deco


def all_specs() -> dict[str, KernelSpec]:
    for m in MODULES:
        importlib.import_module(f"ninfer_nb.kernels.{m}")
    return dict(_SPECS)
