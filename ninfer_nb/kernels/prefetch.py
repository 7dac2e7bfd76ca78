"""L2 prefetch of weights: ask the L2 to fetch a byte range of a weight ahead of the kernel that
streams it, so that HBM keeps working while a latency-bound kernel (decode attention, the GDN
middle, the MoE router) runs in between. cc >= 9.0 (`cp.async.bulk.prefetch.L2`); a launch that
does nothing below. Knows nothing of which weight comes next: the caller names it.

`l2_prefetch_kernel`: grid G, PREFETCH_THREADS threads; the range is cut into PIECE-byte pieces,
piece p issued by thread p // G of block p % G (spread over the SMs' copy engines). The kernel
waits for the previous kernel like any other (the registry's entry), so the prefetch starts when
that kernel's memory traffic ends and the stream order stays transitive for the next kernel.
`l2_prefetch_early_kernel` issues its pieces before that wait (while the previous kernel runs).
"""
from __future__ import annotations

from numba import cuda

from ninfer_nb.kernels.nbtypes import i64, u16_2
from ninfer_nb.kernels.ptx import gptr, grid_dependency_sync, prefetch_l2_bulk
from ninfer_nb.kernels.registry import kernel

PIECE = 1 << 16           # bytes per bulk prefetch instruction
PREFETCH_THREADS = 32


@cuda.jit(device=True, inline=True)
def _issue(w, byte0, nbytes):
    base = gptr(w) + byte0
    n_pieces = (nbytes + PIECE - 1) // PIECE
    g = cuda.gridDim.x
    p = cuda.threadIdx.x * g + cuda.blockIdx.x
    while p < n_pieces:
        off = p * PIECE
        prefetch_l2_bulk(base + off, min(PIECE, nbytes - off))
        p += g * cuda.blockDim.x


@kernel((u16_2, i64, i64), sim=False)
def l2_prefetch_kernel(w, byte0, nbytes):
    """Prefetch bytes [byte0, byte0 + nbytes) of w (16-byte aligned, nbytes % 16 == 0) into L2."""
    _issue(w, byte0, nbytes)


@kernel((u16_2, i64, i64), sim=False, self_sync=True)
def l2_prefetch_early_kernel(w, byte0, nbytes):
    """l2_prefetch_kernel issued before waiting for the previous kernel."""
    _issue(w, byte0, nbytes)
    grid_dependency_sync()
