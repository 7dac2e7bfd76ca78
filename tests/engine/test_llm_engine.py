"""The engine in requests and steps on a tiny hybrid checkpoint (CPU, one lane: the one-sequence
path; several lanes: tests/engine/test_scheduler.py): the step loop's tokens
are the sampler's picks from the model's logits, requests wait / run / finish / abort, prefix
reuse across requests changes nothing, and GDN state slots snapshot and restore exactly."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ninfer_nb import LLM, SamplingParams
from ninfer_nb.engine.backend import CpuBackend, random_array
from ninfer_nb.engine.batch import ForwardBatch
from ninfer_nb.engine.llm_engine import LLMEngine
from ninfer_nb.engine.request import Request, RequestOutput, RequestStatus
from ninfer_nb.engine.sampler import Sampler
from ninfer_nb.engine.state_slots import StateSlots

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
PROMPT = [11, 220, 3405, 90, 17, 4088, 512, 73, 1999]


@pytest.fixture(scope="module")
def llm(tiny_qwen35_dir: Path) -> LLM:
    return LLM(str(tiny_qwen35_dir), device="cpu", max_context=48, prefill_chunk=16, max_concurrency=1)


def run(engine: LLMEngine, request: Request) -> list[RequestOutput]:
    engine.add_request(request)
    outs: list[RequestOutput] = []
    while not request.finished:
        outs += engine.step()
    return outs


def tokens(outs: list[RequestOutput]) -> list[int]:
    return [t for o in outs for t in o.new_token_ids]


@pytest.mark.parametrize("params", [
    GREEDY,
    SamplingParams(max_tokens=6, temperature=0.8, seed=3, ignore_eos=True),            # temperature alone
    SamplingParams(max_tokens=6, temperature=1.0, top_k=40, top_p=0.9, seed=5, ignore_eos=True),
], ids=["greedy", "temperature", "top_k_top_p"])
def test_step_loop_gives_the_samplers_picks(llm: LLM, params: SamplingParams) -> None:
    """Each step's token is what a fresh sampler (same seed) picks from the model's logits
    after the prompt and the tokens before it (the teacher-forced rows of LLM.logits); the
    text API returns the same tokens."""
    outs = run(llm.engine, Request("r", PROMPT, params))
    got = tokens(outs)
    assert [len(o.new_token_ids) for o in outs] == [1] * 6 and outs[-1].finished
    assert outs[-1].finish_reason == "length" and outs[-1].timings.completion_tokens == 6
    rows = llm.logits(PROMPT + got[:-1])[len(PROMPT) - 1:]
    sampler = Sampler(params, llm.valid_vocab)
    want = []
    for row in rows:
        want.append(sampler.sample(row))
        sampler.observe(want[-1])
    assert got == want
    assert llm.generate(PROMPT, params).token_ids == got


def test_requests_wait_run_and_abort(llm: LLM) -> None:
    """One request runs at a time, the next waits; abort ends the running one at once (its
    tokens so far kept); a request whose cancel flag is set ends before its next token; the
    engine's state after both is consistent (the next request's tokens equal a cold run's)."""
    engine = llm.engine
    cold = run(engine, Request("cold", PROMPT[::-1], GREEDY))
    engine.forget()
    a = Request("a", PROMPT, GREEDY.replace(max_tokens=20))
    b = Request("b", PROMPT[::-1], GREEDY)
    engine.add_request(a)
    engine.add_request(b)
    for _ in range(3):
        (out,) = engine.step()
        assert out.request_id == "a" and len(out.new_token_ids) == 1
    assert a.status is RequestStatus.RUNNING and b.status is RequestStatus.WAITING
    assert a.num_computed_tokens == len(PROMPT) + 2                 # the last token is not fed yet
    final = engine.abort("a")
    assert final is not None and final.finished and final.finish_reason == "cancelled"
    assert final.timings.completion_tokens == 3 and a.status is RequestStatus.FINISHED_ABORTED
    assert engine.abort("a") is None                                 # already finished
    b.cancel.set()
    assert engine.step() == [RequestOutput("b", [], True, "cancelled", b.timings)]
    assert not engine.has_unfinished_requests() and engine.step() == []
    again = run(engine, Request("again", PROMPT[::-1], GREEDY))
    assert tokens(again) == tokens(cold)


