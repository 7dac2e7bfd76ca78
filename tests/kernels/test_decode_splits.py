"""Decode attention's split arithmetic (kernels/attention/attention.py decode_splits / _split_range and
the combine kernel's active-split count), in plain Python: every key of a query lands in
exactly one split at every position, and the grid fills the GPU without exceeding the cache."""
from __future__ import annotations

import pytest

from ninfer_nb.kernels.attention import attention as A


def _ranges(pos: int, n_split: int) -> list[tuple[int, int]]:
    return [A._split_range.py_func(pos, sp, n_split) for sp in range(n_split)]


@pytest.mark.parametrize("n_split", [1, 3, 44, 88, 517])
def test_splits_cover_every_key_once(n_split: int) -> None:
    for pos in [0, 1, 14, 15, 16, 17, 511, 512, 575, 4095, 8191, 8263, 65535]:
        keys = [j for k0, k1 in _ranges(pos, n_split) for j in range(k0, k1)]
        assert keys == list(range(pos + 1)), (pos, n_split)
        # the combine kernel merges the first ceil(n_keys / split_len) splits: all non-empty ones
        split_len = max(-(-(pos + 1) // n_split), A.MIN_SPLIT_KEYS)
        active = min(n_split, -(-(pos + 1) // split_len))
        assert all(k0 >= k1 for k0, k1 in _ranges(pos, n_split)[active:])
        assert all(k0 < k1 for k0, k1 in _ranges(pos, n_split)[:active])


def test_split_lengths_follow_the_position() -> None:
    """The point of dynamic splits: a block walks few keys at short and long context."""
    n = A.decode_splits(8264, 24, A.SPLIT_BLOCKS_PER_SM * 132)
    assert 24 * n >= A.SPLIT_WAVES * A.SPLIT_BLOCKS_PER_SM * 132
    assert max(k1 - k0 for k0, k1 in _ranges(575, n)) <= max(A.MIN_SPLIT_KEYS, 576 // n + 1)
    assert max(k1 - k0 for k0, k1 in _ranges(8255, n)) <= 8256 // n + 1


def test_decode_splits_bounded_by_the_cache() -> None:
    assert A.decode_splits(40, 24, 528) == 3            # ceil(40 / 16): no split without keys
    assert A.decode_splits(1 << 16, 24, 528) == -(-A.SPLIT_WAVES * 528 // 24)   # waves of resident blocks
    assert A.decode_splits(1 << 20, 1, 8 * 132) == A.MAX_SPLITS            # the combine's buffer
    assert A.decode_splits(1 << 16, 10_000, 528) == 1
