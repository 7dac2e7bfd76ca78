"""Sampler.device_pick: which requests the decode graph's pick kernel may serve, and the
seed it gets (reproducible, independent of the host generator's stream)."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer_nb import SamplingParams
from ninfer_nb.engine.sampler import Sampler

V = 1000


def test_greedy_without_penalties_is_the_argmax() -> None:
    for p in (SamplingParams(temperature=0.0), SamplingParams(temperature=0.9, top_k=1)):
        assert Sampler(p, V).device_pick() == (0.0, 0)


@pytest.mark.parametrize("changes", [dict(top_k=20), dict(top_p=0.95), dict(min_p=0.05),
                                     dict(presence_penalty=0.5), dict(frequency_penalty=0.2),
                                     dict(temperature=0.0, presence_penalty=0.5)])
def test_filters_and_penalties_stay_on_the_host(changes: dict) -> None:
    assert Sampler(SamplingParams(temperature=0.7).replace(**changes), V).device_pick() is None


def test_temperature_alone_is_sampled_on_the_device_with_a_reproducible_key() -> None:
    p = SamplingParams(temperature=0.7, seed=11)
    t, key = Sampler(p, V).device_pick()                     # type: ignore[misc]
    assert t == pytest.approx(0.7) and 0 <= key < 2**63
    assert Sampler(p, V).device_pick() == (t, key)            # the request's seed fixes the key
    assert Sampler(p.replace(seed=12), V).device_pick()[1] != key   # type: ignore[index]
    assert Sampler(SamplingParams(temperature=0.7), V, seed=11).device_pick() == (t, key)  # engine seed
    unseeded = {Sampler(SamplingParams(temperature=0.7), V).device_pick()[1] for _ in range(3)}  # type: ignore[index]
    assert len(unseeded) == 3                                 # no seed: a fresh key each request


def test_device_key_leaves_the_host_stream_alone() -> None:
    logits = np.random.default_rng(0).standard_normal(V).astype(np.float32)
    p = SamplingParams(temperature=0.8, seed=5)
    a, b = Sampler(p, V), Sampler(p, V)
    a.device_pick()
    assert [a.sample(logits) for _ in range(8)] == [b.sample(logits) for _ in range(8)]
