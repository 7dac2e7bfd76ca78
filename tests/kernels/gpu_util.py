"""Helpers for the GPU kernel tests: one device arena per session, NaN-filled scratch."""
from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

BF16 = ml_dtypes.bfloat16


def stable_seed(*parts: object) -> int:
    """A seed from names (a test's id, a shape): the same in every run and process, unlike
    hash(), which Python salts per process, so a failing case replays."""
    import zlib

    return zlib.crc32("/".join(map(str, parts)).encode())


def default_arena_bytes() -> int:
    """GpuEnv's default arena: NINFER_TEST_ARENA_GIB GiB (24 unset), so a run of many xdist
    workers on one GPU can shrink the module-scoped arenas, which are never freed."""
    import os

    raw = os.environ.get("NINFER_TEST_ARENA_GIB", "").strip()
    gib = float(raw) if raw else 24.0
    if gib <= 0:
        raise ValueError(f"NINFER_TEST_ARENA_GIB must be > 0, got {raw!r}")
    return int(gib * (1 << 30))


class GpuEnv:
    def __init__(self, arena_bytes: int | None = None, scratch_bytes: int | None = None) -> None:
        """Defaults: default_arena_bytes(), a third of it scratch (24 GiB: 8, as before)."""
        from ninfer_nb.ops.cuda import CudaOps
        from ninfer_nb.runtime import device
        from ninfer_nb.runtime.arena import DeviceArena
        from ninfer_nb.runtime.stream import Stream

        if arena_bytes is None:
            arena_bytes = default_arena_bytes()
        if scratch_bytes is None:
            scratch_bytes = arena_bytes // 3 // 256 * 256
        info = device.select("cuda:0")
        self.arena = DeviceArena(arena_bytes)
        self.scratch = self.arena.carve(scratch_bytes)
        self.mark = self.arena.offset
        self.stream = Stream()
        # built for the device's architecture, as CudaBackend builds them: the default kernels
        # (on cc 9.0 the wgmma prefill GEMMs); a test of another kernel pins it (use_wgmma)
        self.ops = CudaOps(self.scratch, self.stream, persistent=self.arena,
                           arch=tuple(info.compute_capability), sm_count=info.multiprocessors)

    def fresh(self) -> Any:
        """Reset scratch + persistent allocations and fill the scratch with NaN sentinels."""
        from ninfer_nb.runtime._drv import check, driver

        self.stream.synchronize()
        self.scratch.reset()
        self.arena.offset = self.mark
        self.ops._router_counter = None         # it lived in the persistent arena just reset
        self.ops._gdn_buf = None                # the head GDN kernel's slot / arrival buffer, likewise
        self.ops._mma3_counter = None           # (gemv_mma3's arrival counters, likewise)
        check(driver().cuMemsetD32Async(self.scratch.base, 0x7FC00000, self.scratch.capacity // 4, self.stream.cu))
        return self.ops

    def graph_us(self, fn: Any, calls: int, pdl: bool = True, replays: int = 5) -> float:
        """us per call of whatever fn launches `calls` times (the probes: one call per layer of
        distinct weights), from a CUDA graph of fn (programmatic dependent launch on or off),
        best of `replays` replays after a warm-up; the scratch is reset before each capture."""
        from ninfer_nb.runtime.events import Timer
        from ninfer_nb.runtime.graph import CudaGraph

        def body() -> None:
            self.scratch.reset()
            fn()
        with self.ops.programmatic_launches(pdl):
            body()
            g = CudaGraph(self.stream)
            g.capture(body)
        g.replay()
        best = float("inf")
        for _ in range(replays):
            with Timer(self.stream) as t:
                g.replay()
            best = min(best, t.ms)
        g.close()
        return best * 1000.0 / calls

    def up(self, a: np.ndarray, dtype: Any = None) -> Any:
        return self.ops.from_numpy(a, dtype=dtype, persistent=True)

    def host(self, t: Any) -> np.ndarray:
        return self.ops.to_numpy(t)


def rnd(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(np.float32)


def rnd_bf16(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """Random bf16 values with |x| in [2^-7, 1) and random sign, built from random bits (fast)."""
    r = rng.integers(0, 1 << 16, size=shape, dtype=np.uint16)
    exp = (np.uint16(120) + (r >> np.uint16(7)) % np.uint16(7)).astype(np.uint16)
    bits = (r & np.uint16(0x807F)) | (exp << np.uint16(7))
    return bits.view(BF16)


def close(a: np.ndarray, b: np.ndarray, tol: float) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert np.isfinite(a).all(), f"{int((~np.isfinite(a)).sum())} non-finite outputs (NaN sentinel left?)"
    err = float(np.abs(a - b).max() / max(float(np.abs(b).max()), 1e-30))
    assert err <= tol, f"relative error {err:.3e} > {tol}"
    return err


class F32Experts:
    """Lazily widens one expert of a bf16 [E, ...] array to fp32 (for ops.cpu.moe_experts)."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a

    def __getitem__(self, e: Any) -> np.ndarray:
        return self.a[e].astype(np.float32)
