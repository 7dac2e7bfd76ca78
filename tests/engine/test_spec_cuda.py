"""Speculative decoding on the CUDA backend: the verify round (a graph per K + 1) and the
rollback give the plain greedy tokens for every K, the oracle drafter is accepted in full, and
rejecting every draft leaves the KV rows and GDN state byte-identical to a plain step. Random
tiny presets (built on the device: no checkpoint files needed on the GPU machine)."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer_nb import LLM
from ninfer_nb.engine.generator import RUNNING_SLOT
from ninfer_nb.engine.request import Request
from ninfer_nb.engine.spec.oracle import OracleProposer
from ninfer_nb.engine.spec.stats import SpecStats
from ninfer_nb.models.state import GDNSlots, KVCache
from ninfer_nb.params import SamplingParams

pytestmark = pytest.mark.gpu

PROMPT = [int(t) for t in np.random.default_rng(5).integers(100, 240000, 40)]


def _llm(preset: str, k: int = 3, concurrency: int | None = 1) -> LLM:
    """concurrency None: the default (batched lanes: a request alone speculates in the first)."""
    return LLM(f"random:{preset}", device="cuda", max_context=160, spec="ngram", draft_tokens=k,
               max_concurrency=concurrency)


def _generate(llm: LLM, n: int) -> list[int]:
    request = Request("r", PROMPT, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    llm.engine.forget()
    llm.engine.add_request(request)
    while not request.finished:
        llm.engine.step()
    return request.output_ids


class _Corrupted:
    """The oracle's drafts with every `every`-th one wrong: full, partial and no acceptance."""

    def __init__(self, plain: list[int], every: int) -> None:
        self.plain, self.every = plain, every

    def propose(self, tokens: list[int], k: int) -> list[int]:
        n = len(tokens) - len(PROMPT)
        return [t + 1 if (n + i) % self.every == 0 else t for i, t in enumerate(self.plain[n : n + k])]


@pytest.mark.parametrize("concurrency", [1, None])
@pytest.mark.parametrize("preset", ["tiny-qwen3.5", "tiny-qwen3.5-moe"])
def test_cuda_greedy_spec_equals_plain_for_every_k(preset: str, concurrency: int | None) -> None:
    llm = _llm(preset, concurrency=concurrency)
    assert (llm.max_concurrency > 1) == (concurrency is None)
    engine = llm.engine
    engine.proposer = None
    plain = _generate(llm, 40)
    for k in (1, 3, 5):
        engine.draft_tokens = k
        engine.proposer, engine.spec_stats = OracleProposer(tuple(PROMPT), tuple(plain)), SpecStats()
        assert _generate(llm, 40) == plain, f"oracle K={k}"
        assert engine.spec_stats.acceptance == 1.0 and engine.spec_stats.rounds > 0
        engine.proposer, engine.spec_stats = _Corrupted(plain, every=3), SpecStats()
        assert _generate(llm, 40) == plain, f"corrupted oracle K={k}"
        s = engine.spec_stats
        assert 0 < s.accepted < s.drafted


def _state_bytes(llm: LLM, rows: int) -> list[bytes]:
    out = []
    b = llm.backend
    for layer in llm.engine.generator.state.layers:
        if isinstance(layer, KVCache):
            out += [b.to_host(layer.k)[:rows].tobytes(), b.to_host(layer.v)[:rows].tobytes()]
        else:
            assert isinstance(layer, GDNSlots)
            s = layer.slot(RUNNING_SLOT)
            out += [b.to_host(s.conv).tobytes(), b.to_host(s.recurrent).tobytes()]
    return out


def test_cuda_reject_all_leaves_the_state_byte_identical() -> None:
    """Plain step of the last token, then (twice: eager, then the captured graphs) a verify of
    [last, 4 wrong drafts] rolled back to the last token: the same bytes every time."""
    llm = _llm("tiny-qwen3.5", k=4)
    gen = llm.engine.generator
    runs = []
    for drafting in (False, True, True, True):
        gen.forget()
        logits, _ = gen.prefill(PROMPT)
        last = int(np.argmax(logits[: llm.valid_vocab]))
        if drafting:
            gen.verify([last, 1, 2, 3, 4], llm.valid_vocab)
            gen.rollback(1)
        else:
            gen.decode(last)
        assert gen.tokens == PROMPT + [last]
        runs.append(_state_bytes(llm, len(gen.tokens)))
    assert runs[1] == runs[0] and runs[2] == runs[0] and runs[3] == runs[0]


