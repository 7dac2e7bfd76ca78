"""EngineWorker: one daemon thread owns a non-thread-safe engine and runs its jobs FIFO.

asyncio code submits a job (a function of a cancel `threading.Event` returning an iterator)
and reads the job's items back through an asyncio queue fed by `loop.call_soon_threadsafe`.
Several jobs run at once (`max_active`, the engine's max_concurrency), taking turns item by
item. Small calls (`call`) run on the same thread between two items, so they never wait for a
whole generation. An exception raised by a job fails that job only (a device out of
memory becomes engine/faults.py's typed error), unless `fault_check` says it left the engine
unusable (an unrecoverable device fault): then that job and every queued one fail with the
fault, new work is refused with it, the thread stops, and `fault` tells the owner (the server
reports it on /health and exits non-zero). This module knows nothing about models, HTTP or
protocols.
"""
from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, TypeVar, cast

from ..errors import EngineOverloadedError, NinferError
from .faults import EngineFaultError, request_error

T = TypeVar("T")
R = TypeVar("R")

JobFn = Callable[[threading.Event], "Iterator[T]"]
# exc (a job's failure) -> the error that ends the engine, or None when it can go on
FaultCheck = Callable[[BaseException], "NinferError | None"]
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


@dataclass(eq=False)
class _Active:
    """A started job: its iterator and the items it produced since its cancel was set."""

    job: JobStream[Any]
    it: Iterator[Any]
    after_cancel: int = 0


class EngineWorker:
    """Runs jobs on a single daemon thread, in submission order, up to `max_active` at once.

    Active jobs take turns, one item each per turn (a generation's item is one engine step's
    token, and the engine steps all of its requests together, so `max_active` jobs generate
    at once; outputs of the others wait in the engine's front door for their own job's turn).
    `max_pending` bounds the jobs waiting for a turn (None = unbounded); a submit beyond it
    raises EngineOverloadedError. `close()` refuses new work and drains the queue.
    `fault_check(exc)` runs on the engine thread after a job fails (see the module docstring).
    """

    def __init__(self, *, max_pending: int | None = 16, name: str = "ninfer-engine",
                 fault_check: FaultCheck | None = None, max_active: int = 1) -> None:
        if max_pending is not None and max_pending < 0:
            raise ValueError(f"max_pending must be >= 0, got {max_pending}")
        if max_active < 1:
            raise ValueError(f"max_active must be >= 1, got {max_active}")
        self.max_pending = max_pending
        self.max_active = max_active
        self.fault_check = fault_check
        self.fault: NinferError | None = None    # set once, by an unrecoverable job failure
        self._cond = threading.Condition()
        self._jobs: collections.deque[JobStream[Any]] = collections.deque()
        self._calls: collections.deque[_Call[Any]] = collections.deque()
        self._active: list[_Active] = []          # started jobs, in start order (worker thread)
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
            return len(self._active)

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
            if self.fault is not None:
                raise self._faulted()
            if self._closing:
                raise WorkerClosedError("the server is shutting down")
            if self.max_pending is not None and self._is_full() and (
                len(self._jobs) >= self.max_pending
            ):
                raise EngineOverloadedError(
                    f"too many pending requests ({len(self._jobs)} waiting); retry later"
                )
            self._jobs.append(stream)
            self._cond.notify()
        return stream

    async def call(self, fn: Callable[[], R]) -> R:
        """Run a short `fn()` on the engine thread, between two items of the running jobs."""
        c: _Call[R] = _Call(asyncio.get_running_loop(), fn)
        with self._cond:
            if self.fault is not None:
                raise self._faulted()
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
                for job in [*self._jobs, *(a.job for a in self._active)]:
                    job.cancel()
            self._thread.join(5.0)
        return not self._thread.is_alive()

    def _faulted(self) -> EngineFaultError:
        """A fresh copy of the fault for one more caller (an exception object is raised once)."""
        assert self.fault is not None
        return EngineFaultError(self.fault.message)

    # --- worker thread -------------------------------------------------------------------
    def _is_full(self) -> bool:
        """Every turn is taken (a new job would wait)."""
        return len(self._active) >= self.max_active or bool(self._jobs)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._calls and not self._active and not self._closing:
                    self._cond.wait()
                if not self._jobs and not self._calls and not self._active:
                    return  # closing and drained
                starting: list[JobStream[Any]] = []
                while self._jobs and len(self._active) + len(starting) < self.max_active:
                    starting.append(self._jobs.popleft())
            self._run_calls()
            for job in starting:
                self._start(job)
            for active in list(self._active):
                self._advance(active)
                self._run_calls()
                if self.fault is not None:
                    break
            if self.fault is not None:
                self._fail_active()
                self._fail_queued()
                return

    def _start(self, job: JobStream[Any]) -> None:
        if job.cancel_event.is_set():
            job._deliver(_END)
            return
        job._deliver(_STARTED)
        try:
            it = iter(job.fn(job.cancel_event))
        except BaseException as exc:  # the job fails, the worker lives on
            job._deliver(_Failure(self._failure(exc)))
            return
        with self._cond:
            self._active.append(_Active(job, it))

    def _advance(self, a: _Active) -> None:
        """One item of an active job (its end, its failure, or past its cancel grace: it ends)."""
        try:
            item = next(a.it)
        except StopIteration:
            self._end(a, None)
            return
        except BaseException as exc:  # the job fails; the worker lives on unless the device is gone
            self._end(a, self._failure(exc))
            return
        if not a.job._deliver(item):
            self._end(a, None)
            return
        if a.job.cancel_event.is_set():
            # A few more items let the job end through its own cancel path (clean state, a
            # final event); a job that ignores the event is closed.
            a.after_cancel += 1
            if a.after_cancel > CANCEL_GRACE_STEPS:
                self._end(a, None)

    def _end(self, a: _Active, failure: BaseException | None) -> None:
        with self._cond:
            self._active.remove(a)
        if failure is not None:
            a.job._deliver(_Failure(failure))
        if isinstance(a.it, Generator):
            try:
                a.it.close()
            except Exception as exc:  # a broken cleanup fails only this job
                a.job._deliver(_Failure(exc))
                return
        if failure is None:
            a.job._deliver(_END)

    def _fail_active(self) -> None:
        """After a fault: the other started jobs fail with it."""
        for a in list(self._active):
            self._end(a, self._faulted())

    def _fail_queued(self) -> None:
        """After a fault: every queued job and call fails with it; nothing runs any more."""
        with self._cond:
            jobs, calls = list(self._jobs), list(self._calls)
            self._jobs.clear()
            self._calls.clear()
        for job in jobs:
            job._deliver(_Failure(self._faulted()))
        for c in calls:
            c._settle(None, self._faulted())

    def _run_calls(self) -> None:
        while True:
            with self._cond:
                if not self._calls:
                    return
                c = self._calls.popleft()
            c.run()

    def _failure(self, exc: BaseException) -> BaseException:
        """What a job that raised `exc` fails with: the fault when `exc` ended the engine (it is
        recorded first, under the lock, so no new work gets in), else the request's typed error
        (a device out of memory) or `exc` itself."""
        fault = self.fault_check(exc) if self.fault_check is not None else None
        if fault is not None:
            with self._cond:
                self.fault = fault
                self._closing = True
            return fault
        return request_error(exc) or exc
