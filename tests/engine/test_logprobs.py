"""Logprobs and the thinking budget through the real engine (tiny Qwen3.5 on the CPU backend).

The oracle for generated tokens' logprobs is a full forward over prompt + output
(`LLM.logits`): the row before each token gives its log-softmax.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ninfer_nb.engine.logprobs import log_softmax, prompt_logprobs, token_logprobs
from ninfer_nb.engine.output_hooks import ThinkingBudget
from ninfer_nb.params import SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_qwen35_dir: Path) -> Any:
    from ninfer_nb import LLM

    return LLM(str(tiny_qwen35_dir), device="cpu", max_context=256)


def test_token_logprobs_top_sorted_and_exact() -> None:
    rng = np.random.default_rng(0)
    row = rng.standard_normal(50).astype(np.float32)
    row = np.concatenate([row, np.full(6, 99.0, np.float32)])   # padding rows are not tokens
    lp = token_logprobs(row, 7, 5, valid_vocab=50)
    ref = log_softmax(row[:50])
    assert lp.logprob == pytest.approx(ref[7], abs=1e-6)
    assert [i for i, _ in lp.top] == list(np.argsort(-ref)[:5])
    assert np.exp(ref).sum() == pytest.approx(1.0)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_generated_logprobs_match_full_forward(llm: Any, temperature: float) -> None:
    prompt = llm.tokenizer.encode("The quick brown fox")
    params = SamplingParams(max_tokens=6, temperature=temperature, top_k=0, seed=3, logprobs=4,
                            ignore_eos=True)
    events = [ev for ev in llm.stream(prompt, params) if ev.token_id is not None]
    assert len(events) == 6 and all(ev.logprobs is not None for ev in events)
    out = [ev.token_id for ev in events]
    ref = log_softmax(llm.logits(prompt + out)[len(prompt) - 1: -1, : llm.valid_vocab])
    for t, ev in enumerate(events):
        assert ev.logprobs.token_id == out[t]
        assert ev.logprobs.logprob == pytest.approx(ref[t, out[t]], abs=2e-4)
        assert [i for i, _ in ev.logprobs.top] == list(np.argsort(-ref[t])[:4])
        if temperature == 0.0:
            assert ev.logprobs.top[0][0] == out[t]


def test_prompt_logprobs_shape(llm: Any) -> None:
    ids = llm.tokenizer.encode("one two three")
    lps = prompt_logprobs(llm.logits(ids), ids, 2, llm.valid_vocab)
    assert lps[0] is None and len(lps) == len(ids)
    assert all(lp is not None and lp.token_id == i and len(lp.top) == 2 for lp, i in zip(lps[1:], ids[1:]))


def test_thinking_budget_unit() -> None:
    b = ThinkingBudget(3, (10, 11))
    assert [b.next(t, i) for i, t in enumerate([1, 2, 3, 4, 5, 6])] == [1, 2, 3, 10, 11, 6]
    b = ThinkingBudget(3, (10, 11))
    assert [b.next(t, i) for i, t in enumerate([1, 11, 3, 4, 5])] == [1, 11, 3, 4, 5]   # closed itself


def test_thinking_budget_forces_close(llm: Any) -> None:
    tok = llm.tokenizer
    end = tuple(tok.encode("\n</think>\n\n"))
    prompt = tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n")
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, thinking_budget=4,
                            thinking_end_ids=end)
    out = llm.generate(prompt, params).token_ids
    assert tuple(out[4: 4 + len(end)]) == end
    assert tok.token_to_id("</think>") not in out[:4]


# --- logprobs computed where the pick is (PickFilters.logprobs) --------------------------------

def _events(llm: Any, prompt: list[int], params: SamplingParams) -> list[Any]:
    return [ev for ev in llm.stream(prompt, params) if ev.token_id is not None]


@pytest.mark.parametrize("sampling", [dict(temperature=0.0),
                                      dict(temperature=0.7, top_k=20, top_p=0.95, presence_penalty=1.0)])
def test_device_pick_logprobs_equal_the_host_path(monkeypatch: pytest.MonkeyPatch, sampling: dict[str, Any]) -> None:
    """A request with logprobs stays on the device pick (the CPU twin of the CUDA backend's
    decode graph and token ring, tests/engine/test_decode_ahead.py RingBackend): the host
    sampler runs once (the prefill's token), the pick computes the rest; each token's logprob
    and top 5 equal the host path's (HookedSampler on logits rows) and the full forward's."""
    from ninfer_nb.engine.output_hooks import HookedSampler
    from tests.engine.test_decode_ahead import _ids, ring_llm
    from tests.support.twin_models import twin_llm

    host_samples = []
    real = HookedSampler.sample
    monkeypatch.setattr(HookedSampler, "sample", lambda self, row: host_samples.append(1) or real(self, row))
    prompt = _ids(70, 9)
    params = SamplingParams(max_tokens=8, seed=5, logprobs=5, ignore_eos=True, **sampling)
    ring = ring_llm(monkeypatch)
    monkeypatch.setattr(HookedSampler, "sample", lambda self, row: host_samples.append(1) or real(self, row))
    got = _events(ring, prompt, params)
    assert len(got) == 8 and len(host_samples) == 1          # the prefill's token only
    plain = twin_llm(monkeypatch, "small", "cpu", max_context=256)
    out = [ev.token_id for ev in got]
    ref = log_softmax(plain.logits(prompt + out)[len(prompt) - 1: -1, : plain.valid_vocab])
    for t, ev in enumerate(got):
        assert ev.logprobs.token_id == out[t] and len(ev.logprobs.top) == 5
        assert ev.logprobs.logprob == pytest.approx(ref[t, out[t]], abs=2e-4)
        assert [i for i, _ in ev.logprobs.top] == list(np.argsort(-ref[t], kind="stable")[:5])
    if sampling["temperature"] == 0.0:                       # the host path takes the same tokens
        host_samples.clear()
        want = _events(plain, prompt, params)
        assert len(host_samples) == 8 and [ev.token_id for ev in want] == out
        for a, b in zip(got, want):
            assert a.logprobs.logprob == pytest.approx(b.logprobs.logprob, abs=1e-6)
            assert [i for i, _ in a.logprobs.top] == [i for i, _ in b.logprobs.top]


def test_device_pick_logprobs_in_batched_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rounds of several rows picked on the device (pick_rows): only the row that asks for
    logprobs gets them, at the full forward's values; the other row's tokens are unchanged."""
    from ninfer_nb.engine.request import Request
    from tests.engine.test_decode_ahead import _ids, ring_llm

    ring = ring_llm(monkeypatch, max_concurrency=2)
    assert ring.engine.paged
    a, b = _ids(71, 7), _ids(72, 11)
    pa = SamplingParams(max_tokens=6, temperature=0.0, logprobs=3, ignore_eos=True)
    pb = SamplingParams(max_tokens=6, temperature=0.8, seed=2, ignore_eos=True)
    alone = ring.generate(b, pb).token_ids
    reqs = [Request("a", a, pa), Request("b", b, pb)]
    engine = ring.engine
    engine.batch_sizes.clear()
    for req in reqs:
        engine.add_request(req)
    while engine.has_unfinished_requests():
        engine.step()
    assert reqs[1].output_ids == alone and reqs[1].logprobs == []
    assert engine.batch_sizes.get(2, 0) >= 4
    out = reqs[0].output_ids
    ref = log_softmax(ring.logits(a + out)[len(a) - 1: -1, : ring.valid_vocab])
    assert len(reqs[0].logprobs) == 6
    for t, lp in enumerate(reqs[0].logprobs):
        assert lp.token_id == out[t] and lp.logprob == pytest.approx(ref[t, out[t]], abs=2e-4)
        assert [i for i, _ in lp.top] == list(np.argsort(-ref[t], kind="stable")[:3])


@pytest.mark.gpu
@pytest.mark.parametrize("concurrency", [1, 2])
def test_gpu_logprobs_on_the_decode_graph(monkeypatch: pytest.MonkeyPatch, concurrency: int) -> None:
    """On the GPU a request with logprobs stays on the decode graph (one-sequence graph and
    token ring, or the B-row graphs): the host sampler takes only the prefill's token, and each
    token's logprob and top 5 come from ops.token_logprobs, matching the CPU's full forward of
    the same tokens (the twin's bf16-exact weights, fp32 KV caches: within 5e-3). The graph's
    build without logprobs runs before and after (switching builds between requests)."""
    from ninfer_nb.engine.output_hooks import HookedSampler
    from tests.engine.test_decode_ahead import _ids
    from tests.support.twin_models import twin_llm

    gpu = twin_llm(monkeypatch, "small", "cuda", max_context=256, max_concurrency=concurrency, kv_cache="fp32")
    cpu = twin_llm(monkeypatch, "small", "cpu", max_context=256)
    host_samples = []
    real = HookedSampler.sample
    monkeypatch.setattr(HookedSampler, "sample", lambda self, row: host_samples.append(1) or real(self, row))
    prompt = _ids(73, 12)
    plain = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    before = gpu.generate(prompt, plain).token_ids        # the graph's build without logprobs first
    for sampling in (dict(temperature=0.0), dict(temperature=0.7, top_k=20, top_p=0.95, presence_penalty=1.0)):
        host_samples.clear()
        params = SamplingParams(max_tokens=10, seed=4, logprobs=5, ignore_eos=True, **sampling)
        got = _events(gpu, prompt, params)
        assert len(got) == 10 and len(host_samples) == 1, (sampling, len(host_samples))
        out = [ev.token_id for ev in got]
        ref = log_softmax(cpu.logits(prompt + out)[len(prompt) - 1: -1, : cpu.valid_vocab])
        for t, ev in enumerate(got):
            lp = ev.logprobs
            assert lp.token_id == out[t] and len(lp.top) == 5
            assert lp.logprob == pytest.approx(ref[t, out[t]], abs=5e-3)
            assert [v for _, v in lp.top] == sorted((v for _, v in lp.top), reverse=True)
            for i, v in lp.top:
                assert v == pytest.approx(ref[t, i], abs=5e-3)
            assert lp.top[0][1] == pytest.approx(ref[t].max(), abs=5e-3)
    assert gpu.generate(prompt, plain).token_ids == before   # and back to it