@pytest.mark.parametrize("preset", ["tiny-qwen3.5", "tiny-qwen3.5-moe"])
def test_cuda_mtp_greedy_spec_equals_plain(preset: str) -> None:
    """The presets' random MTP head drafts on the device (eagerly, between the verify graphs):
    greedy output equal to plain greedy output for K = 1 and 3, drafts verified every round."""
    llm = LLM(f"random:{preset}", device="cuda", max_context=160, spec="mtp", draft_tokens=3)
    engine = llm.engine
    proposer = engine.proposer
    engine.proposer = None
    plain = _generate(llm, 40)
    for k in (1, 3):
        engine.proposer, engine.draft_tokens, engine.spec_stats = proposer, k, SpecStats()
        assert _generate(llm, 40) == plain, f"mtp K={k}"
        assert engine.spec_stats.rounds > 0 and engine.spec_stats.plain_steps <= 1


def test_cuda_partial_accept_restores_the_ring_snapshot() -> None:
    """A verify of 5 tokens keeping 3 (twice: eager, then the captured graph): no forward runs
    again, the running GDN slot holds the head kernel's snapshot after the third token, and the
    next logits match a run that decoded those 3 tokens plainly (to rounding: other kernels)."""
    llm = _llm("tiny-qwen3.5", k=4)
    gen = llm.engine.generator
    assert len(gen._ring) == 6
    nexts = []
    for drafting in (False, True, True, True):
        gen.forget()
        gen.prefill(PROMPT)
        if drafting:
            calls: list[int] = []
            inner = gen.backend.verify_step
            gen.backend.verify_step = lambda f, t, p, v=0: (calls.append(len(t)), inner(f, t, p, v))[1]
            try:
                gen.verify([5, 6, 7, 8, 9], llm.valid_vocab)
                snaps = list(gen._verify_snaps or [])
                gen.rollback(3)
            finally:
                del gen.backend.verify_step
            assert calls == [5] and len(snaps) == 5
            for layer in gen.state.gdn_layers():
                run, snap = layer.slot(RUNNING_SLOT), layer.slot(snaps[2])
                assert llm.backend.to_host(run.recurrent).tobytes() == llm.backend.to_host(snap.recurrent).tobytes()
                assert llm.backend.to_host(run.conv).tobytes() == llm.backend.to_host(snap.conv).tobytes()
        else:
            for t in (5, 6, 7):
                gen.decode(t)
        assert gen.tokens == PROMPT + [5, 6, 7]
        nexts.append(gen.decode(11))
    for other in nexts[1:]:
        np.testing.assert_allclose(other, nexts[0], rtol=2e-3, atol=2e-3)


def test_cuda_mtp_takes_the_kept_hiddens_from_the_verify_graph() -> None:
    """A partial accept by snapshot rollback runs no forward after the verify: the MTP
    proposer's hidden store takes the kept positions' rows from the verify's own replay (eager,
    captured and replayed rounds agree)."""
    llm = LLM("random:tiny-qwen3.5", device="cuda", max_context=160, spec="mtp", draft_tokens=4, max_concurrency=1)
    gen, proposer = llm.engine.generator, llm.engine.proposer
    start, got = len(PROMPT), []
    for _ in range(3):                                     # eager, captured, replayed
        gen.forget()
        gen.prefill(PROMPT)
        proposer.hiddens[start:] = 0.0
        gen.verify([5, 6, 7, 8, 9], llm.valid_vocab)
        gen.rollback(3)
        assert gen.last_forward_rows == 5
        proposer.settle(start, 3, gen.last_forward_rows)
        got.append(proposer.hiddens[start : start + 3].copy())
    assert np.abs(got[0]).max() > 0                       # the eager verify tapped them
    for other in got[1:]:
        np.testing.assert_allclose(other, got[0], rtol=1e-5, atol=1e-6)
