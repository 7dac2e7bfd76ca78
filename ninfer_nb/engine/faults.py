"""Device faults: which failures end one request, and which end the engine.

- Out of memory while a request runs (the scratch arena cannot hold one of its steps: a long
  prefill chunk, a decode graph's capture; or the driver's CUDA_ERROR_OUT_OF_MEMORY, e.g.
  instantiating a graph): that request's fault. It ends with `DeviceOutOfMemoryError` (503,
  retryable: memory may be free later); the engine forgets the half-written caches, the step's
  scratch is handed back at the next step (arenas are rewound, nothing is freed singly) and the
  engine goes on with the other requests.
- Any other CUDA driver error is probed (`fatal_fault`): a sticky error (illegal address, launch
  failure, ECC, a device assert ...) leaves the context unusable, so the next synchronize fails
  too. Then the engine cannot go on: the worker stops taking work (`EngineFaultError`, 503),
  `/health` reports the fault and the server exits with `EXIT_DEVICE_FAULT`, so a supervisor
  restarts it. An error the device survives (the probe succeeds) fails only its request.
- Everything else (a Python error in the engine) is the request's, as before.

Knows nothing about HTTP, requests or models: it sees exceptions and, for the probe, an object
with a `stream` that can `synchronize()` (CudaBackend; the CPU backend has none and never
raises device errors).
"""
from __future__ import annotations

from typing import Any

from ..errors import NinferError

EXIT_DEVICE_FAULT = 3          # the server's exit status after an unrecoverable device fault

_OOM_NAMES = ("CUDA_ERROR_OUT_OF_MEMORY", "CUDA_ERROR_MEMORY_ALLOCATION", "out of memory")


class DeviceOutOfMemoryError(NinferError):
    """The device had no memory for one of this request's steps."""

    code = "device_out_of_memory"
    http_status = 503
    retry_after_s = 5


class EngineFaultError(NinferError):
    """The engine hit a device fault it cannot recover from; this process serves nothing more."""

    code = "engine_fault"
    http_status = 503
    retry_after_s = 1


def _is_arena_full(exc: BaseException) -> bool:
    from ..runtime.arena import ArenaFull

    return isinstance(exc, ArenaFull)


def is_device_error(exc: BaseException) -> bool:
    """A CUDA driver / runtime error (ours, or numba's), or the scratch arena running out."""
    if _is_arena_full(exc):
        return True
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(names & {"CudaDriverError", "CudaAPIError", "CudaRuntimeError", "CudaSupportError"})


def is_out_of_memory(exc: BaseException) -> bool:
    if _is_arena_full(exc):
        return True
    return is_device_error(exc) and any(name in str(exc) for name in _OOM_NAMES)


def request_error(exc: BaseException) -> NinferError | None:
    """The typed, one-line error a request that failed with `exc` should end with, when `exc`
    is a device fault that is the request's (out of memory); None otherwise."""
    if isinstance(exc, NinferError) or not is_out_of_memory(exc):
        return None
    what = ("the scratch arena is full" if _is_arena_full(exc) else "the driver has no memory left")
    return DeviceOutOfMemoryError(
        f"the device ran out of memory for this request ({what}: {exc}); it was cancelled and "
        f"its memory released. Retry later, or with a shorter prompt")


def fatal_fault(exc: BaseException, backend: Any) -> EngineFaultError | None:
    """The fault that ends the engine, when `exc` (raised by a request's step on `backend`)
    left the device unusable; None when the engine can go on (a Python error, an out of
    memory, or a driver error after which the device still synchronizes)."""
    if isinstance(exc, EngineFaultError):
        return exc
    if not is_device_error(exc) or is_out_of_memory(exc):
        return None
    stream = getattr(backend, "stream", None)
    try:
        if stream is not None:
            stream.synchronize()
    except Exception as probe:  # the context is gone: every later call fails the same way
        return EngineFaultError(f"unrecoverable device fault: {exc} (the device no longer "
                                f"synchronizes: {probe}); restart the server")
    return None
