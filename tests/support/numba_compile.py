"""numba-cuda's compiler, made cheaper for the compile-only tests (PTX, ptxas, launch ABI):

- Inlining: most of a kernel's compile time goes to inlining its `inline="always"` helpers, and
  half of that to `InlineWorker.inline_ir`'s `copy_ir`, which deep-copies the callee's blocks one
  at a time: each block's copy drags along its own copy of the scope, that is of every variable
  of the callee. Here the block copies of one `copy_ir` share one memo, so the scope is copied
  once and all copied blocks refer to it (as the callee's blocks referred to one scope). The PTX
  is the same for every registered kernel (up to the order of declarations and numba's symbol
  counters); all kernels' compiles take ~15 % less CPU time, the attention and GDN decode
  kernels ~45 %.
- One compile per (function, signature, target, options) and process: test_compile_ptx and
  test_ptxas both ask for a kernel's sm_90a PTX (in one xdist worker: tests/conftest.py's
  kernel groups), the second gets the first's result.
"""
from __future__ import annotations

import copy
from typing import Any


class _SharedMemo:
    """Stands in for the `copy` module inside one `inline_ir` call: its deepcopy() calls share
    one memo. inline_ir makes two copies (of the callee, then of that copy) and deep-copies
    nothing else, so no object is copied twice."""

    def __init__(self) -> None:
        self.memo: dict[int, Any] = {}

    def deepcopy(self, x: Any, memo: dict[int, Any] | None = None) -> Any:
        return copy.deepcopy(x, self.memo if memo is None else memo)

    def __getattr__(self, name: str) -> Any:
        return getattr(copy, name)


def install() -> None:
    _share_inline_copies()
    _one_compile_per_request()


def _share_inline_copies() -> None:
    import numba.cuda.core.inline_closurecall as icc

    worker = icc.InlineWorker
    if getattr(worker.inline_ir, "_shared_memo", False):
        return
    inline_ir = worker.inline_ir

    def shared_memo_inline_ir(self: Any, *args: Any, **kwargs: Any) -> Any:
        saved = icc.copy
        icc.copy = _SharedMemo()
        try:
            return inline_ir(self, *args, **kwargs)
        finally:
            icc.copy = saved

    shared_memo_inline_ir._shared_memo = True          # type: ignore[attr-defined]
    worker.inline_ir = shared_memo_inline_ir


def _one_compile_per_request() -> None:
    from numba import cuda

    if getattr(cuda.compile_ptx, "_memo", None) is not None:
        return
    compile_ptx = cuda.compile_ptx
    memo: dict[tuple[Any, ...], Any] = {}

    def memo_compile_ptx(pyfunc: Any, sig: Any, **kwargs: Any) -> Any:
        key = (pyfunc, str(sig), repr(sorted(kwargs.items())))
        if key not in memo:
            memo[key] = compile_ptx(pyfunc, sig, **kwargs)
        return memo[key]

    memo_compile_ptx._memo = memo                       # type: ignore[attr-defined]
    cuda.compile_ptx = memo_compile_ptx
