"""CUDA-simulator stand-ins for the warp-level tensor-core intrinsics of ptx.py, so kernels built
on `mma_bf16` run (slowly) in the simulator and their fragment layouts are checked on the CPU.

Under NUMBA_ENABLE_CUDASIM=1, ptx.py binds `mma_bf16`, `mma_tf32`, `tf32`, `pack_bf16x2`,
`as_f32`, `ex2`, `shfl_xor`, `shfl_idx`, the 16-byte and 4-byte loads, `fma_bf16x2`,
`f16x2_to_f32`, `ldsm_x4`, the cp.async copies,
and `grid_dependency_sync` to these. Shared and global
addresses (`smem_u32`, `gptr`) are the host addresses of the simulator's NumPy buffers, so a
kernel's byte arithmetic on them is unchanged and `cp_async16` / `ldsm_x4` read and write
through them (the copy is done at once: commit and wait are no-ops).
The simulator runs a block's threads as Python threads; a warp-collective op is emulated by a
per-warp rendezvous: every lane deposits its fragment registers, waits for the other 31 lanes,
computes its own output registers from all of them (PTX ISA fragment layouts of
mma.m16n8k16.row.col with bf16 inputs and of mma.m16n8k8.row.col with tf32 inputs, fp32
accumulators). Deposits alternate between two buffers per warp, so one barrier per op is
enough: a lane can be at most one op ahead of the slowest (it waits for it at the next
barrier), so it never overwrites a buffer another lane still reads. All 32 lanes of a warp must make the call together (as on the GPU); a warp that
diverges around it deadlocks here, which on the GPU is undefined behaviour anyway.
Only 1-D thread blocks are supported. Knows nothing about the kernels that use it.
"""
from __future__ import annotations

import ctypes
import threading

import numpy as np

_LOCK = threading.Lock()
_WARPS: dict[tuple[int, int, int, int], "_WarpSlot"] = {}


class _Deposits:
    """What the 32 lanes of a warp hand in for one collective op."""

    def __init__(self) -> None:
        self.a = np.zeros((32, 4), np.uint32)
        self.b = np.zeros((32, 2), np.uint32)
        self.addr = [0] * 32
        self.vals: list = [None] * 32


class _WarpSlot:
    def __init__(self) -> None:
        self.barrier = threading.Barrier(32)
        self.buffers = (_Deposits(), _Deposits())
        self.phase = [0] * 32                    # each lane's next buffer


