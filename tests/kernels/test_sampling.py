"""Token selection (kernels/sampling.py) through CudaOps vs the NumPy references beside the
kernels (sampling.sample_ref, penalties_ref, pick_scores_ref): one body per case, small
shapes under the CUDA simulator (tests/support/sim_runner.py), real vocabularies on the GPU."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer_nb.kernels import sampling as S
from tests.kernels.device import DEVICE_MARKS, SIM, shapes
from tests.kernels.gpu_util import close, rnd

pytestmark = DEVICE_MARKS


@pytest.mark.parametrize("b,v", shapes(sim=[(4, 300)], gpu=[(4, 248320), (3, 1000)]))
def test_sampling(dev, rng, b, v):
    """argmax (a tie -> the lower id), the repetition / frequency / presence penalties, the
    host-driven sampler per row (temperature, top-k, top-p, min-p; offsets advance by one per
    call) against sample_ref, and count_tokens."""
    ops = dev.fresh()
    threads = 1024 if dev.on_gpu else 32                 # the simulator runs every thread in Python
    logits = rnd(rng, b, v, scale=3.0)
    logits[0, 5] = logits[0, 17] = logits[0].max() + 1.0
    L = dev.up(logits)
    np.testing.assert_array_equal(dev.host(ops.argmax(L, threads=threads)), np.argmax(logits, axis=1))
    counts = rng.integers(0, 3, (b, v)).astype(np.int32)
    rep = np.linspace(0.8, 1.3, b).astype(np.float32)
    freq = np.linspace(0.0, 0.5, b).astype(np.float32)
    pres = np.linspace(0.3, 0.0, b).astype(np.float32)
    LP = dev.up(logits)
    ops.apply_penalties(LP, dev.up(counts), dev.up(rep), dev.up(freq), dev.up(pres))
    close(dev.host(LP), S.penalties_ref(logits, counts, rep, freq, pres), 1e-5)
    temp = np.array([0.0, 0.7, 1.0, 1.3][:b], np.float32)
    top_k = np.array([0, 50, 0, 20][:b], np.int32)
    top_p = np.array([1.0, 0.9, 0.8, 1.0][:b], np.float32)
    min_p = np.array([0.0, 0.0, 0.02, 0.1][:b], np.float32)
    seeds = rng.integers(0, 2**62, b).astype(np.int64)
    seeds[-1] = 2**40 + 5                                # a seed above 32 bits
    offs = rng.integers(0, 1000, b).astype(np.int64)
    OFF = dev.up(offs)
    steps = 3 if dev.on_gpu else 1
    for step in range(steps):
        tok = dev.host(ops.sample(L, dev.up(temp), dev.up(top_k), dev.up(top_p), dev.up(min_p), dev.up(seeds), OFF,
                                  threads=threads))
        for r in range(b):
            ref, kept, _ = S.sample_ref(logits[r], temp[r], top_k[r], top_p[r], min_p[r], seeds[r], offs[r] + step, r)
            assert kept[tok[r]], (step, r, tok[r])
            assert tok[r] == ref, (step, r, tok[r], ref)
    np.testing.assert_array_equal(dev.host(OFF), offs + steps)
    CNT = dev.up(counts)
    ops.count_tokens(CNT, dev.up(tok))
    exp = counts.copy()
    exp[np.arange(b), tok] += 1
    np.testing.assert_array_equal(dev.host(CNT), exp)


@pytest.mark.parametrize("v,temps", shapes(
    sim=[(2 * S.PICK_SPAN + 300, (0.0, 0.0, 0.8))],
    gpu=[(v, (0.0, 0.0, 0.7, 1.0, 0.3)) for v in (248320, 151643, 2048, 37)]))
def test_pick_feed(dev, rng, v, temps):
    """The decode graph's token pick: at temperature 0 np.argmax (first a winner in the second
    block tied with one in the last -> the lower id, then the very last logit, in the partial
    last block), at T > 0 the argmax of pick_scores_ref (Gumbel-max: x / T + Philox noise; the
    device's logf may differ in the last bit); token, position and offset fed back, the block
    counter left zero. On the GPU, timed against the one-block argmax_kernel (-s)."""
    ops = dev.fresh()
    counter = dev.up(np.zeros(1, np.int32))
    ids, pos = dev.up(np.array([3], np.int32)), dev.up(np.array([100], np.int32))
    seed, offset = dev.up(np.array([2**40 + int(rng.integers(0, 2**20))], np.int64)), dev.up(np.array([9], np.int64))
    for step, temp in enumerate(temps):
        row = rnd(rng, 1, v, scale=3.0)
        hot = S.PICK_SPAN + 777 if step == 0 and v > S.PICK_SPAN + 777 else v - 1 if step == 1 else int(rng.integers(0, v))
        row[0, hot] = row.max() + 1.0
        if step == 0 and v > 2 * S.PICK_SPAN + 5:
            row[0, 2 * S.PICK_SPAN + 5] = row[0, hot]                # a tie across blocks
        scores = S.pick_scores_ref(row, temp, int(dev.host(seed)[0]), int(dev.host(offset)[0]))
        want = int(np.argmax(scores))
        out = int(dev.host(ops.pick_feed(dev.up(row), dev.up(np.array([temp], np.float32)), seed, offset,
                                         counter, ids, pos))[0])
        if temp == 0.0:
            assert out == want == hot, (step, out, want, hot)
        else:
            assert scores[out] >= scores[want] - 1e-5 * abs(scores[want]), (step, out, want)
        assert dev.host(ids)[0] == out and dev.host(pos)[0] == 101 + step
        assert dev.host(offset)[0] == 10 + step and dev.host(counter)[0] == 0
    if dev.on_gpu and v > 100000:
        L = dev.up(rnd(rng, 1, v, scale=3.0))
        times = {}
        for temp in (0.0, 0.7):
            T = dev.up(np.array([temp], np.float32))
            times[temp], _ = dev.best_time(lambda: ops.pick_feed(L, T, seed, offset, counter, ids, pos), graph=True)
        t_one, _ = dev.best_time(lambda: ops.argmax(L), graph=True)
        assert dev.host(counter)[0] == 0
        print(f"\nargmax of {v} logits: pick_feed {times[0.0] * 1e6:.1f} us (T = 0.7: {times[0.7] * 1e6:.1f} us), "
              f"one-block argmax {t_one * 1e6:.1f} us")


@pytest.mark.skipif(SIM, reason="4,000 launches: a GPU case")
def test_pick_feed_samples_the_softmax(dev, rng):
    """Gumbel-max at T > 0 draws from softmax(x / T): 4,000 picks of one 50-logit row (the
    offset advancing on the device) against the expected counts, chi-square at p ~ 1e-4."""
    ops = dev.fresh()
    v, n, temp = 50, 4000, 0.8
    row = rnd(rng, 1, v, scale=0.5)
    p = np.exp(row[0] / temp - (row[0] / temp).max())
    p /= p.sum()
    assert (n * p).min() >= 5.0                 # the chi-square approximation holds
    counter = dev.up(np.zeros(1, np.int32))
    ids, pos = dev.up(np.array([0], np.int32)), dev.up(np.array([0], np.int32))
    seed, offset = dev.up(np.array([12345], np.int64)), dev.up(np.array([0], np.int64))
    L, T = dev.up(row), dev.up(np.array([temp], np.float32))
    picks = np.array([int(dev.host(ops.pick_feed(L, T, seed, offset, counter, ids, pos))[0]) for _ in range(n)])
    counts = np.bincount(picks, minlength=v)
    expected = n * p
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 100.0, chi2                  # 49 degrees of freedom: P(chi2 > 100) ~ 2e-5
    assert dev.host(offset)[0] == n
