"""N-gram speculative decoding on the CPU: the prompt-lookup proposer, the acceptance rule
(greedy exact match; rejection sampling that keeps the target distribution), exact rollback of
the caches, and greedy speculative output equal to plain greedy output on the tiny hybrid, MoE
and Llama checkpoints and on SmolLM2, for every K."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ninfer_nb import LLM, SamplingParams
from ninfer_nb.engine.generator import RUNNING_SLOT, VERIFY_SNAPSHOT, Generator, draft_ring_size
from ninfer_nb.engine.request import Request
from ninfer_nb.engine.sampler import Sampler
from ninfer_nb.engine.spec.ngram import NgramProposer
from ninfer_nb.engine.spec.stats import SpecStats
from ninfer_nb.engine.spec.verify import accept_one_hot, verify_drafts
from ninfer_nb.models.state import GDNSlots, KVCache

PASSAGE = [11, 220, 3405, 90, 17, 4088, 512, 73, 1999, 64, 301, 77, 5]
PROMPT = PASSAGE + [9, 8] + PASSAGE + [9, 8] + PASSAGE[:4]     # a passage repeated: drafts match


# --- proposer ---------------------------------------------------------------------------------
def test_proposer_drafts_what_followed_the_longest_latest_match() -> None:
    ngram = NgramProposer(max_n=3, min_n=1)
    assert ngram.propose([1, 2, 3, 4, 5, 1, 2, 3], 2) == [4, 5]
    # the longest suffix wins over a later shorter match: [7, 3] occurs once, 3 alone later
    assert ngram.propose([7, 3, 9, 3, 6, 7, 3], 1) == [9]
    # of several occurrences of the suffix, the latest one drafts
    assert ngram.propose([5, 1, 5, 2, 5], 1) == [2]
    assert ngram.propose([1, 2, 3, 1, 2], 5) == [3, 1, 2]           # up to the end of the sequence
    assert ngram.propose([1, 2, 3, 4], 3) == []                     # no earlier occurrence
    assert ngram.propose([4], 3) == [] and ngram.propose([1, 1], 0) == []


def test_proposer_min_n_refuses_short_matches() -> None:
    assert NgramProposer(max_n=3, min_n=2).propose([1, 2, 3, 9, 3], 2) == []
    assert NgramProposer(max_n=3, min_n=2).propose([1, 3, 2, 9, 3, 2], 2) == [9, 3]
    with pytest.raises(ValueError):
        NgramProposer(max_n=1, min_n=2)


# --- acceptance -------------------------------------------------------------------------------
def test_greedy_verify_keeps_the_matching_prefix_and_adds_the_argmax() -> None:
    rows = np.full((4, 10), -5.0, dtype=np.float32)
    for i, best in enumerate([3, 7, 1, 6]):
        rows[i, best] = 5.0
    greedy = SamplingParams(temperature=0.0)
    assert verify_drafts([3, 7, 1], rows, Sampler(greedy, 10)) == [3, 7, 1, 6]     # all kept + bonus
    assert verify_drafts([3, 2, 1], rows, Sampler(greedy, 10)) == [3, 7]           # corrected at 2
    assert verify_drafts([0, 7, 1], rows, Sampler(greedy, 10)) == [3]              # reject all
    with pytest.raises(ValueError):
        verify_drafts([3], rows, Sampler(greedy, 10))


def _chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a token outside the target's support was emitted"
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


# 99.9th percentile of chi-square with 5..7 degrees of freedom is 20.5..24.3
CHI2_LIMIT = 24.3


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.9, seed=1),
    SamplingParams(temperature=1.3, top_k=6, top_p=0.9, min_p=0.02, seed=2),
], ids=["temperature", "top_k_top_p_min_p"])
@pytest.mark.parametrize("draft", [0, 2, 7], ids=["likely", "middling", "outside"])
def test_rejection_sampling_keeps_the_target_distribution(params: SamplingParams, draft: int) -> None:
    """The first emitted token of a round is distributed as plain sampling's (the host
    sampler's filtered distribution), whatever the one-hot draft; chi-square over 20000 draws."""
    row = np.array([3.0, 0.5, 1.5, 1.0, -1.0, 0.2, 2.2, -6.0], dtype=np.float32)
    sampler = Sampler(params, row.shape[0])
    ids, probs = sampler.distribution(row)
    target = np.zeros(row.shape[0])
    target[ids] = probs
    counts = np.zeros(row.shape[0])
    for _ in range(20000):
        counts[accept_one_hot(draft, ids, probs, sampler.rng)] += 1
    assert _chi_square(counts, target) < CHI2_LIMIT


