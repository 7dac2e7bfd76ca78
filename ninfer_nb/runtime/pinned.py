"""Pinned (page-locked) host staging for host -> device uploads (cuMemHostAlloc).

`PinnedStaging.upload` copies a NumPy array into a device Tensor in chunks through one pinned
buffer (50+ GB/s instead of 6-8 GB/s from pageable memory). Knows nothing about weights.
"""
from __future__ import annotations

import ctypes

import numpy as np

from ninfer_nb.runtime._drv import check, driver
from ninfer_nb.runtime.stream import Stream
from ninfer_nb.runtime.tensor import Tensor


class PinnedBuffer:
    def __init__(self, nbytes: int) -> None:
        self.nbytes = int(nbytes)
        self.ptr = int(check(driver().cuMemHostAlloc(self.nbytes, 0)))

    def array(self, nbytes: int | None = None) -> np.ndarray:
        """uint8 view of the first nbytes of the buffer."""
        n = self.nbytes if nbytes is None else int(nbytes)
        return np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(self.ptr))

    def close(self) -> None:
        if self.ptr:
            check(driver().cuMemFreeHost(self.ptr))
            self.ptr = 0

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


class PinnedStaging:
    """Chunked uploads through one pinned buffer (default 64 MiB)."""

    def __init__(self, nbytes: int = 64 << 20) -> None:
        self.buf = PinnedBuffer(nbytes)

    def upload(self, dst: Tensor, src: np.ndarray, stream: Stream) -> None:
        a = np.ascontiguousarray(src, dtype=dst.dtype)
        if a.nbytes != dst.nbytes:
            raise ValueError(f"size mismatch: {a.nbytes} B into {dst.nbytes} B")
        flat = a.reshape(-1).view(np.uint8)
        host = self.buf.array()
        drv = driver()
        step = self.buf.nbytes
        for off in range(0, flat.size, step):
            n = min(step, flat.size - off)
            host[:n] = flat[off : off + n]
            check(drv.cuMemcpyHtoDAsync(dst.ptr + off, self.buf.ptr, n, stream.cu))
            stream.synchronize()  # the staging buffer is reused by the next chunk

    def close(self) -> None:
        self.buf.close()
