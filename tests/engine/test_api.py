"""LLM API behaviour on a tiny hybrid checkpoint: streaming, stop handling, cancellation,
prefix reuse (must not change results), seeds, logits, and errors."""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from ninfer_nb import LLM, SamplingParams
from ninfer_nb.config import DecodeChoices, EngineConfig
from ninfer_nb.errors import ContextLengthExceededError, InvalidRequestError


@pytest.fixture(scope="module")
def llm(tiny_qwen35_dir: Path) -> LLM:
    return LLM(str(tiny_qwen35_dir), device="cpu", max_context=128, prefill_chunk=32)


def fresh(path: Path) -> LLM:
    return LLM(str(path), device="cpu", max_context=128, prefill_chunk=32)


GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def test_stream_concatenates_to_generate(llm: LLM) -> None:
    events = list(llm.stream("Hello world", GREEDY))
    assert events[-1].finished and events[-1].finish_reason == "length"
    assert all(not e.finished for e in events[:-1])
    assert [e.token_id for e in events[:-1]] == llm.generate("Hello world", GREEDY).token_ids
    text = "".join(e.text for e in events)
    assert text == llm.tokenizer.decode([e.token_id for e in events[:-1]])
    t = events[-1].timings
    assert t is not None and t.completion_tokens == 12 and t.ttft_s > 0 and t.decode_s > 0


def test_prefix_reuse_gives_identical_results(llm: LLM, tiny_qwen35_dir: Path) -> None:
    msgs = [{"role": "user", "content": "Tell me about the sea."}]
    first = llm.chat(msgs, params=GREEDY)
    again = llm.chat(msgs, params=GREEDY)                 # whole prompt cached (snapshot)
    assert again.result.timings.cached_tokens == again.result.timings.prompt_tokens
    turn2 = msgs + [{"role": "assistant", "content": first.content},
                    {"role": "user", "content": "And the mountains?"}]
    reused = llm.chat(turn2, params=GREEDY)
    first_prompt = llm.encode_chat(msgs)
    turn_start = max(i for i, t in enumerate(first_prompt) if t == llm.tokenizer.token_to_id("<|im_start|>"))
    assert reused.result.timings.cached_tokens == turn_start   # everything before the assistant turn
    cold = fresh(tiny_qwen35_dir).chat(turn2, params=GREEDY)
    assert cold.result.timings.cached_tokens == 0
    assert reused.result.token_ids == cold.result.token_ids
    assert first.result.token_ids == again.result.token_ids


def test_logits_equal_incremental_decode(llm: LLM) -> None:
    ids = llm.tokenizer.encode("The quick brown fox jumps over the lazy dog")
    full = llm.logits(ids)
    res = llm.generate(ids, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    assert res.token_ids[0] == int(np.argmax(full[-1][: llm.tokenizer.vocab_size]))


def test_device_pick_choice_keeps_greedy_tokens(llm: LLM, tiny_qwen35_dir: Path) -> None:
    """DecodeChoices.device_pick: greedy requests without penalties feed
    Generator.decode_token (on the CPU backend its np.argmax fallback; the CUDA graph's
    pick kernel is tested in test_gpu_model.py), which must give the sampler's tokens;
    sampled requests (no decode graph to sample in on the CPU) and penalised ones keep the
    logits path."""
    # one lane: the one-sequence path, whose decode_token the CUDA graph serves
    fast = LLM(str(tiny_qwen35_dir), device="cpu", max_context=128, prefill_chunk=32, max_concurrency=1)
    plain = LLM(config=EngineConfig(str(tiny_qwen35_dir), device="cpu", max_context=128, prefill_chunk=32,
                                    show_progress=False, decode=DecodeChoices(device_pick=False),
                                    max_concurrency=1))
    plain_calls = []
    plain.engine.generator.decode_token = lambda *a, **kw: plain_calls.append(a)  # type: ignore[method-assign]
    calls = []
    decode_token = fast.engine.generator.decode_token
    fast.engine.generator.decode_token = lambda *a, **kw: (calls.append((a[0], kw["ahead"])), decode_token(*a, **kw))[1]  # type: ignore[method-assign]
    assert fast.generate("Hello world", GREEDY).token_ids == plain.generate("Hello world", GREEDY).token_ids
    assert not plain_calls                                              # off: the logits row
    assert len(calls) == GREEDY.max_tokens - 1                          # every token after the first
    # each call queues the step after it too, but the one whose token is the last of the budget
    assert [ahead for _, ahead in calls] == [True] * (GREEDY.max_tokens - 2) + [False]
    calls.clear()
    for p in (SamplingParams(max_tokens=6, temperature=0.8, seed=3, ignore_eos=True),
              GREEDY.replace(presence_penalty=0.5)):
        assert fast.generate("Hello world", p).token_ids == plain.generate("Hello world", p).token_ids
    assert not calls


def test_stop_string_cuts_text(llm: LLM) -> None:
    base = llm.generate("Once upon", GREEDY)
    assert len(base.text) > 6
    stop = base.text[3:6]
    cut = llm.generate("Once upon", GREEDY.replace(stop=(stop,)))
    assert cut.finish_reason == "stop"
    assert stop not in cut.text
    assert base.text.startswith(cut.text) and cut.text == base.text[: base.text.find(stop)]


def test_stop_token_ids(llm: LLM) -> None:
    base = llm.generate("Once upon", GREEDY)
    target = base.token_ids[4]
    res = llm.generate("Once upon", GREEDY.replace(stop_token_ids=(target,)))
    assert res.finish_reason == "stop"
    assert res.token_ids == base.token_ids[: base.token_ids.index(target) + 1]


def test_seed_reproducible_and_temperature_varies(llm: LLM) -> None:
    p = SamplingParams(max_tokens=10, temperature=1.0, top_p=0.9, top_k=50, seed=7, ignore_eos=True)
    a = llm.generate("Hi", p).token_ids
    b = llm.generate("Hi", p).token_ids
    c = llm.generate("Hi", p.replace(seed=8)).token_ids
    assert a == b
    assert a != c


def test_cancel_stops_at_next_token(llm: LLM) -> None:
    cancel = threading.Event()
    n = 0
    final = None
    for ev in llm.stream("Count", SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True),
                         cancel=cancel):
        n += 1
        if n == 3:
            cancel.set()
        if ev.finished:
            final = ev
    assert final is not None and final.finish_reason == "cancelled"
    assert final.timings is not None and final.timings.completion_tokens == 3


