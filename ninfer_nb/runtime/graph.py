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
        try:
            result = fn()
        except BaseException:
            # fn failed (e.g. the scratch arena is full): end the capture so the stream takes
            # work again, and drop the partial graph (nothing of it ran)
            err, graph = drv.cuStreamEndCapture(self.stream.cu)
            if err == drv.CUresult.CUDA_SUCCESS and graph is not None:
                drv.cuGraphDestroy(graph)
            raise
        err, graph = drv.cuStreamEndCapture(self.stream.cu)
        failed = err != drv.CUresult.CUDA_SUCCESS
        if failed:
            raise RuntimeError(f"stream capture failed: {err}")
        self._graph = graph
        self._exec = check(drv.cuGraphInstantiate(graph, 0))
        return result

    def edge_counts(self) -> dict[str, int]:
        """{"default": n, "programmatic": m}: the captured graph's dependency edges by type
        (programmatic ones come from launches with programmatic dependent launch)."""
        drv = driver()
        _, _, _, n = check(drv.cuGraphGetEdges(self._graph, 0))
        counts = {"default": 0, "programmatic": 0}
        if n:
            _, _, data, _ = check(drv.cuGraphGetEdges(self._graph, n))
            programmatic = int(drv.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC)
            for d in data:
                counts["programmatic" if int(d.type) == programmatic else "default"] += 1
        return counts

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


def time_in_graph(stream: Stream, fn: Callable[[], Any], scope: Callable[[], Any],
                  repeat: int = 8, replays: int = 4) -> tuple[float, Any]:
    """(GPU seconds per call of `fn`, its last result), without Python launch gaps: `fn` is
    captured `repeat` times back to back in one graph (inside `scope()` but the last, so the
    repeats' scratch shares addresses), the graph is replayed once to warm up and then
    `replays` times between two events. A graph launch's own cost (a few microseconds) is
    spread over the repeats. `fn` must already have run once eagerly (kernels compiled: a
    capture cannot load modules). In-place ops update their state `repeat` times per replay."""
    from ninfer_nb.runtime.events import Event

    def repeated() -> Any:
        for _ in range(repeat - 1):
            with scope():
                fn()
        return fn()

    graph = CudaGraph(stream)
    try:
        out = graph.capture(repeated)
        graph.replay()
        e0 = Event().record(stream)
        for _ in range(replays):
            graph.replay()
        e1 = Event().record(stream)
        return e0.elapsed_ms(e1) / (1e3 * replays * repeat), out
    finally:
        graph.close()
