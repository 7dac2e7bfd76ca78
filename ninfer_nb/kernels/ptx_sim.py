"""CUDA-simulator stand-ins for the warp-level tensor-core intrinsics of ptx.py, so kernels built
on `mma_bf16` run (slowly) in the simulator and their fragment layouts are checked on the CPU.

Under NUMBA_ENABLE_CUDASIM=1, ptx.py binds `mma_bf16`, `mma_tf32`, `tf32`, `pack_bf16x2`,
`as_f32` and the 16-byte loads to these.
The simulator runs a block's threads as Python threads; a warp-collective op is emulated by a
per-warp rendezvous: every lane deposits its fragment registers, waits for the other 31 lanes,
computes its own output registers from all of them (PTX ISA fragment layouts of
mma.m16n8k16.row.col with bf16 inputs and of mma.m16n8k8.row.col with tf32 inputs, fp32
accumulators), and waits again before the slot
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


def _tf32_values(words: np.ndarray) -> np.ndarray:
    return (words.astype(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


def mma_tf32(a, b0, b1, c):
    """c += A (16x8) . B (8x8), tf32 operands (fp32 values, top 19 bits used). Lane l = 4g + t holds A (g, t), (g+8, t),
    (g, t+4), (g+8, t+4); B rows t, t+4 of column g; C rows g / g+8, columns 2t, 2t+1."""
    slot, lane = _slot()
    slot.a[lane] = np.array(a, np.float32).view(np.uint32)
    slot.b[lane] = np.array([b0, b1], np.float32).view(np.uint32)
    slot.barrier.wait()
    amat = np.zeros((16, 8), np.float32)
    bmat = np.zeros((8, 8), np.float32)
    for ln in range(32):
        g, t = ln >> 2, ln & 3
        av = _tf32_values(slot.a[ln])
        amat[g, t], amat[g + 8, t], amat[g, t + 4], amat[g + 8, t + 4] = av
        bv = _tf32_values(slot.b[ln])
        bmat[t, g], bmat[t + 4, g] = bv
    slot.barrier.wait()                          # every lane has read the deposits
    g, t = lane >> 2, lane & 3
    prod = amat.astype(np.float64) @ bmat.astype(np.float64)
    return (np.float32(c[0] + prod[g, 2 * t]), np.float32(c[1] + prod[g, 2 * t + 1]),
            np.float32(c[2] + prod[g + 8, 2 * t]), np.float32(c[3] + prod[g + 8, 2 * t + 1]))


def tf32(x) -> np.float32:
    """cvt.rna.tf32.f32: round to 10 mantissa bits, ties away from zero, as fp32."""
    b = int(np.float32(x).view(np.uint32))
    if (b & 0x7F800000) == 0x7F800000:
        return np.float32(x)
    return np.uint32(((b + 0x1000) & 0xFFFFE000) & 0xFFFFFFFF).view(np.float32)


def load(arr, idx):
    """ldg_f32: arr.flat[idx]."""
    return arr.reshape(-1)[int(idx)]


def load_v4(arr, idx):
    """ldg_v4_f32 / lds_v4_f32: arr.flat[idx .. idx + 3]."""
    flat = arr.reshape(-1)
    i = int(idx)
    return (flat[i], flat[i + 1], flat[i + 2], flat[i + 3])


def store_v4(arr, idx, v0, v1, v2, v3) -> None:
    """st_v4_f32: arr.flat[idx .. idx + 3] = v0 .. v3."""
    flat = arr.reshape(-1)
    i = int(idx)
    flat[i], flat[i + 1], flat[i + 2], flat[i + 3] = v0, v1, v2, v3


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
