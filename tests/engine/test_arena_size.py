"""The CUDA backend's arena size from the environment: a fixed NINFER_ARENA_GIB wins over the
share of free memory (so GPU tests under xdist do not shrink each other's arenas)."""
import pytest

from ninfer_nb.engine.cuda_backend import ARENA_FRACTION, arena_size

GIB = 1 << 30


def test_arena_size_defaults_to_a_share_of_free_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NINFER_ARENA_GIB", raising=False)
    monkeypatch.delenv("NINFER_ARENA_FRACTION", raising=False)
    assert arena_size(100 * GIB) == int(100 * GIB * ARENA_FRACTION)
    monkeypatch.setenv("NINFER_ARENA_FRACTION", "0.25")
    assert arena_size(100 * GIB) == 25 * GIB


def test_fixed_arena_size_wins_and_is_capped_by_free_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NINFER_ARENA_FRACTION", "0.05")
    monkeypatch.setenv("NINFER_ARENA_GIB", "8")
    assert arena_size(100 * GIB) == 8 * GIB
    assert arena_size(3 * GIB) == 3 * GIB
    monkeypatch.setenv("NINFER_ARENA_GIB", "0")
    with pytest.raises(ValueError, match="NINFER_ARENA_GIB"):
        arena_size(100 * GIB)
