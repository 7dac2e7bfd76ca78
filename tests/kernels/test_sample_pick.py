"""The decode graph's sampler (kernels/sample_pick.py through ops.sample_pick) against its NumPy
mirror (penalized_ref / kept_ref / sample_pick_ref) and the host sampler (engine/sampler.py,
the reference): per row, the token, the kept set (from the selected threshold) and the feed-back
(ids, positions, offsets, token counts) over two steps, for every filter and penalty; the
radix-select path of flat rows; on the GPU, the sampled distribution against the host sampler's
(chi-square over thousands of draws) for each combination. Small shapes in the simulator."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ninfer_nb import SamplingParams
from ninfer_nb.engine.sampler import Sampler
from ninfer_nb.kernels import sample_pick as K
from tests.kernels.device import DEVICE_MARKS, SIM, shapes

pytestmark = DEVICE_MARKS

# (parameters, penalized): one row each
ROWS: list[dict[str, Any]] = [
    dict(temperature=0.0, presence_penalty=0.5, logit_bias={3: 5.0}),                     # greedy, penalized
    dict(temperature=0.7),                                                                # temperature alone
    dict(temperature=0.7, top_k=20, top_p=0.95, presence_penalty=1.0),                    # Qwen's defaults
    dict(temperature=1.0, top_p=0.8),
    dict(temperature=0.9, min_p=0.05),
    dict(temperature=1.2, top_k=50, min_p=0.1, repetition_penalty=1.3, frequency_penalty=0.5,
         logit_bias={7: -3.0, 11: 2.0}),
    dict(temperature=0.8, top_k=1),                                                        # greedy by top-k
    dict(temperature=0.6, top_k=5, top_p=0.5, min_p=0.2, repetition_penalty=0.8),
    dict(temperature=0.0, presence_penalty=0.5, mask=0.3),                               # greedy under a grammar
    dict(temperature=0.7, top_k=20, top_p=0.95, presence_penalty=1.0, mask=0.05),         # Qwen's, a narrow grammar
]


def _mask_words(frac: float, v: int, seed: int) -> np.ndarray:
    """A grammar's bitmask [ceil(v / 32)] int32 allowing about `frac` of the ids (at least one)."""
    allowed = np.random.default_rng([seed, v]).random(v) < frac
    allowed[seed % v] = True
    return np.packbits(np.append(allowed, np.zeros(-v % 32, bool)), bitorder="little").view("<i4").copy()


def _row_params(r: dict[str, Any], v: int, i: int) -> dict[str, Any]:
    """A row's set_row parameters (its mask fraction made a bitmask)."""
    return {**r, "mask": _mask_words(r["mask"], v, i)} if "mask" in r else r


def _penalized(r: dict[str, Any]) -> bool:
    return (r.get("presence_penalty", 0.0) != 0.0 or r.get("frequency_penalty", 0.0) != 0.0
            or r.get("repetition_penalty", 1.0) != 1.0)


def _ref_z(logits: np.ndarray, r: dict[str, Any], counts: np.ndarray) -> np.ndarray:
    t = 0.0 if r.get("top_k", 0) == 1 else r["temperature"]
    return K.penalized_ref(logits, t, r.get("repetition_penalty", 1.0), r.get("frequency_penalty", 0.0),
                           r.get("presence_penalty", 0.0), counts if _penalized(r) else None, r.get("logit_bias"),
                           r.get("mask"))


def _comp(z: np.ndarray) -> np.ndarray:
    """The kernels' composite key of every id (z descending, id ascending)."""
    bits = z.astype(np.float32).view(np.int32).astype(np.int64)
    key = np.where(bits >= 0, bits + 2**31, -1 - bits).astype(np.uint64)
    return (key << np.uint64(32)) | (np.uint64(0xFFFFFFFF) - np.arange(z.size, dtype=np.uint64))