def _slot() -> tuple[_Deposits, threading.Barrier, int]:
    """This lane's deposit buffer for its next collective op, the warp's barrier, the lane."""
    t = threading.current_thread()
    tid = int(t.threadIdx.x)                     # type: ignore[attr-defined]
    b = t.blockIdx                               # type: ignore[attr-defined]
    key = (int(b.x), int(b.y), int(b.z), tid // 32)
    with _LOCK:
        slot = _WARPS.get(key)
        if slot is None:
            slot = _WARPS[key] = _WarpSlot()
    lane = tid % 32
    buf = slot.buffers[slot.phase[lane]]
    slot.phase[lane] ^= 1
    return buf, slot.barrier, lane


def _lo_hi(words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """uint32 words of two bf16 -> (element in bits 15:0, element in bits 31:16) as fp32."""
    w = words.astype(np.uint32)
    lo = (w << np.uint32(16)).view(np.float32)
    hi = (w & np.uint32(0xFFFF0000)).view(np.float32)
    return lo, hi


# where each lane's fragment registers sit in the 16x16 A and 16x8 B matrices (m16n8k16):
# register j of lane l = 4g + t holds the pair (row, col), (row, col + 1) of A, and B's
# (col, g), (col + 1, g) with col = 2t (+8)
_G = np.arange(32) >> 2
_T = np.arange(32) & 3
_A_ROW = np.stack([_G, _G + 8, _G, _G + 8], axis=1)              # [32 lanes, 4 registers]
_A_COL = np.stack([2 * _T, 2 * _T, 2 * _T + 8, 2 * _T + 8], axis=1)
_B_ROW = np.stack([2 * _T, 2 * _T + 8], axis=1)                  # [32 lanes, 2 registers]
_B_COL = np.stack([_G, _G], axis=1)


def mma_bf16(a, b0, b1, c):
    """c += A (16x16) . B (16x8). Lane l = 4g + t holds A rows g / g+8, columns 2t, 2t+1 (+8);
    B column g, rows 2t, 2t+1 (+8); C rows g / g+8, columns 2t, 2t+1 (see ptx.mma_bf16)."""
    dep, barrier, lane = _slot()
    dep.a[lane] = [int(v) & 0xFFFFFFFF for v in a]
    dep.b[lane] = [int(b0) & 0xFFFFFFFF, int(b1) & 0xFFFFFFFF]
    barrier.wait()
    amat = np.zeros((16, 16), np.float64)
    bmat = np.zeros((16, 8), np.float64)
    lo, hi = _lo_hi(dep.a)
    amat[_A_ROW, _A_COL], amat[_A_ROW, _A_COL + 1] = lo, hi
    blo, bhi = _lo_hi(dep.b)
    bmat[_B_ROW, _B_COL], bmat[_B_ROW + 1, _B_COL] = blo, bhi
    g, t = lane >> 2, lane & 3
    r = amat[[g, g + 8]] @ bmat[:, 2 * t : 2 * t + 2]          # [2 rows, 2 cols]
    return (np.float32(c[0] + r[0, 0]), np.float32(c[1] + r[0, 1]),
            np.float32(c[2] + r[1, 0]), np.float32(c[3] + r[1, 1]))


# m16n8k8 tf32: register j of lane l = 4g + t holds A (g, t), (g+8, t), (g, t+4), (g+8, t+4)
# and B (t, g), (t+4, g)
_TF_A_ROW = np.stack([_G, _G + 8, _G, _G + 8], axis=1)
_TF_A_COL = np.stack([_T, _T, _T + 4, _T + 4], axis=1)
_TF_B_ROW = np.stack([_T, _T + 4], axis=1)
_TF_B_COL = np.stack([_G, _G], axis=1)


def _tf32_values(words: np.ndarray) -> np.ndarray:
    return (words.astype(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


def mma_tf32(a, b0, b1, c):
    """c += A (16x8) . B (8x8), tf32 operands (fp32 values, top 19 bits used). Lane l = 4g + t holds A (g, t), (g+8, t),
    (g, t+4), (g+8, t+4); B rows t, t+4 of column g; C rows g / g+8, columns 2t, 2t+1."""
    dep, barrier, lane = _slot()
    dep.a[lane] = np.array(a, np.float32).view(np.uint32)
    dep.b[lane] = np.array([b0, b1], np.float32).view(np.uint32)
    barrier.wait()
    amat = np.zeros((16, 8), np.float32)
    bmat = np.zeros((8, 8), np.float32)
    amat[_TF_A_ROW, _TF_A_COL] = _tf32_values(dep.a)
    bmat[_TF_B_ROW, _TF_B_COL] = _tf32_values(dep.b)
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


def ex2(x) -> np.float32:
    """ex2.approx.ftz.f32 (here exact to fp32 rounding)."""
    return np.float32(np.exp2(np.float32(x)))


def load(arr, idx):
    """ldg_f32: arr.flat[idx]."""
    return arr.reshape(-1)[int(idx)]


def load_v4(arr, idx):
    """ldg_v4_f32 / lds_v4_f32: the 16 bytes at arr.flat[idx] as four float32 (for a float32
    array arr.flat[idx .. idx + 3]; for a uint16 one, eight elements' bits)."""
    flat = arr.reshape(-1)
    i = int(idx)
    if flat.dtype.itemsize == 4:
        return (flat[i], flat[i + 1], flat[i + 2], flat[i + 3])
    words = np.frombuffer(flat[i:i + 16 // flat.dtype.itemsize].tobytes(), np.float32)
    return tuple(np.float32(w) for w in words)


def load_v4_u32(arr, idx):
    """ldg_stream_v4_u32: the 16 bytes at arr.flat[idx] as four uint32 words."""
    flat = arr.reshape(-1)
    i = int(idx)
    words = np.frombuffer(flat[i:i + 16 // flat.dtype.itemsize].tobytes(), np.uint32)
    return tuple(np.uint32(w) for w in words)


def load_u32(arr, idx):
    """ldg_stream_u32: the 4 bytes at arr.flat[idx] as a uint32 word."""
    flat = arr.reshape(-1)
    i = int(idx)
    return np.frombuffer(flat[i:i + max(1, 4 // flat.dtype.itemsize)].tobytes()[:4], np.uint32)[0]


def store_v4_u32(arr, idx, v0, v1, v2, v3) -> None:
    """st_v4_u32: the 16 bytes at arr.flat[idx] = four uint32 words."""
    flat = arr.reshape(-1)
    i = int(idx)
    n = 16 // flat.dtype.itemsize
    flat[i:i + n] = np.array([v0, v1, v2, v3], np.uint32).view(flat.dtype)


def _bf16_pair(u) -> np.ndarray:
    w = int(u) & 0xFFFFFFFF
    return np.array([(w & 0xFFFF) << 16, w & 0xFFFF0000], np.uint32).view(np.float32).astype(np.float64)


def fma_bf16x2(a, b, c):
    """fma.rn.bf16x2: a * b + c per bf16 lane, rounded once (to nearest even)."""
    r = _bf16_pair(a) * _bf16_pair(b) + _bf16_pair(c)
    return np.uint32((_bf16_bits(np.float32(r[1])) << 16) | _bf16_bits(np.float32(r[0])))


def f16x2_to_f32(u):
    """The two float16 halves of a word as float32 (low half first)."""
    h = np.array([int(u) & 0xFFFF, (int(u) >> 16) & 0xFFFF], np.uint16).view(np.float16)
    return np.float32(h[0]), np.float32(h[1])


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


def _host_array(arr) -> np.ndarray:
    """The NumPy buffer behind a simulator kernel argument (or a shared / local array)."""
    item = getattr(arr, "__dict__", {}).get("_item", arr)       # FakeWithinKernelCUDAArray
    ary = getattr(item, "_ary", item)                           # FakeCUDAArray
    assert isinstance(ary, np.ndarray) and ary.flags.c_contiguous, type(ary)
    return ary


def smem_u32(arr) -> int:
    """Shared-window address of element 0: here the host address of the buffer."""
    return _host_array(arr).ctypes.data


def gptr(arr) -> int:
    """Device address of element 0: here the host address of the buffer."""
    return _host_array(arr).ctypes.data


def cp_async16(saddr, gaddr) -> None:
    """cp.async 16 bytes global -> shared, done at once."""
    ctypes.memmove(int(saddr), int(gaddr), 16)


def cp_async_noop() -> None:
    """cp.async.commit_group / wait_group: the copies already happened."""


def grid_dependency_sync() -> None:
    """griddepcontrol.wait / launch_dependents: the simulator runs launches one after another."""


def ldsm_x4(saddr):
    """ldmatrix.x4: lanes 8i..8i+7 give the row addresses (8 b16 each) of matrix i; lane l
    receives, from each matrix, row l // 4, elements 2 (l % 4) and 2 (l % 4) + 1."""
    dep, barrier, lane = _slot()
    dep.addr[lane] = int(saddr)
    barrier.wait()
    row = lane >> 2
    words = [np.frombuffer(ctypes.string_at(dep.addr[8 * i + row], 16), np.uint32)[lane & 3]
             for i in range(4)]
    return tuple(np.uint32(w) for w in words)


def shfl_idx(v, src_lane):
    """shfl.sync.idx with a full mask: lane l gets lane src_lane's v."""
    dep, barrier, lane = _slot()
    dep.vals[lane] = v
    barrier.wait()
    return dep.vals[int(src_lane) & 31]


def shfl_xor(v, lane_mask):
    """shfl.sync.bfly with a full mask: lane l gets lane (l ^ lane_mask)'s v."""
    dep, barrier, lane = _slot()
    dep.vals[lane] = v
    barrier.wait()
    return dep.vals[lane ^ int(lane_mask)]
