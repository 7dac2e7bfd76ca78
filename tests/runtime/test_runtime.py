"""Runtime pieces that need no GPU: bump arena bookkeeping, Tensor views and CAI, device probe."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ninfer_nb.runtime.arena import ALIGN, Arena, ArenaFull, ScratchArena
from ninfer_nb.runtime.device import cuda_available, parse_device
from ninfer_nb.runtime.tensor import Tensor


def test_cuda_available_never_raises() -> None:
    assert isinstance(cuda_available(), bool)


def test_parse_device() -> None:
    assert parse_device("cuda") == 0 and parse_device("cuda:3") == 3 and parse_device(None) == 0
    with pytest.raises(ValueError):
        parse_device("gpu0")


def test_scratch_addresses_repeat_after_reset() -> None:
    s = ScratchArena(1 << 20, 1 << 16, "scratch")
    first = [s.empty(n, np.float32).ptr for n in (3, 100, 1, 64)]
    assert all(p % ALIGN == 0 for p in first)
    assert first == sorted(first) and len(set(first)) == 4
    s.reset()
    assert [s.empty(n, np.float32).ptr for n in (3, 100, 1, 64)] == first
    with pytest.raises(ArenaFull):
        s.empty((1 << 16,), np.float32)


def test_carve_and_alignment() -> None:
    a = Arena(4096, 1 << 20)
    a.alloc(10)
    sub = a.carve(1000)
    assert sub.base % ALIGN == 0 and sub.base >= 4096 + ALIGN
    assert a.empty(1).ptr >= sub.base + sub.capacity


def test_tensor_views_and_cai() -> None:
    t = Tensor(0x10000, (4, 6, 8), np.float32)
    cai = t.__cuda_array_interface__
    assert cai == {"shape": (4, 6, 8), "typestr": "<f4", "data": (0x10000, False), "strides": None,
                   "version": 3, "stream": None}
    assert not hasattr(t, "__dlpack__")
    r = t.reshape(-1, 8)
    assert r.shape == (24, 8) and r.ptr == t.ptr
    s = t[1:3]
    assert s.shape == (2, 6, 8) and s.ptr == t.ptr + 6 * 8 * 4
    assert t[2].shape == (6, 8) and t[2].ptr == t.ptr + 2 * 192
    assert t[-1].ptr == t.ptr + 3 * 192
    with pytest.raises(ValueError):
        t.reshape(5, -1)
    with pytest.raises(IndexError):
        t[::2]
    b = Tensor(0x20000, (3, 4), ml_dtypes.bfloat16)
    assert b.__cuda_array_interface__["typestr"] == "<u2" and b.nbytes == 24
    assert b.view(np.float32).shape == (3, 2)
