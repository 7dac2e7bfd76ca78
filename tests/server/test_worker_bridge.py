"""EngineWorker: FIFO order, one job at a time, overload, cancellation, failure isolation."""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

from ninfer_nb.engine.worker import EngineWorker, WorkerClosedError
from ninfer_nb.errors import EngineOverloadedError


def counting_job(n: int, log: list[str], tag: str, delay: float = 0.0):
    def fn(cancel: threading.Event) -> Iterator[int]:
        for i in range(n):
            if cancel.is_set():
                return
            log.append(f"{tag}{i}")
            time.sleep(delay)
            yield i

    return fn


async def test_jobs_run_fifo_and_never_overlap() -> None:
    worker = EngineWorker(max_pending=8)
    log: list[str] = []
    streams = [worker.submit_stream(counting_job(3, log, t, 0.002)) for t in "abc"]

    async def collect(s) -> list[int]:
        return [x async for x in s]

    results = await asyncio.gather(*(collect(s) for s in streams))
    assert results == [[0, 1, 2]] * 3
    assert log == ["a0", "a1", "a2", "b0", "b1", "b2", "c0", "c1", "c2"]
    assert all(s.started_at is not None for s in streams)
    assert worker.close(5)


async def test_overload_raises_beyond_max_pending() -> None:
    worker = EngineWorker(max_pending=1)
    gate = threading.Event()

    def blocked(cancel: threading.Event) -> Iterator[int]:
        gate.wait(5)
        yield 1

    running = worker.submit_stream(blocked)
    await asyncio.sleep(0.05)  # let it start
    waiting = worker.submit_stream(blocked)
    with pytest.raises(EngineOverloadedError):
        worker.submit_stream(blocked)
    gate.set()
    assert [x async for x in running] == [1]
    assert [x async for x in waiting] == [1]
    assert worker.close(5)


async def test_exception_fails_only_its_job() -> None:
    worker = EngineWorker()

    def boom(cancel: threading.Event) -> Iterator[int]:
        yield 1
        raise RuntimeError("engine exploded")

    bad = worker.submit_stream(boom)
    good = worker.submit_stream(counting_job(2, [], "g"))
    assert await bad.next() == 1
    with pytest.raises(RuntimeError, match="exploded"):
        await bad.next()
    assert [x async for x in good] == [0, 1]
    assert worker.alive
    assert worker.close(5)


async def test_cancel_stops_running_job_and_skips_queued() -> None:
    worker = EngineWorker()
    log: list[str] = []
    long = worker.submit_stream(counting_job(10_000, log, "L", 0.001))
    queued = worker.submit_stream(counting_job(3, log, "Q"))
    assert await long.next() == 0
    queued.cancel()
    long.cancel()
    after = worker.submit_stream(counting_job(1, log, "A"))
    assert [x async for x in after] == [0]
    assert [x async for x in queued] == []
    assert not any(e.startswith("Q") for e in log)
    assert len([e for e in log if e.startswith("L")]) < 10_000
    assert worker.close(5)


async def test_call_interleaves_with_running_job() -> None:
    worker = EngineWorker()
    gate = threading.Event()

    def slow(cancel: threading.Event) -> Iterator[int]:
        for i in range(1000):
            if gate.is_set():
                return
            time.sleep(0.002)
            yield i

    stream = worker.submit_stream(slow)
    await stream.next()
    t0 = time.monotonic()
    thread_name = await worker.call(lambda: threading.current_thread().name)
    assert thread_name == "ninfer-engine"
    assert time.monotonic() - t0 < 1.0  # did not wait for the 2 s job
    with pytest.raises(ZeroDivisionError):
        await worker.call(lambda: 1 // 0)
    gate.set()
    assert worker.close(5)


async def test_close_drains_then_refuses() -> None:
    worker = EngineWorker()
    stream = worker.submit_stream(counting_job(5, [], "d", 0.01))
    loop = asyncio.get_running_loop()
    closing = loop.run_in_executor(None, worker.close, 10)
    items = [x async for x in stream]
    assert items == [0, 1, 2, 3, 4]
    assert await closing
    with pytest.raises(WorkerClosedError):
        worker.submit_stream(counting_job(1, [], "x"))


async def test_next_timeout_keeps_job_alive() -> None:
    worker = EngineWorker()
    gate = threading.Event()

    def waits(cancel: threading.Event) -> Iterator[str]:
        gate.wait(5)
        yield "late"

    stream = worker.submit_stream(waits)
    with pytest.raises(TimeoutError):
        await stream.next(timeout=0.05)
    gate.set()
    assert await stream.next(timeout=5) == "late"
    assert worker.close(5)


async def test_job_ignoring_cancel_is_closed_after_grace() -> None:
    worker = EngineWorker()
    produced: list[int] = []
    closed = threading.Event()

    def stubborn(cancel: threading.Event) -> Iterator[int]:
        try:
            for i in range(100_000):
                produced.append(i)
                time.sleep(0.001)
                yield i
        finally:
            closed.set()

    stream = worker.submit_stream(stubborn)
    await stream.next()
    stream.cancel()
    assert await asyncio.get_running_loop().run_in_executor(None, closed.wait, 5)
    assert len(produced) < 100
    assert worker.close(5)