def test_context_limit_and_bad_input(llm: LLM) -> None:
    with pytest.raises(ContextLengthExceededError):
        llm.generate(list(range(1000, 1200)), GREEDY)
    with pytest.raises(InvalidRequestError):
        llm.generate("   ", GREEDY)
    with pytest.raises(InvalidRequestError):
        llm.generate([10**9], GREEDY)
    with pytest.raises(InvalidRequestError, match="temperature"):
        llm.generate("hi", SamplingParams(temperature=5.0))
    # the engine still works afterwards
    assert len(llm.generate("hi", GREEDY).token_ids) == 12


def test_generation_budget_capped_by_context(llm: LLM) -> None:
    ids = list(range(1000, 1120))                       # 120 of 128 context tokens
    res = llm.generate(ids, SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True))
    assert res.finish_reason == "length" and len(res.token_ids) == 8


def test_moe_chat_runs(tiny_qwen35_moe_dir: Path) -> None:
    moe = LLM(str(tiny_qwen35_moe_dir), device="cpu", max_context=64)
    out = moe.chat([{"role": "user", "content": "hi"}], params=GREEDY)
    assert out.result.timings.completion_tokens == 12
    stats = moe.stats()
    assert stats["architecture"] == "qwen3_5" and stats["context_tokens"] > 0


def _random_tiny(kv_cache: str) -> LLM:     # head_dim 64: int8 groups of 64 values
    return LLM("random:tiny-qwen3.5", device="cpu", max_context=128, prefill_chunk=32, kv_cache=kv_cache)


@pytest.fixture(scope="module")
def random_tiny_auto() -> LLM:
    """The fp32 reference of the compact caches (random weights take seconds to draw)."""
    return _random_tiny("auto")


@pytest.mark.parametrize("kv", ["bf16", "int8"])
def test_compact_kv_caches_stay_close_to_fp32(tiny_qwen35_dir: Path, random_tiny_auto: LLM, kv: str) -> None:
    full, compact = random_tiny_auto, _random_tiny(kv)
    assert full.stats()["kv_cache"] == "fp32"                       # the CPU backend's default
    ids = list(range(5000, 5060))
    ref, got = full.logits(ids), compact.logits(ids)
    assert np.abs(got - ref).max() <= 2e-2 * np.abs(ref).max()
    assert compact.stats()["kv_cache_bytes"] < full.stats()["kv_cache_bytes"] * (0.6 if kv == "bf16" else 0.3)
    p = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    assert compact.generate(ids, p).token_ids == full.generate(ids, p).token_ids
    assert compact.stats()["kv_cache"] == kv
    with pytest.raises(InvalidRequestError, match="kv_cache must be auto, fp32, bf16 or int8"):
        LLM(str(tiny_qwen35_dir), device="cpu", kv_cache="fp8")


def test_int8_quantization_rule() -> None:
    from ninfer_nb.ops import cpu

    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 2, 128)).astype(np.float32)
    x[0, 0, :64] = 0.0
    codes, scales = cpu.kv_quantize_int8(x)
    assert codes.dtype == np.int8 and scales.shape == (3, 2, 2)
    assert scales[0, 0, 0] == 0 and not codes[0, 0, :64].any()
    g = x.reshape(3, 2, 2, 64)
    assert np.allclose(scales, np.abs(g).max(-1) / 127)
    assert np.abs(codes).max() == 127                          # each group's amax maps to +-127
    err = np.abs(cpu.kv_dequantize_int8(codes, scales) - x)
    assert (err <= scales.repeat(64, axis=-1) / 2 + 1e-7).all() # within half a step