def _run_rows(dev: Any, ops: Any, rows: list[dict[str, Any]], logits: np.ndarray, vocab: int,
              counts: np.ndarray, steps: int) -> np.ndarray:
    """Runs `steps` picks of the rows, checking each; the last step's sel [B, 2]."""
    from ninfer_nb.ops.cuda.sampling import SamplePickBuffers

    b = len(rows)
    rows = [_row_params(r, vocab, i) for i, r in enumerate(rows)]
    bufs = SamplePickBuffers(ops, b, vocab)
    seeds = [2**40 + 17 * i for i in range(b)]
    for i, r in enumerate(rows):
        bufs.set_row(i, seed=seeds[i], offset=5 + i, counts=counts[i] if _penalized(r) else None, **r)
    bufs.flush(b)
    ids = dev.up(np.zeros(b, np.int32))
    pos = dev.up(np.arange(b, dtype=np.int32) * 10)
    L = dev.up(logits)
    counts = counts.copy()
    for step in range(steps):
        out = dev.host(ops.sample_pick(L, vocab, bufs, ids, pos))
        sel = dev.host(bufs.sel)
        for i, r in enumerate(rows):
            z = _ref_z(logits[i, :vocab], r, counts[i])
            greedy = r["temperature"] == 0.0 or r.get("top_k", 0) == 1
            tok, kept = K.sample_pick_ref(z, 0.0 if greedy else r["temperature"], r.get("top_k", 0),
                                          r.get("top_p", 1.0), r.get("min_p", 0.0), seeds[i], 5 + i + step)
            if "mask" in r:                  # only ids the grammar allows
                assert np.isfinite(z[out[i]]), (step, i, out[i])
            if SIM or greedy:
                assert out[i] == tok, (step, i, out[i], tok)
            else:                      # the device's logf may differ from NumPy's in the last bit
                g = K.gumbel_ref(vocab, seeds[i], 5 + i + step)
                assert out[i] in kept and z[out[i]] + g[out[i]] >= z[tok] + g[tok] - 1e-5 * abs(z[tok] + g[tok])
            if not greedy and (0 < r.get("top_k", 0) < vocab or r.get("top_p", 1.0) < 1.0):
                # the kept prefix ends at the selected threshold's id (robust to last-bit z differences)
                assert int(np.uint64(0xFFFFFFFF) - (sel[i, 1] & np.uint64(0xFFFFFFFF))) == kept[-1], (step, i)
                if SIM:                            # and, bit for bit, the same kept set
                    e = np.exp(z - z.max()).astype(np.float32)
                    dev_kept = np.flatnonzero((e >= np.float32(r.get("min_p", 0.0))) & (_comp(z) >= sel[i, 1]))
                    np.testing.assert_array_equal(dev_kept, np.sort(kept), err_msg=f"step {step} row {i}")
            if _penalized(r):
                counts[i, out[i]] += 1
        np.testing.assert_array_equal(dev.host(ids), out)
    np.testing.assert_array_equal(dev.host(pos), np.arange(b) * 10 + steps)
    np.testing.assert_array_equal(dev.host(bufs.ipar)[:, K.I_OFFSET], 5 + np.arange(b) + steps)
    for i, r in enumerate(rows):
        if _penalized(r):
            np.testing.assert_array_equal(dev.host(bufs.counts)[i], counts[i])
    assert not dev.host(bufs.zmax).any() and not dev.host(bufs.best).any() and not dev.host(bufs.arrived).any()
    return sel


def _threads(ops: Any, dev: Any) -> Any:
    if not dev.on_gpu:                  # the simulator runs every thread in Python
        ops._pick_threads = ops._select_threads = 16
    return ops