def test_stop_token_and_context_budget(llm: LLM) -> None:
    engine = llm.engine
    base = tokens(run(engine, Request("base", PROMPT, GREEDY)))
    stop = base[2]
    outs = run(engine, Request("stop", PROMPT, GREEDY.replace(stop_token_ids=(stop,))))
    assert tokens(outs) == base[: base.index(stop) + 1] and outs[-1].finish_reason == "stop"
    long = Request("long", list(range(100, 144)), GREEDY.replace(max_tokens=50))   # 44 of 48
    outs = run(engine, long)
    assert len(tokens(outs)) == 4 and outs[-1].finish_reason == "length"
    assert long.status is RequestStatus.FINISHED_LENGTH


def test_prefix_reuse_across_requests(llm: LLM, tiny_qwen35_dir: Path) -> None:
    """The same prompt again is served whole from the prompt snapshot (its logits kept); a
    prompt that continues the cached sequence prefills only its new tokens; both give the
    tokens of an engine with nothing cached."""
    engine = llm.engine
    engine.forget()
    first = Request("first", PROMPT, GREEDY)
    got = tokens(run(engine, first))
    assert first.num_cached_tokens == 0
    same = Request("same", PROMPT, GREEDY)
    assert tokens(run(engine, same)) == got and same.num_cached_tokens == len(PROMPT)
    longer = PROMPT + got + [5, 6]
    cont = Request("cont", longer, GREEDY)
    cont_tokens = tokens(run(engine, cont))
    assert cont.num_cached_tokens == len(PROMPT) + len(got) - 1     # all the cache held
    cold = LLM(str(tiny_qwen35_dir), device="cpu", max_context=48, prefill_chunk=16)
    assert tokens(run(cold.engine, Request("cold", longer, GREEDY))) == cont_tokens


def test_state_slots_snapshot_restore_round_trip() -> None:
    """copy slot to slot is exact, touches no other slot, and a forward in slot 1 reads and
    writes slot 1 only (the ForwardBatch names the slot)."""
    from ninfer_nb.models.decoder import Decoder
    from ninfer_nb.models.presets import preset_config, random_weights
    from ninfer_nb.models.state import new_state

    cfg = preset_config("tiny-qwen3.5")
    backend = CpuBackend()
    state = new_state(cfg, 16, backend.zeros, gdn_slots=3)
    slots = StateSlots(state, backend)
    assert slots.num_slots == 3 and len(slots.layers) == 3
    rng = np.random.default_rng(1)
    for layer in slots.layers:
        layer.conv[0] = rng.standard_normal(layer.conv.shape[1:])
        layer.recurrent[0] = rng.standard_normal(layer.recurrent.shape[1:])
    kept = [(layer.conv[0].copy(), layer.recurrent[0].copy()) for layer in slots.layers]
    slots.snapshot(0, into=1)
    for layer in slots.layers:
        layer.conv[0] += 1.0
        layer.recurrent[0] *= 2.0
    slots.restore(0, source=1)
    for layer, (conv, rec) in zip(slots.layers, kept):
        assert np.array_equal(layer.conv[0], conv) and np.array_equal(layer.recurrent[1], rec)
        assert not layer.conv[2].any() and not layer.recurrent[2].any()
    slots.reset(0)
    assert all(not layer.conv[0].any() and not layer.recurrent[0].any() for layer in slots.layers)
    with pytest.raises(IndexError):
        slots.copy(3, 0)
    # the same tokens from the same state in slot 1 and slot 2 (slot 0 stays zero)
    decoder = Decoder(cfg, random_weights(cfg, lambda shape, kind: random_array(rng, shape, kind)))
    slots.copy(2, 1)
    ids, pos = np.array([7, 8, 9]), np.arange(3)
    one = decoder.forward(backend.ops, ForwardBatch.single(ids, pos, slot=1), state)
    two = decoder.forward(backend.ops, ForwardBatch.single(ids, pos, slot=2), state)
    assert np.array_equal(one, two)
    for layer, (_, rec) in zip(slots.layers, kept):
        assert np.array_equal(layer.recurrent[1], layer.recurrent[2]) and not layer.recurrent[0].any()
        assert not np.array_equal(layer.recurrent[1], rec)             # the forward advanced it
    with pytest.raises(NotImplementedError):
        ForwardBatch(ids, pos, (0, 1, 3), (0, 1)).only_slot()


