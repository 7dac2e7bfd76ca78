"""tests/kernels/gpu_util.py's arena size: NINFER_TEST_ARENA_GIB shrinks the GPU tests' default
arenas (many xdist workers on one GPU); unset, 24 GiB as always."""
from __future__ import annotations

import pytest

from tests.kernels.gpu_util import default_arena_bytes


def test_default_arena_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NINFER_TEST_ARENA_GIB", raising=False)
    assert default_arena_bytes() == 24 << 30
    monkeypatch.setenv("NINFER_TEST_ARENA_GIB", "10")
    assert default_arena_bytes() == 10 << 30
    monkeypatch.setenv("NINFER_TEST_ARENA_GIB", "0")
    with pytest.raises(ValueError):
        default_arena_bytes()
