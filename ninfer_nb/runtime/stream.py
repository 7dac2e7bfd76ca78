"""The engine stream: one cuda.core Stream plus its numba wrapper (`cuda.external_stream`).

Kernels launch on `Stream.numba`; copies, events and graph capture use `Stream.handle`.
Knows nothing about kernels or graphs.
"""
from __future__ import annotations

from typing import Any

from ninfer_nb.runtime._drv import check, driver


class Stream:
    """A non-blocking stream owned by the engine. `handle` is the raw CUstream as int."""

    def __init__(self) -> None:
        from cuda.core import Device, StreamOptions
        from numba import cuda

        self._core = Device().create_stream(options=StreamOptions(nonblocking=True))
        self.handle: int = int(self._core.handle)
        self.numba: Any = cuda.external_stream(self.handle)

    @property
    def cu(self) -> Any:
        """The handle as a cuda.bindings CUstream (for driver calls)."""
        return driver().CUstream(self.handle)

    def synchronize(self) -> None:
        check(driver().cuStreamSynchronize(self.cu))

    def close(self) -> None:
        self._core.close()
