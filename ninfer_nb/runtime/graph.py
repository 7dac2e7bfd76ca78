"""CUDA graph capture and replay on the engine stream (cuda.bindings driver calls only).

`CudaGraph.capture(fn)` runs `fn()` with the engine stream in capture mode (numba launches go
to `cuda.external_stream` of the same handle); capture is ended in `finally`, also when a
launch raises. `replay()` is one `cuGraphLaunch` (about 2 µs host time; never cuda.core
Graph.launch on the hot path). Graphs bake in pointers and scalars: buffers must come from
arenas with stable addresses and per-step inputs must live in device memory.
"""
from __future__ import annotations

from typing import Any, Callable

from ninfer_nb.runtime._drv import check, driver
from ninfer_nb.runtime.stream import Stream


class CudaGraph:
    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self._graph: Any = None
        self._exec: Any = None

    @property
    def ready(self) -> bool:
        return self._exec is not None

    def capture(self, fn: Callable[[], Any]) -> Any:
        """Capture every launch `fn` makes on the engine stream; returns fn's result."""
        drv = driver()
        self.close()
        mode = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
        check(drv.cuStreamBeginCapture(self.stream.cu, mode))
        graph = None
        try:
            result = fn()
        finally:
            err, graph = drv.cuStreamEndCapture(self.stream.cu)
            failed = err != drv.CUresult.CUDA_SUCCESS
        if failed:
            raise RuntimeError(f"stream capture failed: {err}")
        self._graph = graph
        self._exec = check(drv.cuGraphInstantiate(graph, 0))
        return result

    def replay(self) -> None:
        check(driver().cuGraphLaunch(self._exec, self.stream.cu))

    def close(self) -> None:
        drv = driver()
        if self._exec is not None:
            drv.cuGraphExecDestroy(self._exec)
            self._exec = None
        if self._graph is not None:
            drv.cuGraphDestroy(self._graph)
            self._graph = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
