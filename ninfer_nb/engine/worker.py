"""EngineWorker: one daemon thread owns a non-thread-safe engine and runs its jobs FIFO.

asyncio code submits a job (a function of a cancel `threading.Event` returning an iterator)
and reads the job's items back through an asyncio queue fed by `loop.call_soon_threadsafe`.
Small calls (`call`) run on the same thread between two steps of the running job, so they never
wait for a whole generation. An exception raised by a job fails that job only. This module knows
nothing about models, HTTP or protocols.
"""
from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Callable, Generator, Iterator
from types import TracebackType
from typing import Any, Generic, TypeVar, cast

from ..errors import EngineOverloadedError, NinferError

T = TypeVar("T")
R = TypeVar("R")

JobFn = Callable[[threading.Event], "Iterator[T]"]
CANCEL_GRACE_STEPS = 4


class WorkerClosedError(NinferError):
    """The worker is shutting down and accepts no new work."""

    code = "unavailable"
    http_status = 503


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


_STARTED = _Marker("started")
_END = _Marker("end")


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class JobStream(Generic[T]):
    """The asyncio side of one job: iterate it, or `next(timeout)` to wait with a deadline.

    Leaving `async with` (or calling `cancel()`) before the end sets the cancel event; the worker
    then stops the job at its next step (or skips it if it has not started yet).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, fn: JobFn[T]) -> None:
        self.fn = fn
        self.cancel_event = threading.Event()
        self.submitted_at = time.monotonic()
        self.started_at: float | None = None
        self.finished = False
        self._loop = loop
        self._queue: asyncio.Queue[object] = asyncio.Queue()

    # --- called from the worker thread -------------------------------------------------
    def _deliver(self, item: object) -> bool:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody will read this job any more
            self.cancel_event.set()
            return False
        return True

    # --- called from the event loop ----------------------------------------------------
    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set()

    def cancel(self) -> None:
        self.cancel_event.set()

    async def next(self, timeout: float | None = None) -> T:
        """The next item; StopAsyncIteration at the end, TimeoutError if none came in time.

        A timeout leaves the job running. The job's own exception is re-raised here.
        """
        if self.finished:
            raise StopAsyncIteration
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            item = await asyncio.wait_for(self._queue.get(), left)
            if item is _STARTED:
                self.started_at = time.monotonic()
                continue
            if item is _END:
                self.finished = True
                raise StopAsyncIteration
            if isinstance(item, _Failure):
                self.finished = True
                raise item.exc
            return cast(T, item)

    def __aiter__(self) -> JobStream[T]:
        return self

    async def __anext__(self) -> T:
        return await self.next()

    async def __aenter__(self) -> JobStream[T]:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self.finished:
            self.cancel()


class _Call(Generic[R]):
    def __init__(self, loop: asyncio.AbstractEventLoop, fn: Callable[[], R]) -> None:
        self.fn = fn
        self.loop = loop
        self.future: asyncio.Future[R] = loop.create_future()

    def run(self) -> None:
        try:
            result = self.fn()
        except BaseException as exc:  # delivered to the caller, never raised on this thread
            self._settle(None, exc)
        else:
            self._settle(result, None)

    def _settle(self, result: R | None, exc: BaseException | None) -> None:
        def apply() -> None:
            if self.future.done():
                return
            if exc is not None:
                self.future.set_exception(exc)
            else:
                self.future.set_result(cast(R, result))

        try:
            self.loop.call_soon_threadsafe(apply)
        except RuntimeError:  # loop closed; the caller is gone
            return


class EngineWorker:
    """Runs jobs one at a time, in submission order, on a single daemon thread.

    `max_pending` bounds the jobs waiting behind the running one (None = unbounded); a submit
    beyond it raises EngineOverloadedError. `close()` refuses new work and drains the queue.
    """

    def __init__(self, *, max_pending: int | None = 16, name: str = "ninfer-engine") -> None:
        if max_pending is not None and max_pending < 0:
            raise ValueError(f"max_pending must be >= 0, got {max_pending}")
        self.max_pending = max_pending
        self._cond = threading.Condition()
        self._jobs: collections.deque[JobStream[Any]] = collections.deque()
        self._calls: collections.deque[_Call[Any]] = collections.deque()
        self._running: JobStream[Any] | None = None
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # --- state ---------------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        with self._cond:
            return len(self._jobs)

    @property
    def num_running(self) -> int:
        with self._cond:
            return 0 if self._running is None else 1

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # --- asyncio side --------------------------------------------------------------------
    def submit_stream(self, fn: JobFn[T]) -> JobStream[T]:
        """Queue `fn(cancel_event)`; its items arrive on the returned stream. Loop thread only."""
        stream: JobStream[T] = JobStream(asyncio.get_running_loop(), fn)
        with self._cond:
            if self._closing:
                raise WorkerClosedError("the server is shutting down")
            if self.max_pending is not None and self._is_busy() and (
                len(self._jobs) >= self.max_pending
            ):
                raise EngineOverloadedError(
                    f"too many pending requests ({len(self._jobs)} waiting); retry later"
                )
            self._jobs.append(stream)
            self._cond.notify()
        return stream

    async def call(self, fn: Callable[[], R]) -> R:
        """Run a short `fn()` on the engine thread, between two steps of the running job."""
        c: _Call[R] = _Call(asyncio.get_running_loop(), fn)
        with self._cond:
            if not self._thread.is_alive():
                raise WorkerClosedError("the engine thread has stopped")
            self._calls.append(c)
            self._cond.notify()
        return await c.future

    def close(self, timeout: float | None = None) -> bool:
        """Refuse new jobs, let queued and running ones finish, stop the thread.

        After `timeout` seconds, the remaining jobs are cancelled. Returns True if the thread
        stopped. Blocking: from asyncio use `await loop.run_in_executor(None, worker.close)`.
        """
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout)
        if self._thread.is_alive():
            with self._cond:
                for job in [*self._jobs, *([self._running] if self._running else [])]:
                    job.cancel()
            self._thread.join(5.0)
        return not self._thread.is_alive()

    # --- worker thread -------------------------------------------------------------------
    def _is_busy(self) -> bool:
        return self._running is not None or bool(self._jobs)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._calls and not self._closing:
                    self._cond.wait()
                if not self._jobs and not self._calls:
                    return  # closing and drained
                job = self._jobs.popleft() if not self._calls and self._jobs else None
                self._running = job
            if job is None:
                self._run_calls()
                continue
            try:
                self._drive(job)
            finally:
                with self._cond:
                    self._running = None

    def _run_calls(self) -> None:
        while True:
            with self._cond:
                if not self._calls:
                    return
                c = self._calls.popleft()
            c.run()

    def _drive(self, job: JobStream[Any]) -> None:
        if job.cancel_event.is_set():
            job._deliver(_END)
            return
        job._deliver(_STARTED)
        it: Iterator[Any] | None = None
        try:
            it = iter(job.fn(job.cancel_event))
            after_cancel = 0
            for item in it:
                if not job._deliver(item):
                    break
                self._run_calls()
                if job.cancel_event.is_set():
                    # A few more steps let the job end through its own cancel path (clean
                    # state, a final event); a job that ignores the event is closed.
                    after_cancel += 1
                    if after_cancel > CANCEL_GRACE_STEPS:
                        break
        except BaseException as exc:  # the job fails, the worker lives on
            job._deliver(_Failure(exc))
            return
        finally:
            if isinstance(it, Generator):
                try:
                    it.close()
                except Exception as exc:  # a broken cleanup fails only this job
                    job._deliver(_Failure(exc))
        job._deliver(_END)
