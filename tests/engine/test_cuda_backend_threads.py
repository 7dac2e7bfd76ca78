"""CudaBackend makes its CUDA context current on each new calling thread before it works there
(the driver binds contexts per thread; the server builds the engine on its main thread and runs
requests on the engine worker). Checked here without a GPU: the binding itself is one
cuCtxSetCurrent, replaced by a recorder; what is tested is that every step entry point binds a
new thread once, before running, and never rebinds a bound one."""
from __future__ import annotations

import threading

from ninfer_nb.engine.cuda_backend import CudaBackend


class _Scratch:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def reset(self) -> None:
        self.log.append(f"reset@{threading.get_ident()}")


def _backend(log: list[str]) -> CudaBackend:
    be = CudaBackend.__new__(CudaBackend)              # no device: only the thread bookkeeping
    be._threads = {threading.get_ident()}
    be.scratch = _Scratch(log)

    def bind() -> None:
        log.append(f"bind@{threading.get_ident()}")
        be._threads.add(threading.get_ident())

    be._bind_calling_thread = bind                     # type: ignore[method-assign]
    return be


def test_new_thread_binds_once_before_work() -> None:
    log: list[str] = []
    be = _backend(log)
    be.begin_step()                                    # the building thread: already bound
    assert log == [f"reset@{threading.get_ident()}"]
    seen: list[int] = []

    def worker() -> None:
        seen.append(threading.get_ident())
        be.begin_step()
        be.begin_step()

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    w = seen[0]
    assert log[1:] == [f"bind@{w}", f"reset@{w}", f"reset@{w}"]


def test_step_entry_points_are_bound() -> None:
    for name in ("begin_step", "decode_step", "zeros", "ids", "to_host", "copy_"):
        assert getattr(CudaBackend, name).__wrapped__ is not None, name
