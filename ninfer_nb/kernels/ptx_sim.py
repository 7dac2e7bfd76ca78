"""CUDA-simulator stand-ins for the warp-level tensor-core intrinsics of ptx.py, so kernels built
on `mma_bf16` run (slowly) in the simulator and their fragment layouts are checked on the CPU.

Under NUMBA_ENABLE_CUDASIM=1, ptx.py binds `mma_bf16`, `pack_bf16x2` and `as_f32` to these.
The simulator runs a block's threads as Python threads; a warp-collective op is emulated by a
per-warp rendezvous: every lane deposits its fragment registers, waits for the other 31 lanes,
computes its own output registers from all of them (PTX ISA fragment layout of
mma.m16n8k16.row.col with bf16 inputs and fp32 accumulators), and waits again before the slot
is reused. All 32 lanes of a warp must make the call together (as on the GPU); a warp that
diverges around it deadlocks here, which on the GPU is undefined behaviour anyway.
Only 1-D thread blocks are supported. Knows nothing about the kernels that use it.
"""
from __future__ import annotations

import threading

import numpy as np

_LOCK = threading.Lock()
_WARPS: dict[tuple[int, int, int, int], "_WarpSlot"] = {}


class _WarpSlot:
    def __init__(self) -> None:
        self.barrier = threading.Barrier(32)
        self.a = np.zeros((32, 4), np.uint32)
        self.b = np.zeros((32, 2), np.uint32)


def _slot() -> tuple[_WarpSlot, int]:
    t = threading.current_thread()
    tid = int(t.threadIdx.x)                     # type: ignore[attr-defined]
    b = t.blockIdx                               # type: ignore[attr-defined]
    key = (int(b.x), int(b.y), int(b.z), tid // 32)
    with _LOCK:
        slot = _WARPS.get(key)
        if slot is None:
            slot = _WARPS[key] = _WarpSlot()
    return slot, tid % 32


def _lo_hi(words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """uint32 words of two bf16 -> (element in bits 15:0, element in bits 31:16) as fp32."""
    w = words.astype(np.uint32)
    lo = (w << np.uint32(16)).view(np.float32)
    hi = (w & np.uint32(0xFFFF0000)).view(np.float32)
    return lo, hi


def mma_bf16(a, b0, b1, c):
    """c += A (16x16) . B (16x8). Lane l = 4g + t holds A rows g / g+8, columns 2t, 2t+1 (+8);
    B column g, rows 2t, 2t+1 (+8); C rows g / g+8, columns 2t, 2t+1 (see ptx.mma_bf16)."""
    slot, lane = _slot()
    slot.a[lane] = [int(v) & 0xFFFFFFFF for v in a]
    slot.b[lane] = [int(b0) & 0xFFFFFFFF, int(b1) & 0xFFFFFFFF]
    slot.barrier.wait()
    amat = np.zeros((16, 16), np.float32)
    bmat = np.zeros((16, 8), np.float32)
    for ln in range(32):
        g, t = ln >> 2, ln & 3
        lo, hi = _lo_hi(slot.a[ln])
        amat[g, 2 * t], amat[g, 2 * t + 1] = lo[0], hi[0]
        amat[g + 8, 2 * t], amat[g + 8, 2 * t + 1] = lo[1], hi[1]
        amat[g, 2 * t + 8], amat[g, 2 * t + 9] = lo[2], hi[2]
        amat[g + 8, 2 * t + 8], amat[g + 8, 2 * t + 9] = lo[3], hi[3]
        blo, bhi = _lo_hi(slot.b[ln])
        bmat[2 * t, g], bmat[2 * t + 1, g] = blo[0], bhi[0]
        bmat[2 * t + 8, g], bmat[2 * t + 9, g] = blo[1], bhi[1]
    slot.barrier.wait()                          # every lane has read the deposits
    g, t = lane >> 2, lane & 3
    prod = amat.astype(np.float64) @ bmat.astype(np.float64)
    return (np.float32(c[0] + prod[g, 2 * t]), np.float32(c[1] + prod[g, 2 * t + 1]),
            np.float32(c[2] + prod[g + 8, 2 * t]), np.float32(c[3] + prod[g + 8, 2 * t + 1]))


def _bf16_bits(x) -> int:
    b = int(np.float32(x).view(np.uint32))
    if (b & 0x7FFFFFFF) > 0x7F800000:
        return (b >> 16) | 0x40
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF


def pack_bf16x2(hi, lo):
    """Two fp32 -> bf16x2 (round to nearest even): `hi` in bits 31:16, `lo` in bits 15:0."""
    return np.uint32((_bf16_bits(hi) << 16) | _bf16_bits(lo))


def as_f32(u):
    return np.uint32(int(u) & 0xFFFFFFFF).view(np.float32)
