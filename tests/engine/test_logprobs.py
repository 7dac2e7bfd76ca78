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