@pytest.mark.parametrize("v,pad", shapes(sim=[(250, 6)], gpu=[(248077, 243), (151643, 0), (1000, 24)]))
def test_sample_pick_rows(dev, rng, v, pad):
    """Eight rows, each its own parameters (greedy with penalties and bias, temperature alone,
    Qwen's defaults, top-p, min-p, top-k + min-p + penalties + bias, top-k 1, all filters),
    two steps: tokens, kept sets, feed-back and counts as the NumPy mirror has them; a tie at
    the top of a filtered row goes to the lower id."""
    ops = _threads(dev.fresh(), dev)
    logits = (rng.standard_normal((len(ROWS), v + pad)) * 3.0).astype(np.float32)
    logits[2, 40] = logits[2, 41] = logits[2].max() + 0.5
    counts = (rng.random((len(ROWS), v)) < 0.05).astype(np.int32) * rng.integers(1, 3, (len(ROWS), v)).astype(np.int32)
    counts[:, : v // 3] |= np.where(rng.random((len(ROWS), v // 3)) < 0.1, K.PROMPT_BIT, 0).astype(np.int32)
    _run_rows(dev, ops, ROWS, logits, v, counts, steps=2)


@pytest.mark.parametrize("v", shapes(sim=[200], gpu=[248320]))
def test_sample_pick_flat_rows_radix_select(dev, rng, v, monkeypatch):
    """Rows whose candidate bins hold more than CAP tokens (a near-flat row under top-p, a
    top-k above CAP): the threshold comes from the one-block radix select, and matches."""
    if SIM:
        monkeypatch.setattr(K, "CAP", 16)        # the simulator reads the module's CAP at run time
        k_big = 40
    else:
        k_big = 3 * K.CAP
    ops = _threads(dev.fresh(), dev)
    rows = [dict(temperature=1.0, top_p=0.9), dict(temperature=0.8, top_k=k_big, top_p=0.7, presence_penalty=0.3),
            dict(temperature=1.0, top_k=k_big, min_p=0.5)]
    logits = (rng.standard_normal((len(rows), v)) * 0.05).astype(np.float32)
    counts = (rng.random((len(rows), v)) < 0.2).astype(np.int32)
    sel = _run_rows(dev, ops, rows, logits, v, counts, steps=1)
    assert (sel[:, 0] == K.SEL_FULL).all(), sel


COMBOS: list[dict[str, Any]] = [
    dict(temperature=0.7),
    dict(temperature=0.7, top_k=20, top_p=0.95, presence_penalty=1.0),
    dict(temperature=1.0, top_k=8),
    dict(temperature=1.0, top_p=0.8),
    dict(temperature=0.9, min_p=0.1),
    dict(temperature=1.1, top_k=12, top_p=0.9, min_p=0.05),
    dict(temperature=0.8, frequency_penalty=0.7, presence_penalty=0.2),
    dict(temperature=1.3, repetition_penalty=1.5, top_p=0.9),
    dict(temperature=1.0, top_k=30, logit_bias={5: 3.0, 9: -100.0}),
    dict(temperature=0.7, top_k=20, top_p=0.95, presence_penalty=1.0, mask=0.4),
    dict(temperature=1.0, min_p=0.05, mask=0.2),
]


class FixedGrammar:
    """A grammar that allows the same ids at every step (a Matcher's interface, for the picks)."""

    def __init__(self, words: np.ndarray) -> None:
        self.mask = words
        self.words = words.shape[0]

    def allowed_tokens(self) -> np.ndarray:
        return self.mask.copy()

    def advance(self, token: int) -> None:
        pass


@pytest.mark.skipif(SIM, reason="thousands of draws: a GPU case (the simulator checks tokens one by one)")
@pytest.mark.parametrize("combo", COMBOS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_sample_pick_draws_the_host_distribution(dev, rng, combo):
    """4,000 rows of one 64-logit row, each its own seed, one step: the token frequencies
    against the host sampler's `distribution` (the reference) with the same prompt and
    generated history, chi-square (bins expected >= 5 times, the rest pooled; p ~ 1e-4)."""
    from ninfer_nb.engine.device_pick import DevicePicker

    ops = dev.fresh()
    v, n = 64, 4000
    row = (rng.standard_normal(v) * 1.5).astype(np.float32)
    prompt = rng.choice(v, 10, replace=False)
    generated = {int(t): int(c) for t, c in zip(rng.choice(v, 6, replace=False), rng.integers(1, 4, 6))}
    grammar = FixedGrammar(_mask_words(combo["mask"], v, 1)) if "mask" in combo else None
    params = SamplingParams(**{k: (tuple(val.items()) if k == "logit_bias" else val) for k, val in combo.items()
                               if k != "mask"})
    host = Sampler(params, v, prompt_ids=prompt.tolist(), matcher=grammar)  # type: ignore[arg-type]
    host.counts.update(generated)
    ids, probs = host.distribution(row)
    want = np.zeros(v)
    want[ids] = probs
    dp = host.device_sample()
    assert dp is not None
    picker = DevicePicker(ops, n, v)
    picker.write([dp._replace(seed=int(s)).at(3) for s in rng.integers(0, 2**62, n)])
    out = dev.host(ops.sample_pick(dev.up(np.tile(row, (n, 1))), v, picker.bufs, dev.up(np.zeros(n, np.int32)),
                                   dev.up(np.zeros(n, np.int32))))
    got = np.bincount(out, minlength=v)
    assert got[want == 0].sum() == 0, np.flatnonzero(got * (want == 0))
    big = want * n >= 5
    obs = np.append(got[big], got[~big].sum())
    exp = np.append(want[big] * n, want[~big].sum() * n)
    if exp[-1] < 5:
        obs, exp = obs[:-1], exp[:-1]
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    assert chi2 < 3 * len(exp) + 30, (chi2, len(exp))


@pytest.mark.parametrize("v,pad,n_top", shapes(sim=[(300, 5, 5)], gpu=[(248077, 243, 20), (151643, 0, 5), (1000, 0, 0)]))
def test_token_logprobs(dev, rng, v, pad, n_top):
    """ops.token_logprobs (kernels/logprobs.py) vs token_logprobs_ref: each row's token's
    logprob and its top-N alternatives under the raw logits, ties at the top to the lower id."""
    from ninfer_nb.kernels.logprobs import token_logprobs_ref

    ops = dev.fresh()
    if not dev.on_gpu:
        ops._lp_threads = 16
    logits = (rng.standard_normal((3, v + pad)) * 4.0).astype(np.float32)
    logits[1, 7] = logits[1, 70] = logits[1].max() + 1.0
    tokens = np.array([0, 70, v - 1], np.int32)
    out, ids = ops.token_logprobs(dev.up(logits), v, dev.up(tokens), n_top)
    want, want_ids = token_logprobs_ref(logits, v, tokens, n_top)
    np.testing.assert_allclose(dev.host(out), want, atol=2e-5, rtol=1e-5)
    if n_top:
        np.testing.assert_array_equal(dev.host(ids), want_ids)


@pytest.mark.parametrize("v", shapes(sim=[200], gpu=[248320]))
def test_device_picker_masks_after_the_params(dev, rng, v):
    """DevicePicker.write(masks=False) then write_masks_async (a split round: the grammar rows'
    bitmasks uploaded while the forward runs): each grammar row picks inside its mask, as the
    host sampler would (greedy: its argmax; sampled: a kept id), the free row as without one."""
    from ninfer_nb.engine.device_pick import DevicePicker

    ops = _threads(dev.fresh(), dev)
    rows = [dict(temperature=0.0, mask=0.2), dict(temperature=0.0),
            dict(temperature=0.7, top_k=20, top_p=0.95, presence_penalty=1.0, mask=0.1)]
    logits = (rng.standard_normal((len(rows), v)) * 3.0).astype(np.float32)
    grammars = [FixedGrammar(_mask_words(r["mask"], v, i)) if "mask" in r else None for i, r in enumerate(rows)]
    picks = []
    for r, g in zip(rows, grammars):
        params = SamplingParams(**{k: val for k, val in r.items() if k != "mask"})
        dp = Sampler(params, v, matcher=g).device_sample()   # type: ignore[arg-type]
        assert dp is not None and (g is None or dp.filters.matcher is g)
        picks.append(dp.at(2))
    picker = DevicePicker(ops, 8, v)
    picker.write(picks, masks=False)
    picker.write_masks_async(picks)
    out = dev.host(ops.sample_pick(dev.up(logits), v, picker.bufs, dev.up(np.zeros(3, np.int32)),
                                   dev.up(np.zeros(3, np.int32))))
    for i, (r, g) in enumerate(zip(rows, grammars)):
        z = K.penalized_ref(logits[i], r["temperature"], 1.0, 0.0, 0.0, None, None,
                            g.mask if g is not None else None)
        if r["temperature"] == 0.0:
            assert out[i] == int(np.argmax(z)), i
        else:
            assert np.isfinite(z[out[i]]) and out[i] in K.kept_ref(z, 20, 0.95, 0.0), i