def test_rejection_sampling_of_a_round_matches_plain_sampling_jointly() -> None:
    """Two-draft rounds: the pair (first, second) of tokens emitted matches two plain samples
    (penalties make the second row depend on the first token)."""
    rows = np.array([[2.0, 1.0, 0.0, 0.5], [0.0, 1.5, 1.0, 0.2], [1.0, 0.0, 0.3, 0.9]], dtype=np.float32)
    params = SamplingParams(temperature=1.0, presence_penalty=1.0)       # seeded per draw below
    plain, spec = np.zeros((4, 4)), np.zeros((4, 4))
    for i in range(12000):
        s = Sampler(params, 4, seed=i)
        a = s.sample(rows[0])
        s.observe(a)
        plain[a, s.sample(rows[1])] += 1
        s = Sampler(params, 4, seed=10**6 + i)
        got = verify_drafts([0, 1], rows, s)
        if len(got) == 1:                   # the first draft was replaced: the next round samples row 1
            got.append(s.sample(rows[1]))
        spec[got[0], got[1]] += 1
    p = plain.ravel() / plain.sum()
    assert _chi_square(spec.ravel(), p) < 37.7           # 99.9th percentile, 15 degrees of freedom


# --- the engine ---------------------------------------------------------------------------------
def _greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def _generate(llm: LLM, prompt: list[int], params: SamplingParams) -> list[int]:
    request = Request("r", prompt, params)
    llm.engine.add_request(request)
    while not request.finished:
        llm.engine.step()
    return request.output_ids


class _CorruptedOracle:
    """Drafts the plain run's own continuation with every `every`-th token wrong, so rounds
    accept all, some and none of their drafts (random tiny models rarely repeat themselves,
    so n-gram lookup alone would seldom draft)."""

    def __init__(self, prompt: list[int], plain: list[int], every: int) -> None:
        self.prompt, self.plain, self.every = prompt, plain, every

    def propose(self, tokens: list[int], k: int) -> list[int]:
        n = len(tokens) - len(self.prompt)
        drafts = self.plain[n : n + k]
        return [t + 1 if (n + i) % self.every == 0 else t for i, t in enumerate(drafts)]


@pytest.mark.parametrize("model", ["tiny_qwen35_dir", "tiny_qwen35_moe_dir", "tiny_llama_dir"])
def test_greedy_spec_output_equals_plain_for_every_k(model: str, request: pytest.FixtureRequest) -> None:
    """N-gram drafts and corrupted-oracle drafts (full, partial and no acceptance) both give the
    plain greedy tokens, for K = 1, 3, 5."""
    path = str(request.getfixturevalue(model))
    plain = _generate(LLM(path, device="cpu", max_context=96, prefill_chunk=16), PROMPT, _greedy(24))
    for k in (1, 3, 5):
        llm = LLM(path, device="cpu", max_context=96, prefill_chunk=16, spec="ngram", draft_tokens=k)
        assert _generate(llm, PROMPT, _greedy(24)) == plain, f"ngram K={k}"
        llm.engine.proposer = _CorruptedOracle(PROMPT, plain, every=3)
        llm.engine.spec_stats = SpecStats()
        assert _generate(llm, PROMPT, _greedy(24)) == plain, f"oracle K={k}"
        stats = llm.engine.spec_stats
        assert stats.rounds > 0 and stats.emitted == stats.rounds + stats.accepted
        assert 0 < stats.accepted < stats.drafted