def test_interleaved_streams_and_an_abandoned_one(llm: LLM) -> None:
    """Two streams of one LLM read in turn each get their own request's tokens (the engine runs
    one request at a time; outputs of the other wait for their stream); closing a stream early
    aborts its request, and the engine serves the next one."""
    want_a = llm.generate(PROMPT, GREEDY).token_ids
    want_b = llm.generate(PROMPT[::-1], GREEDY).token_ids
    sa, sb = llm.stream(PROMPT, GREEDY), llm.stream(PROMPT[::-1], GREEDY)
    first = next(sa)                                  # a runs
    events_b = list(sb)                               # steps a to its end, then b
    events_a = [first, *sa]
    assert [e.token_id for e in events_a[:-1]] == want_a and events_a[-1].finish_reason == "length"
    assert [e.token_id for e in events_b[:-1]] == want_b and events_b[-1].finish_reason == "length"
    s = llm.stream(PROMPT, GREEDY.replace(max_tokens=30))
    next(s), next(s)
    s.close()
    assert not llm.engine.has_unfinished_requests()
    assert llm.generate(PROMPT[::-1], GREEDY).token_ids == want_b


def test_prefill_runs_one_chunk_per_step(llm: LLM, tiny_qwen35_dir: Path) -> None:
    """A prompt longer than a chunk is prefilled one chunk per step (ending at the turn-start
    cut, whose snapshot the next request reuses); the first token comes with the last chunk
    and equals the one-shot prefill's. Cancelling between chunks ends the request there."""
    engine = llm.engine
    engine.forget()
    prompt = [int(t) for t in np.random.default_rng(3).integers(100, 5000, 40)]     # chunks of 16
    req = Request("long", prompt, GREEDY.replace(max_tokens=2), turn_start=20)
    engine.add_request(req)
    computed = []
    while not req.output_ids:
        assert engine.step() == [] or req.output_ids
        computed.append(req.num_computed_tokens)
    assert computed == [16, 20, 36, 40]                  # the cut at the turn start ends a chunk
    while not req.finished:
        engine.step()
    cold = LLM(str(tiny_qwen35_dir), device="cpu", max_context=48, prefill_chunk=64)
    assert req.output_ids == cold.generate(prompt, GREEDY.replace(max_tokens=2)).token_ids
    again = Request("again", prompt[:20] + [7, 8, 9], GREEDY.replace(max_tokens=2))
    run(engine, again)
    assert again.num_cached_tokens == 20                   # from the turn-start snapshot
    stopped = Request("stopped", prompt[::-1], GREEDY)
    engine.add_request(stopped)
    assert engine.step() == [] and stopped.num_computed_tokens == 16
    stopped.cancel.set()
    (out,) = engine.step()
    assert out.finish_reason == "cancelled" and out.new_token_ids == [] and not engine.has_unfinished_requests()
    assert tokens(run(engine, Request("after", PROMPT, GREEDY))) == llm.generate(PROMPT, GREEDY).token_ids
