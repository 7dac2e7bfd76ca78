"""Device memory arenas: one big cuda.core allocation, bump sub-allocation (256-byte aligned).

`Arena` hands out Tensors from a region and never frees them singly. `ScratchArena` is a
region that is `reset()` at the start of every model step, so the same sequence of
allocations returns the same addresses every step: an eager step is graph-capturable and
the captured graph replays against the same buffers. Knows nothing about kernels.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ninfer_nb.runtime.tensor import Tensor

ALIGN = 256


class ArenaFull(MemoryError):
    pass


class Arena:
    """Bump allocator over [base, base + capacity). Pure bookkeeping: `base` may be any int."""

    def __init__(self, base: int, capacity: int, name: str = "arena", owner: Any = None) -> None:
        if base % ALIGN:
            raise ValueError("arena base must be 256-byte aligned")
        self.base = int(base)
        self.capacity = int(capacity)
        self.name = name
        self.owner = owner
        self.offset = 0
        self.peak = 0

    @property
    def used(self) -> int:
        return self.offset

    def alloc(self, nbytes: int) -> int:
        """Reserve nbytes; returns the device address (256-byte aligned)."""
        off = self.offset
        end = off + ((int(nbytes) + ALIGN - 1) // ALIGN) * ALIGN
        if end > self.capacity:
            raise ArenaFull(f"{self.name}: need {nbytes} B at offset {off}, capacity {self.capacity} B")
        self.offset = end
        self.peak = max(self.peak, end)
        return self.base + off

    def empty(self, shape: tuple[int, ...] | list[int] | int, dtype: Any = np.float32) -> Tensor:
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        dtype = np.dtype(dtype)
        n = dtype.itemsize
        for s in shape:
            n *= int(s)
        return Tensor(self.alloc(max(n, 1)), shape, dtype, self)

    def carve(self, nbytes: int, name: str = "scratch") -> "ScratchArena":
        """A sub-region of this arena, for example the per-step scratch."""
        return ScratchArena(self.alloc(nbytes), ((int(nbytes) + ALIGN - 1) // ALIGN) * ALIGN, name, self)


class ScratchArena(Arena):
    """Per-step scratch: `reset()` rewinds to the start; same allocation order -> same addresses."""

    def reset(self) -> None:
        self.offset = 0


class DeviceArena(Arena):
    """Owns one device allocation made through cuda.core (freed with `close()`)."""

    def __init__(self, nbytes: int, name: str = "device") -> None:
        from cuda.core import Device

        dev = Device()
        stream = dev.default_stream
        buf = dev.allocate(int(nbytes) + ALIGN, stream=stream)
        stream.sync()
        ptr = int(buf.handle)
        aligned = (ptr + ALIGN - 1) // ALIGN * ALIGN
        super().__init__(aligned, int(nbytes), name, buf)
        self._buf = buf

    def close(self) -> None:
        if self._buf is not None:
            self._buf.close()
            self._buf = None


def standalone(nbytes: int) -> DeviceArena:
    """A private arena holding exactly one tensor (tests, one-off uploads)."""
    return DeviceArena(((int(nbytes) + ALIGN - 1) // ALIGN) * ALIGN, name="standalone")