def test_one_sequence_greedy_spec_equals_plain_with_the_snapshot_ring(tiny_qwen35_dir: Path) -> None:
    """The one-sequence path (per-token GDN snapshots; full, partial and no acceptance from a
    corrupted oracle) gives the plain greedy tokens for K = 1 and 3."""
    plain = _generate(LLM(str(tiny_qwen35_dir), device="cpu", max_context=96, prefill_chunk=16,
                          max_concurrency=1), PROMPT, _greedy(24))
    llm = LLM(str(tiny_qwen35_dir), device="cpu", max_context=96, prefill_chunk=16, spec="ngram",
              draft_tokens=3, max_concurrency=1)
    assert len(llm.engine.generator._ring) == draft_ring_size(3)
    for k in (1, 3):
        llm.engine.proposer, llm.engine.draft_tokens = _CorruptedOracle(PROMPT, plain, every=3), k
        llm.engine.spec_stats = SpecStats()
        assert _generate(llm, PROMPT, _greedy(24)) == plain, f"K={k}"
        stats = llm.engine.spec_stats
        assert stats.rounds > 0 and 0 < stats.accepted < stats.drafted


def test_paged_first_lane_rolls_back_by_snapshots(tiny_qwen35_dir: Path) -> None:
    """Batched lanes: the first lane has the snapshot ring (after the prefix cache's slots), so a
    request running alone there keeps the plain greedy tokens with one forward per round (two
    where every draft was rejected: the last token runs again, exactly)."""
    plain = _generate(LLM(str(tiny_qwen35_dir), device="cpu", max_context=96, prefill_chunk=16,
                          max_concurrency=1), PROMPT, _greedy(20))
    llm = LLM(str(tiny_qwen35_dir), device="cpu", max_context=96, prefill_chunk=16, spec="ngram",
              draft_tokens=3, max_concurrency=2)
    lanes = llm.engine.scheduler.lanes
    assert len(lanes[0]._ring) == draft_ring_size(3) and not lanes[1]._ring
    assert lanes[0]._ring[-1] == lanes[0].slots.num_slots - 1
    llm.engine.proposer = _CorruptedOracle(PROMPT, plain, every=3)
    calls = _counting(lanes[0])
    assert _generate(llm, PROMPT, _greedy(20)) == plain
    stats = llm.engine.spec_stats
    assert 0 < stats.accepted < stats.drafted
    rejected_all = stats.rounds - stats.accepted_at[0]           # only those run a token again
    assert len(calls) == stats.rounds + rejected_all          # partial accepts ran nothing again


class _RepeatTail:
    """Drafts the last k tokens again: always a draft, rarely a right one."""

    def propose(self, tokens: list[int], k: int) -> list[int]:
        return tokens[-k:]


def test_spec_sampled_request_runs_seeded_and_within_budget(tiny_qwen35_dir: Path) -> None:
    params = SamplingParams(max_tokens=20, temperature=0.8, top_k=30, seed=7, ignore_eos=True)
    llm = LLM(str(tiny_qwen35_dir), device="cpu", max_context=96, prefill_chunk=16, spec="ngram", draft_tokens=4)
    llm.engine.proposer = _RepeatTail()
    first = _generate(llm, PROMPT, params)
    assert len(first) == 20 and llm.engine.spec_stats.rounds > 0
    assert _generate(llm, PROMPT, params) == first          # a seed reproduces the tokens


