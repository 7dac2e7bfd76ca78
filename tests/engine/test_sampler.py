"""Sampler: which requests the decode graph's pick kernel may serve and the seed it gets; the host
sampler's top-k selection and the distribution it draws from (against a brute-force reference)."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer_nb import SamplingParams
from ninfer_nb.engine.sampler import Sampler, top_k_ids

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


@pytest.mark.parametrize("n,k", [(248320, 20), (248320, 1000), (60000, 1), (5000, 64), (40, 39)])
def test_top_k_ids_are_the_k_largest(n: int, k: int) -> None:
    rng = np.random.default_rng(n + k)
    z = rng.standard_normal(n).astype(np.float32)
    z[rng.integers(0, n, 50)] = z.max()             # ties at the top
    z[rng.integers(0, n, 10)] = np.float32(-np.inf)
    ids = top_k_ids(z, k)
    assert ids.shape == (k,) and np.all(np.diff(ids) > 0)             # distinct, ascending
    assert np.array_equal(np.sort(z[ids]), np.sort(z)[-k:])           # the k largest values


def _filtered_ref(logits: np.ndarray, p: SamplingParams) -> dict[int, float]:
    """The host sampler's distribution by brute force (a full sort, float64): top-k, then
    min-p on the top-k's softmax, then the top-p nucleus of what is left."""
    z = logits.astype(np.float32) / np.float32(p.temperature)
    order = np.argsort(-z, kind="stable")
    keep = order[: p.top_k] if p.top_k else order
    probs = np.exp(z[keep].astype(np.float64) - z[keep].max())
    probs /= probs.sum()
    mask = probs >= p.min_p * probs.max() if p.min_p > 0 else np.ones(probs.size, bool)
    keep, probs = keep[mask], probs[mask] / probs[mask].sum()
    if p.top_p < 1.0:
        cut = int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1
        keep, probs = keep[:cut], probs[:cut] / probs[:cut].sum()
    return dict(zip(keep.tolist(), probs.tolist()))


@pytest.mark.parametrize("changes", [dict(top_k=20), dict(top_k=20, top_p=0.8), dict(top_p=0.9),
                                     dict(top_k=40, min_p=0.05), dict()])
def test_host_sampler_draws_the_filtered_softmax(changes: dict) -> None:
    """3,000 draws at a 60K vocabulary (top-k's subsample path) from logits with a peaked head:
    only ids of the brute-force filtered distribution come out, at its frequencies
    (chi-square over the bins expected >= 5 times, the rest pooled; p ~ 1e-4)."""
    rng = np.random.default_rng(len(changes) * 7 + 1)
    v, n = 60000, 3000
    logits = rng.standard_normal(v).astype(np.float32)
    head = rng.choice(v, 60, replace=False)
    logits[head] += np.linspace(9.0, 6.0, 60).astype(np.float32)
    p = SamplingParams(temperature=0.8, seed=3).replace(**changes)
    want = _filtered_ref(logits, p)
    sampler = Sampler(p, v)
    draws = [sampler.sample(logits) for _ in range(n)]
    assert set(draws) <= set(want)
    counts: dict[int, int] = {}
    for t in draws:
        counts[t] = counts.get(t, 0) + 1
    big = [t for t, q in want.items() if n * q >= 5]
    obs = [counts.get(t, 0) for t in big] + [n - sum(counts.get(t, 0) for t in big)]
    exp = [n * want[t] for t in big] + [n * (1.0 - sum(want[t] for t in big))]
    if exp[-1] < 5:                                 # nothing to pool
        obs, exp = obs[:-1], exp[:-1]
    chi2 = sum((o - e) ** 2 / e for o, e in zip(obs, exp))
    assert chi2 < 3 * len(exp) + 30, (chi2, len(exp))
