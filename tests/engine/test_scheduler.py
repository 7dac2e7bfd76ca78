"""Many requests at once on the CPU backend (engine/scheduler.py, paged KV, GDN slots per lane).

Batch invariance: every request of a mixed batch (prompt lengths over several prefill chunks,
arrivals while others decode, stop ids, a cancel, greedy / seeded / penalised sampling) yields
the tokens it yields alone on the one-sequence path; a randomized run under a tiny KV page
budget (preemption and recompute) does too, and leaves every page free or held by the prefix
cache alone (free after a clear). A request the
pool can never hold is refused when it is added. Tiny random checkpoints: the hybrid (GDN +
gated attention) and the dense Llama.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from ninfer_nb import LLM, SamplingParams
from ninfer_nb.config import EngineConfig
from ninfer_nb.engine.kv_pages import PageAllocator, PageTable
from ninfer_nb.engine.llm_engine import LLMEngine
from ninfer_nb.engine.request import Request, RequestOutput, RequestStatus
from ninfer_nb.errors import InvalidRequestError

GREEDY = SamplingParams(max_tokens=7, temperature=0.0, ignore_eos=True)
MODELS = ["tiny_qwen35_dir", "tiny_llama_dir"]


def make_llm(path: Path, concurrency: int, kv_pages: int | None = None, chunk: int = 16) -> LLM:
    return LLM(config=EngineConfig(str(path), device="cpu", max_context=160, prefill_chunk=chunk,
                                   show_progress=False, max_concurrency=concurrency, kv_pages=kv_pages))


def prompt(seed: int, n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(100, 5000, n)]


def solo(llm: LLM, ids: list[int], params: SamplingParams) -> list[int]:
    llm.engine.forget()
    return llm.generate(ids, params).token_ids


def drive(engine: LLMEngine, arrivals: dict[int, list[Request]], cancels: dict[int, list[str]],
          max_steps: int = 2000,
          on_output: Callable[[int, RequestOutput], None] | None = None) -> dict[str, list[RequestOutput]]:
    """Step the engine, adding requests and setting cancel flags at their step numbers
    (on_output(step, output) sees each output as it comes)."""
    outs: dict[str, list[RequestOutput]] = {}
    reqs: dict[str, Request] = {}
    for step in range(max_steps):
        for req in arrivals.get(step, []):
            engine.add_request(req)
            reqs[req.request_id] = req
        for rid in cancels.get(step, []):
            reqs[rid].cancel.set()
        for out in engine.step():
            outs.setdefault(out.request_id, []).append(out)
            if on_output is not None:
                on_output(step, out)
        if step > max(arrivals) and not engine.has_unfinished_requests():
            return outs
    raise AssertionError("the engine did not finish")


def tokens(outs: list[RequestOutput]) -> list[int]:
    return [t for o in outs for t in o.new_token_ids]


@pytest.fixture(scope="module", params=MODELS)
def model_dir(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def alone(model_dir: Path) -> LLM:
    return make_llm(model_dir, 1)


def test_mixed_batch_gives_each_request_its_solo_tokens(model_dir: Path, alone: LLM) -> None:
    """Four lanes, six requests: lengths 5..40 (up to three chunks), arriving at steps 0..6,
    one with a stop id, one cancelled mid-decode, greedy / seeded temperature / top-k-top-p /
    penalised sampling: each finished one's tokens are its solo tokens, and the cancelled one's
    are a prefix of them."""
    specs = [
        ("a", prompt(1, 5), GREEDY),
        ("b", prompt(2, 40), SamplingParams(max_tokens=6, temperature=0.8, seed=3, ignore_eos=True)),
        ("c", prompt(3, 17), GREEDY.replace(max_tokens=12)),
        ("d", prompt(4, 9), SamplingParams(max_tokens=8, temperature=1.0, top_k=40, top_p=0.9, seed=5,
                                           ignore_eos=True)),
        ("e", prompt(5, 23), GREEDY.replace(presence_penalty=0.7, max_tokens=9)),
        ("f", prompt(6, 12), GREEDY.replace(max_tokens=20)),
    ]
    want = {rid: solo(alone, ids, p) for rid, ids, p in specs}
    stop = want["c"][4]                                 # c stops at its fifth token
    specs[2] = ("c", specs[2][1], specs[2][2].replace(stop_token_ids=(stop,)))
    want["c"] = want["c"][: want["c"].index(stop) + 1]
    llm = make_llm(model_dir, 4)
    reqs = [Request(rid, ids, p) for rid, ids, p in specs]
    arrivals = {0: reqs[:2], 1: [reqs[2]], 3: [reqs[3]], 5: [reqs[4]], 6: [reqs[5]]}
    outs = drive(llm.engine, arrivals, cancels={12: ["f"]})
    for rid, _, _ in specs:
        got = tokens(outs[rid])
        if rid == "f":
            assert outs[rid][-1].finish_reason == "cancelled" and got == want["f"][: len(got)]
        else:
            assert got == want[rid], rid
    assert outs["c"][-1].finish_reason == "stop"
    assert max(llm.engine.batch_sizes) >= 3                   # rounds of several rows ran
    assert llm.engine.scheduler.preemptions == 0


def test_random_arrivals_cancels_and_preemption_under_a_tiny_page_budget(model_dir: Path, alone: LLM) -> None:
    """Three lanes over 5 pages of 64 tokens (a request needs up to 2): random prompts,
    arrivals and cancels force preemptions; every request that finishes has its solo tokens,
    a cancelled one a prefix of them; at the end every page and lane is free."""
    rng = np.random.default_rng(11)
    llm = make_llm(model_dir, 3, kv_pages=5)
    arrivals: dict[int, list[Request]] = {}
    cancels: dict[int, list[str]] = {}
    want = {}
    for i in range(8):
        ids = prompt(100 + i, int(rng.integers(50, 62)))     # decode crosses into a second page
        params = GREEDY.replace(max_tokens=int(rng.integers(10, 40)))
        if i % 3 == 1:
            params = SamplingParams(max_tokens=params.max_tokens, temperature=0.9, seed=i, ignore_eos=True)
        want[f"r{i}"] = solo(alone, ids, params)
        step = int(rng.integers(0, 12))
        arrivals.setdefault(step, []).append(Request(f"r{i}", ids, params))
        if i % 4 == 3:
            cancels.setdefault(step + int(rng.integers(3, 30)), []).append(f"r{i}")
    outs = drive(llm.engine, arrivals, cancels)
    assert set(outs) == set(want)
    for rid, got_outs in outs.items():
        got = tokens(got_outs)
        if got_outs[-1].finish_reason == "cancelled":
            assert got == want[rid][: len(got)], rid
        else:
            assert got == want[rid], rid
    engine = llm.engine
    assert engine.scheduler.preemptions > 0
    assert not engine.scheduler.running and not engine.scheduler.waiting
    cache = engine.prefix_cache                                # idle lanes hold nothing: the cache does
    assert cache is not None and engine.scheduler.allocator is not None
    assert engine.scheduler.allocator.num_free + cache.num_pages == 5
    engine.forget()                                            # the prefix cache is cleared
    assert engine.scheduler.allocator is not None and engine.scheduler.allocator.num_free == 5
    assert len(engine.scheduler.idle) == 3


def test_a_request_the_pool_cannot_hold_is_refused(tiny_qwen35_dir: Path) -> None:
    llm = make_llm(tiny_qwen35_dir, 2, kv_pages=2)
    with pytest.raises(InvalidRequestError, match="KV pages"):
        llm.engine.add_request(Request("big", prompt(1, 100), GREEDY.replace(max_tokens=40)))
    ok = Request("ok", prompt(1, 100), GREEDY.replace(max_tokens=20))     # 119 tokens: 2 pages
    llm.engine.add_request(ok)
    while not ok.finished:
        llm.engine.step()
    assert ok.status is RequestStatus.FINISHED_LENGTH


def test_page_allocator_counts_references() -> None:
    pool = PageAllocator(4)
    table = PageTable(pool, max_pages=3)
    assert table.grow(65) and table.pages == [0, 1] and list(table.row) == [0, 1, 0]
    assert not PageTable(pool, 8).grow(64 * 3) and pool.num_free == 2      # 3 wanted, 2 free: none taken
    assert pool.num_free == 2
    pool.retain([1])                                           # shared by a second holder
    table.release()
    assert pool.num_free == 3 and pool.refcount(1) == 1
    pool.release([1])
    assert pool.num_free == 4
    with pytest.raises(ValueError):
        pool.release([1])


def test_prefix_reuse_survives_other_conversations(tiny_qwen35_dir: Path) -> None:
    """A finished request's lane keeps its cache: after two other conversations ran in the
    other lanes, a prompt continuing the first prefills only its new tokens, the same prompt
    again none, and both give the tokens of a cold engine."""
    llm = make_llm(tiny_qwen35_dir, 3)
    engine = llm.engine
    first = prompt(7, 30)
    got = llm.generate(first, GREEDY).token_ids
    for seed in (8, 9):
        llm.generate(prompt(seed, 20), GREEDY)
    longer = first + got + [5, 6]
    cont = Request("cont", longer, GREEDY)
    engine.add_request(cont)
    while not cont.finished:
        engine.step()
    assert cont.num_cached_tokens == len(first) + len(got) - 1
    same = Request("same", longer, GREEDY)
    engine.add_request(same)
    while not same.finished:
        engine.step()
    assert same.num_cached_tokens == len(longer) and same.output_ids == cont.output_ids
    cold = make_llm(tiny_qwen35_dir, 1)
    assert cold.generate(longer, GREEDY).token_ids == cont.output_ids


def test_a_short_request_waits_at_most_one_prefill_chunk(tiny_qwen35_dir: Path) -> None:
    """Issue #30's fairness on lanes: a short request (one prefill chunk) arriving while a long
    one decodes gets its first token in the step it arrives in, and the long one keeps
    decoding; on one lane it waits for the whole long generation. Both get their solo tokens."""
    long_p, short_p = GREEDY.replace(max_tokens=60), GREEDY.replace(max_tokens=4)
    long_ids, short_ids = prompt(41, 40), prompt(42, 14)
    seen = {}
    for concurrency in (4, 1):
        llm = make_llm(tiny_qwen35_dir, concurrency)
        long, short = Request("long", long_ids, long_p), Request("short", short_ids, short_p)
        first: dict[str, int] = {}
        left = 0

        def note(step: int, out: RequestOutput) -> None:
            nonlocal left
            if out.request_id == "short" and out.new_token_ids and "short" not in first:
                first["short"], left = step, long_p.max_tokens - len(long.output_ids)

        outs = drive(llm.engine, {0: [long], 10: [short]}, {}, on_output=note)
        assert tokens(outs["long"]) == solo(llm, long_ids, long_p)
        assert tokens(outs["short"]) == solo(llm, short_ids, short_p)
        seen[concurrency] = (first["short"] - 10, left)
    assert seen[4][0] == 0 and seen[4][1] > 40          # the step it arrived in; the long one goes on
    assert seen[1][1] == 0                              # one lane: after the whole long generation