def _state_bytes(llm: LLM, rows: int) -> list[bytes]:
    """KV rows 0..rows-1 and the running GDN slot of every layer, as bytes."""
    out = []
    for layer in llm.engine.generator.state.layers:
        if isinstance(layer, KVCache):
            out += [layer.k[:rows].tobytes(), layer.v[:rows].tobytes()]
        else:
            assert isinstance(layer, GDNSlots)
            s = layer.slot(RUNNING_SLOT)
            out += [s.conv.tobytes(), s.recurrent.tobytes()]
    return out


def test_reject_all_leaves_the_state_byte_identical(tiny_qwen35_dir: Path) -> None:
    """Verify [last, 4 wrong drafts], keep only the last token: every KV row in the sequence and
    every GDN conv / recurrent state equals a run that decoded the last token plainly."""
    runs = []
    for drafting in (False, True):
        llm = LLM(str(tiny_qwen35_dir), device="cpu", max_context=96, prefill_chunk=16,
                  spec="ngram", draft_tokens=4, max_concurrency=1)      # the one-sequence path
        gen = llm.engine.generator
        logits, _ = gen.prefill(PROMPT)
        last = int(np.argmax(logits))
        if drafting:
            gen.verify([last, 1, 2, 3, 4])
            gen.rollback(1)
        else:
            gen.decode(last)
        assert gen.tokens == PROMPT + [last]
        runs.append(_state_bytes(llm, len(gen.tokens)))
        if drafting:          # the running slot, two prefix snapshots, the verify's and the ring
            assert gen.slots.num_slots == VERIFY_SNAPSHOT + 1 + draft_ring_size(4)
    assert runs[0] == runs[1]


def _counting(gen: Generator) -> list[int]:
    """Wrap the generator's backend verify_step: the token counts of the forwards it runs."""
    calls: list[int] = []
    inner = gen.backend.verify_step

    def verify_step(forward, tokens, position, vocab=0):  # type: ignore[no-untyped-def]
        calls.append(len(tokens))
        return inner(forward, tokens, position, vocab)

    gen.backend.verify_step = verify_step  # type: ignore[method-assign]
    return calls


