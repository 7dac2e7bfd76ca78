"""Where a kernel test body runs: the CUDA simulator (CI, tiny shapes; NUMBA_ENABLE_CUDASIM=1 in
the subprocesses of tests/support/sim_runner.py) or the GPU (`pytest -m gpu`, real shapes).

A family test module (tests/kernels/test_<family>.py) writes each case once against `Device`
(fresh ops, upload, download, timing) and picks its shapes with `shapes(sim=..., gpu=...)`;
`pytestmark = DEVICE_MARKS` makes its cases GPU tests outside the simulator. The `dev` fixture
(tests/kernels/conftest.py) hands out the device of the process.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Protocol

import numpy as np
import pytest
from numba import config

SIM = bool(config.ENABLE_CUDASIM)
DEVICE_MARKS = [] if SIM else [pytest.mark.gpu]


def shapes(*, sim: list[Any], gpu: list[Any]) -> list[Any]:
    """The parameter sets of this process: small ones in the simulator, real ones on the GPU."""
    return sim if SIM else gpu


class Device(Protocol):
    on_gpu: bool
    ops: Any

    def fresh(self) -> Any:
        """The ops object with its scratch reset and filled with NaN (unwritten outputs fail)."""
        ...

    def up(self, a: np.ndarray, dtype: Any = None) -> Any:
        """A device copy of a host array (a copy, so in-place ops leave `a` alone)."""
        ...

    def host(self, t: Any) -> np.ndarray:
        ...

    def best_time(self, fn: Callable[[], Any], reps: int = 3, graph: bool = False) -> tuple[float, Any]:
        """(seconds per call, the last output); the simulator runs fn once and reports 0."""
        ...


class SimDevice:
    """CudaOps over NumPy arrays under the CUDA simulator."""

    on_gpu = False

    def __init__(self) -> None:
        self.ops: Any = None

    def fresh(self) -> Any:
        from ninfer_nb.ops.cuda import CudaOps
        from tests.support.cuda_helpers import HostArena, SimStream

        self.ops = CudaOps(HostArena(), SimStream(), persistent=HostArena())   # NaN-filled scratch
        return self.ops

    def up(self, a: np.ndarray, dtype: Any = None) -> Any:
        return np.array(a if dtype is None else np.asarray(a).astype(dtype))

    def host(self, t: Any) -> np.ndarray:
        return np.asarray(t)

    def best_time(self, fn: Callable[[], Any], reps: int = 3, graph: bool = False) -> tuple[float, Any]:
        return 0.0, fn()


class GpuDevice:
    """CudaOps on GPU 0 through tests/kernels/gpu_util.py's GpuEnv: one arena for the session,
    smaller than the per-module ones (arenas are not freed before the process ends)."""

    on_gpu = True

    def __init__(self) -> None:
        from tests.kernels.gpu_util import GpuEnv

        self.env = GpuEnv(arena_bytes=8 << 30, scratch_bytes=4 << 30)
        self.ops = self.env.ops

    def fresh(self) -> Any:
        return self.env.fresh()

    def up(self, a: np.ndarray, dtype: Any = None) -> Any:
        return self.env.up(a, dtype)

    def host(self, t: Any) -> np.ndarray:
        return self.env.host(t)

    def best_time(self, fn: Callable[[], Any], reps: int = 3, graph: bool = False) -> tuple[float, Any]:
        """graph=False: the best synchronised wall time of `reps` calls after a warm-up (ms-scale
        prefill ops); graph=True: GPU time per call from a graph of 8 calls (decode kernels)."""
        from ninfer_nb.runtime.graph import time_in_graph

        fn()                                                    # warm-up (compiles)
        if graph:
            return time_in_graph(self.env.stream, fn, self.ops.scope, repeat=8, replays=reps)
        best, out = float("inf"), None
        for _ in range(reps):
            self.env.stream.synchronize()
            t0 = time.perf_counter()
            out = fn()
            self.env.stream.synchronize()
            best = min(best, time.perf_counter() - t0)
        return best, out


def make_device() -> Device:
    return SimDevice() if SIM else GpuDevice()
