"""Shared pieces of the family case modules tests/kernels/test_cases_<family>.py (linear,
attention, gdn, moe, model): each case is written once against a `Device` (device.py) and runs
on small shapes under the CUDA simulator (tests/support/sim_runner.py) and on model shapes on the
GPU (`pytest -m gpu`), on tests/kernels/conftest.py's `dev` (one per process, shared with the
other family modules: under pytest-xdist no worker holds a second device arena for these).
SIM_ONLY / GPU_ONLY mark the cases that exist on one side only (kernel internals the simulator
alone can reach; timings and shapes too big for it)."""
from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from typing import Any, Callable, Iterator

import numpy as np
import pytest

from ninfer_nb.ops import cpu
from tests.kernels.device import SIM, Device
from tests.kernels.gpu_util import BF16, close

SIM_ONLY = pytest.mark.skipif(not SIM, reason="a simulator case (kernel internals, patched constants)")
GPU_ONLY = pytest.mark.skipif(SIM, reason="a GPU case (model shapes or timings)")
TOL32 = 1e-5
# fp32 kernels vs NumPy: the simulator runs the kernels' arithmetic in NumPy (1e-5); the GPU's
# fused multiply-adds and fast exp / reduction orders leave up to ~1e-5 more (1e-4)
TOL_F32 = TOL32 if SIM else TOL32 * 10
TOL_TF32 = 3e-3                 # TF32 products (kernels/gdn/gdn_*_mma.py): 10 mantissa bits


def launched(ops: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the kernels ops launches from now on (which path the dispatcher took)."""
    names: list[str] = []
    go = ops._go

    def rec(spec: Any, *a: Any, **kw: Any) -> None:
        names.append(spec.name)
        go(spec, *a, **kw)

    monkeypatch.setattr(ops, "_go", rec)
    return names


def choose(ops: Any, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> None:
    """Pin kernel choices for this case only (the GPU device's ops outlive the case)."""
    monkeypatch.setattr(ops, "choices", replace(ops.choices, **kw))


@contextlib.contextmanager
def prefill_kind(ops: Any, kind: str | None) -> Iterator[None]:
    saved = ops.choices
    if kind is not None:
        ops.choices = replace(saved, prefill_attention=kind)
    try:
        yield
    finally:
        ops.choices = saved


def wall_time(dev: Device, fn: Callable[[], Any], reps: int = 3) -> float:
    """Best synchronised wall time of fn over `reps` calls (GPU; 0 in the simulator, fn not run)."""
    if not dev.on_gpu:
        return 0.0
    stream = dev.env.stream          # type: ignore[attr-defined]
    best = float("inf")
    for _ in range(reps):
        stream.synchronize()
        t0 = time.perf_counter()
        fn()
        stream.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def bf16r(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(BF16).astype(np.float32)


def check_attention(o: np.ndarray, q: np.ndarray, kf: np.ndarray, vf: np.ndarray, pos: np.ndarray, scale: float,
                    kind: str) -> float:
    """SIMT kernels: fp32 throughout (TOL_F32). The GEMM and flash paths and the tensor-core decode
    kernel (bf16 caches): bf16 Q, K, V and P, so against the reference on bf16-rounded q, k, v;
    P's rounding leaves ~4e-3 (1e-2 allowed)."""
    if kind in ("gemm", "flash", "decode_mma"):
        return close(o, cpu.attention(bf16r(q), bf16r(kf), bf16r(vf), pos, scale), 1e-2)
    return close(o, cpu.attention(q, kf, vf, pos, scale), TOL_F32)


def one_token(ops: Any, mode: str, ways: int, blocks: int, X: Any, NW: Any, W: Any, bias: Any, out: Any,
              has_bias: bool, warps: int) -> None:
    """Launch one build of kernels/linear/linear.py gemv_one_token (as ops._one_token does, any build)."""
    from ninfer_nb.kernels.linear import linear as K_lin

    n, k = W.shape
    pairs = n // 2 if mode == "swiglu" else (n + 1) // 2
    per_block = warps // ways
    ops._go(K_lin.gemv_one_token(mode, ways, blocks, warps), (pairs + per_block - 1) // per_block,
            32 * warps, X, NW, np.float32(1e-6), W, bias, out, np.int32(has_bias))


def gpu_only(values: list[Any]) -> list[Any]:
    """The parameter sets of a GPU_ONLY case; in the simulator one placeholder set (id
    "gpu-only"), so its process collects one skipped item per case instead of one per GPU
    shape (tests/support/sim_runner.py deals the collected ids to its processes by name)."""
    if not SIM:
        return values
    arity = len(values[0]) if isinstance(values[0], tuple) else 1
    return [pytest.param(*([None] * arity), id="gpu-only")]