def test_partial_acceptance_takes_the_state_from_the_snapshot_ring(tiny_qwen35_dir: Path) -> None:
    """Keep 3 of 5 verified tokens: no forward runs again, the running GDN slot is the ring's
    snapshot after the third token (bit for bit), and the caches hold the same as a run that
    verified exactly those 3 tokens (to rounding: other matrix shapes)."""
    states, nexts = [], []
    for fed in ([5, 6, 7, 8, 9], [5, 6, 7]):
        llm = LLM(str(tiny_qwen35_dir), device="cpu", max_context=96, prefill_chunk=16,
                  spec="ngram", draft_tokens=4, max_concurrency=1)
        gen = llm.engine.generator
        gen.prefill(PROMPT)
        calls = _counting(gen)
        gen.verify(fed)
        snaps = list(gen._verify_snaps or [])
        assert len(snaps) == len(fed) and RUNNING_SLOT not in snaps
        gen.rollback(3)
        assert calls == [len(fed)] and gen.tokens == PROMPT + [5, 6, 7]
        layers = gen.state.gdn_layers()
        for layer in layers:
            assert layer.slot(RUNNING_SLOT).recurrent.tobytes() == layer.slot(snaps[2]).recurrent.tobytes()
            assert layer.slot(RUNNING_SLOT).conv.tobytes() == layer.slot(snaps[2]).conv.tobytes()
        states.append(np.concatenate([layer.slot(RUNNING_SLOT).recurrent.ravel() for layer in layers]))
        nexts.append(gen.decode(11))
    np.testing.assert_allclose(states[0], states[1], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(nexts[0], nexts[1], rtol=1e-4, atol=1e-5)


def test_reject_all_after_a_full_accept_is_exact(tiny_qwen35_dir: Path) -> None:
    """A round that keeps everything leaves its last snapshot as the state before the next
    verify (no copy); rejecting all of the next round's drafts restores it and runs the last
    token alone: the same bytes as a plain step of that token after the first round."""
    runs = []
    for drafting in (False, True):
        llm = LLM(str(tiny_qwen35_dir), device="cpu", max_context=96, prefill_chunk=16,
                  spec="ngram", draft_tokens=4, max_concurrency=1)
        gen = llm.engine.generator
        gen.prefill(PROMPT)
        gen.verify([5, 6, 7])
        gen.rollback(3)
        if drafting:
            copies = []
            inner = gen.slots.copy
            gen.slots.copy = lambda dst, src: (copies.append((dst, src)), inner(dst, src))[1]  # type: ignore[method-assign]
            gen.verify([12, 1, 2, 3])
            assert not copies                               # the state before it was in the ring already
            gen.rollback(1)
            assert len(copies) == 1 and copies[0][0] == RUNNING_SLOT
        else:
            gen.decode(12)
        assert gen.tokens == PROMPT + [5, 6, 7, 12]
        runs.append(_state_bytes(llm, len(gen.tokens)))
    assert runs[0] == runs[1]


def test_verify_beyond_the_ring_copies_and_reruns(tiny_qwen35_dir: Path) -> None:
    """More drafts than the ring holds: the state before the verify is copied and the kept
    tokens run again (the verify without snapshots); the result matches plain decode."""
    llm = LLM(str(tiny_qwen35_dir), device="cpu", max_context=96, prefill_chunk=16,
              spec="ngram", draft_tokens=1, max_concurrency=1)
    gen = llm.engine.generator
    n = draft_ring_size(3)                 # the ring of draft_tokens = max(1, 3): verifies of <= 4 tokens
    assert len(gen._ring) == n
    gen.prefill(PROMPT)
    calls = _counting(gen)
    gen.verify(list(range(5, 5 + n)))
    assert gen._verify_snaps is None
    gen.rollback(2)
    assert calls == [n, 2]


def test_partial_acceptance_rolls_back_to_the_kept_tokens(tiny_qwen35_dir: Path) -> None:
    """Keep 3 of 5 verified tokens: the caches hold those 3, and the next logits equal those
    of a run fed them plainly (to rounding: the kept tokens ran as one chunk)."""
    logits = []
    for drafting in (False, True):
        llm = LLM(str(tiny_qwen35_dir), device="cpu", max_context=96, prefill_chunk=16,
                  spec="ngram", draft_tokens=4)
        gen = llm.engine.generator
        gen.prefill(PROMPT)
        if drafting:
            gen.verify([5, 6, 7, 8, 9])
            gen.rollback(3)
        else:
            for t in (5, 6, 7):
                gen.decode(t)
        assert gen.tokens == PROMPT + [5, 6, 7]
        logits.append(gen.decode(11))
    np.testing.assert_allclose(logits[1], logits[0], rtol=1e-4, atol=1e-5)


def test_smollm_greedy_spec_equals_plain_on_a_repeated_passage() -> None:
    """The real model (SmolLM2, the default checkpoint) on a passage it has repeated twice and
    begun a third time: n-gram drafts are mostly accepted, and the greedy output is the plain
    one for K = 2 and 5."""
    llm = LLM(None, device="cpu", max_context=512, spec="ngram", draft_tokens=5)
    passage = ("The old mill by the river ground flour for the village for two hundred years, "
               "until the water wheel broke in the great flood of the spring.")
    prompt = llm.tokenizer.encode(f"{passage}\n{passage}\n{passage[:40]}")     # copying continues
    engine, proposer = llm.engine, llm.engine.proposer
    engine.proposer = None
    plain = _generate(llm, prompt, _greedy(32))
    for k in (2, 5):
        llm.engine.forget()
        engine.proposer, engine.draft_tokens, engine.spec_stats = proposer, k, SpecStats()
        assert _generate(llm, prompt, _greedy(32)) == plain, f"K={k}"
        assert engine.spec_stats.accepted > engine.spec_stats.rounds      # more than one kept per round


def test_a_request_can_opt_out_of_speculation(tiny_qwen35_dir: Path) -> None:
    """SamplingParams(speculative=False): the request decodes plainly in a speculating engine
    (no verify round), with the plain tokens."""
    llm = LLM(str(tiny_qwen35_dir), device="cpu", max_context=96, prefill_chunk=16, spec="ngram",
              draft_tokens=3, max_concurrency=1)
    llm.engine.proposer = _RepeatTail()
    plain = _generate(llm, PROMPT, _greedy(12).replace(speculative=False))
    assert llm.engine.spec_stats.rounds == 0
    assert _generate(llm, PROMPT, _greedy(12)) == plain and llm.engine.spec_stats.rounds > 0


def test_adaptive_k_follows_the_acceptance() -> None:
    from ninfer_nb.engine.spec.adaptive import AdaptiveK

    a = AdaptiveK(max_k=5)
    assert a.next_k() == 5
    for _ in range(6):
        a.record(a.next_k(), 0)              # nothing kept: down to one draft
    assert a.next_k() == 1
    for _ in range(12):
        a.record(a.next_k(), a.next_k())     # everything kept: back up to the maximum
    assert a.next_k() == 5


def test_adaptive_k_keeps_the_plain_output(tiny_qwen35_dir: Path) -> None:
    from ninfer_nb.engine.spec.adaptive import AdaptiveK

    plain = _generate(LLM(str(tiny_qwen35_dir), device="cpu", max_context=96, prefill_chunk=16,
                          max_concurrency=1), PROMPT, _greedy(20))
    llm = LLM(str(tiny_qwen35_dir), device="cpu", max_context=96, prefill_chunk=16, spec="ngram",
              draft_tokens=4, max_concurrency=1)
    llm.engine.proposer, llm.engine.adaptive = _CorruptedOracle(PROMPT, plain, every=4), AdaptiveK(4)
    assert _generate(llm, PROMPT, _greedy(20)) == plain
    s = llm.engine.spec_stats
    assert s.rounds > 0 and s.drafted < 4 * s.rounds            # K went below the maximum


def test_cpu_gdn_decode_snapshots_hold_each_tokens_state() -> None:
    """ops.cpu.gdn_decode(snapshots=): slot snapshots[t] holds the conv and recurrent state after
    token t, as the token-by-token run leaves it; -1 writes nothing; outputs unchanged."""
    from ninfer_nb.ops import cpu

    rng = np.random.default_rng(3)
    hk, hv, dk, dv, t = 1, 2, 32, 16, 3
    c = 2 * hk * dk + hv * dv

    def r(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    conv_w, al, dtb, nw = r(c, 4, scale=0.5), r(hv, scale=0.5), r(hv), r(dv)
    conv, state = r(5, 3, c), r(5, hv, dv, dk, scale=0.1)
    mixed, z, a, b = r(t, c), r(t, hv * dv), r(t, hv), r(t, hv)
    snaps = np.array([3, -1, 4], np.int32)
    conv_ref, state_ref = conv.copy(), state.copy()
    want = cpu.gdn_decode(mixed[:1], z[:1], a[:1], b[:1], conv_ref[1], conv_w, al, dtb, state_ref[1], nw, 1e-6, hk)
    after0 = (conv_ref[1].copy(), state_ref[1].copy())
    got = cpu.gdn_decode(mixed, z, a, b, conv, conv_w, al, dtb, state, nw, 1e-6, hk,
                         slots=np.array([1], np.int32), snapshots=snaps)
    assert np.array_equal(got[:1], want)
    assert np.array_equal(conv[3], after0[0]) and np.array_equal(state[3], after0[1])
    assert np.array_equal(conv[4], conv[1]) and np.array_equal(state[4], state[1])      # the last: the slot's
    assert np.array_equal(conv[0], conv_ref[0]) and np.array_equal(state[2], state_ref[2])   # others untouched
