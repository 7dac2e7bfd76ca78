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


# --- the device sampler's semantics (kernels/sample_pick.py mirrors them) ---------------------

def test_filtered_and_penalized_requests_route_to_the_device_sampler() -> None:
    """device_sample serves what device_pick does not: filters and penalties travel as
    PickFilters (greedy with penalties too), the key as device_pick's; constrained requests
    stay on the host."""
    from ninfer_nb.engine.sampler import DevicePick

    p = SamplingParams(temperature=0.7, top_k=20, top_p=0.95, presence_penalty=1.0, seed=4)
    s = Sampler(p, V)
    d = s.device_sample()
    assert isinstance(d, DevicePick) and d.filters is not None and d.temperature == pytest.approx(0.7)
    assert (d.filters.top_k, d.filters.top_p, d.filters.presence_penalty) == (20, 0.95, 1.0)
    assert d.seed == Sampler(p.replace(top_k=0, top_p=1.0, presence_penalty=0.0), V).device_pick()[1]  # type: ignore[index]
    assert d.at(7) == (0.7, d.seed, 7, d.filters) and d.filters.counts is s.counts    # live history
    g = Sampler(SamplingParams(temperature=0.0, repetition_penalty=1.2), V, prompt_ids=[3, 5]).device_sample()
    assert g is not None and g.temperature == 0.0 and g.filters is not None
    assert list(g.filters.prompt_ids) == [3, 5]
    assert Sampler(SamplingParams(temperature=0.0), V).device_sample() == (0.0, 0, None)


def test_bias_and_penalties_order() -> None:
    """Bias first, then repetition (prompt and output; / r above 0, * r below), then
    frequency * count + presence on generated tokens only; greedy takes the argmax after them."""
    from ninfer_nb.engine.sampler import penalize

    x = np.array([2.0, -2.0, 1.0, 0.5, 3.0], np.float32)
    out = penalize(x, ((3, 4.0),), 2.0, 0.5, 0.25, np.array([0, 1]), {2: 2, 3: 1})
    want = np.array([1.0, -4.0, 0.5 - (0.5 * 2 + 0.25), 4.5 / 2 - (0.5 + 0.25), 3.0], np.float32)
    np.testing.assert_allclose(out, want, rtol=1e-6)
    s = Sampler(SamplingParams(temperature=0.0, presence_penalty=2.0), 5)
    s.observe(4)
    assert s.sample(x) == 0 and s.sample(np.array([1, 1, 0, 0, 0], np.float32)) == 0   # ties -> lower id


@pytest.mark.parametrize("changes", [dict(top_k=20), dict(top_p=0.9), dict(min_p=0.05), dict(top_k=30, top_p=0.8),
                                     dict(top_k=15, top_p=0.7, min_p=0.02), dict()])
def test_distribution_support_is_the_device_samplers_kept_set(changes: dict) -> None:
    """The host sampler's support equals the device sampler's kept set (kernels/sample_pick.py
    kept_ref: a plain sort, fixed-point masses), ties at the top-k boundary to the lower ids,
    at a large vocabulary (the partial sorts) and a small one."""
    from ninfer_nb.kernels.sample_pick import kept_ref

    for v in (60000, 300):
        rng = np.random.default_rng(v + len(changes))
        logits = rng.standard_normal(v).astype(np.float32)
        logits[rng.choice(v, 40, replace=False)] += np.linspace(8.0, 5.0, 40).astype(np.float32)
        logits[[11, 12, 13]] = logits.max() - 2.0                       # a tie, likely at a boundary
        p = SamplingParams(temperature=0.9).replace(**changes)
        ids, probs = Sampler(p, v).distribution(logits)
        z = (logits / np.float32(0.9)).astype(np.float32)
        want = kept_ref(z, p.top_k, p.top_p, p.min_p)
        assert np.array_equal(np.sort(ids), np.sort(want)), (v, changes)
        assert probs.sum() == pytest.approx(1.0)


def test_gumbel_max_pick_with_filters_draws_the_host_distribution() -> None:
    """The CPU backend's pick with filters and penalties (gumbel_max_pick, the token ring's rule)
    draws from the host sampler's distribution: 3,000 offsets, chi-square."""
    from ninfer_nb.engine.sampler import gumbel_max_pick

    v, n = 50, 3000
    row = np.random.default_rng(2).standard_normal(v).astype(np.float32)
    p = SamplingParams(temperature=0.8, top_k=12, top_p=0.9, presence_penalty=0.7, repetition_penalty=1.3,
                       logit_bias=((4, 2.0),))
    s = Sampler(p, v, prompt_ids=[1, 2, 3])
    for t in (5, 5, 9):
        s.observe(t)
    d = s.device_sample()
    assert d is not None
    ids, probs = s.distribution(row)
    got = np.bincount([gumbel_max_pick(row, *d.at(i)) for i in range(n)], minlength=v)
    want = np.zeros(v)
    want[ids] = probs * n
    assert got[want == 0].sum() == 0
    big = want >= 5
    chi2 = float(((got[big] - want[big]) ** 2 / want[big]).sum())
    assert chi2 < 3 * big.sum() + 30, chi2


@pytest.mark.parametrize("bad", [dict(repetition_penalty=0.0), dict(repetition_penalty=2.5),
                                 dict(logit_bias=((3, 1.0), (3, 2.0))), dict(logit_bias=((3, 101.0),)),
                                 dict(logit_bias=((10**20, 1.0),)), dict(logit_bias=((-1, 1.0),))])
def test_repetition_penalty_and_logit_bias_are_validated(bad: dict) -> None:
    from ninfer_nb.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError):
        SamplingParams(**bad).validate()
