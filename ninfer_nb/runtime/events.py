"""CUDA events for GPU-side timing on a stream (`cuEventRecord` / `cuEventElapsedTime`)."""
from __future__ import annotations

from ninfer_nb.runtime._drv import check, driver
from ninfer_nb.runtime.stream import Stream


class Event:
    def __init__(self, timing: bool = True) -> None:
        drv = driver()
        flags = drv.CUevent_flags.CU_EVENT_DEFAULT if timing else drv.CUevent_flags.CU_EVENT_DISABLE_TIMING
        self._ev = check(drv.cuEventCreate(flags))

    def record(self, stream: Stream) -> "Event":
        check(driver().cuEventRecord(self._ev, stream.cu))
        return self

    def synchronize(self) -> None:
        check(driver().cuEventSynchronize(self._ev))

    def elapsed_ms(self, end: "Event") -> float:
        """Milliseconds from this event to `end` (both recorded; waits for `end`)."""
        end.synchronize()
        return float(check(driver().cuEventElapsedTime(self._ev, end._ev)))

    def __del__(self) -> None:
        try:
            driver().cuEventDestroy(self._ev)
        except Exception:
            pass


class Timer:
    """`with Timer(stream) as t: ...` then `t.ms` (GPU time of the work enqueued inside)."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.ms = 0.0

    def __enter__(self) -> "Timer":
        self._a = Event().record(self.stream)
        return self

    def __exit__(self, *exc: object) -> None:
        b = Event().record(self.stream)
        self.ms = self._a.elapsed_ms(b)
