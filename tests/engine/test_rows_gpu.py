"""Decode rounds of several requests on the GPU (engine/rows_graphs.py: one CUDA graph per batch
size over paged KV and GDN slots, the pick in the graph) against each request run alone on the
one-sequence path, on tests/support/twin_models.py's tiny random hybrid (GDN + gated attention
at the real head dims). The batched path's arithmetic differs from the single one's only in
fp32 summation order (tensor-core GEMVs for several rows, split counts), so greedy tokens agree
except at a near tie; a broken page table, slot or row would change every request's tokens.
"""
from __future__ import annotations

import numpy as np
import pytest

from ninfer_nb import SamplingParams
from ninfer_nb.engine.request import Request
from tests.support.twin_models import VOCAB, twin_llm

pytestmark = pytest.mark.gpu


def _prompt(seed: int, n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(2, VOCAB, n)]


def test_batched_rounds_give_each_request_its_solo_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """Five requests (prompts 7..300 tokens: pages part-filled and several pages) on 4 lanes:
    rounds of 1..4 rows, a request arriving while others decode, one seeded sampled request.
    Greedy requests' tokens equal their solo tokens (at most one request may differ, at a near
    tie); the round sizes seen include 4; the graphs of every size ran."""
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    specs = [("a", _prompt(1, 7), greedy), ("b", _prompt(2, 130), greedy), ("c", _prompt(3, 64), greedy),
             ("d", _prompt(4, 300), greedy),
             ("e", _prompt(5, 20), SamplingParams(max_tokens=10, temperature=0.8, seed=9, ignore_eos=True))]
    alone = twin_llm(monkeypatch, "hybrid", "cuda")
    want = {}
    for rid, ids, p in specs:
        alone.engine.forget()
        want[rid] = alone.generate(ids, p).token_ids
    del alone
    llm = twin_llm(monkeypatch, "hybrid", "cuda", max_concurrency=4)
    engine = llm.engine
    reqs = {rid: Request(rid, ids, p) for rid, ids, p in specs}
    got: dict[str, list[int]] = {rid: [] for rid in reqs}
    arrivals = {0: ["a", "b", "c"], 4: ["d"], 9: ["e"]}
    for step in range(400):
        for rid in arrivals.get(step, []):
            engine.add_request(reqs[rid])
        for out in engine.step():
            got[out.request_id] += list(out.new_token_ids)
        if step > 9 and not engine.has_unfinished_requests():
            break
    print(f"\nround sizes {dict(sorted(engine.batch_sizes.items()))}")
    differ = [rid for rid in got if got[rid] != want[rid]]
    for rid in differ:
        print(f"{rid}: batched {got[rid]} vs alone {want[rid]}")
    assert max(engine.batch_sizes) >= 4
    assert all(len(got[rid]) == len(want[rid]) for rid in got)
    assert len(differ) <= 1, differ


def test_a_short_request_waits_at_most_one_prefill_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #30's fairness on the CUDA default (batched lanes): a short request arriving while
    a long one decodes gets its first token in the step it arrives (its one prefill chunk after
    one decode round), while the long one keeps decoding; with max_concurrency 1 it waits for
    the whole long generation."""
    import time

    long_p = SamplingParams(max_tokens=150, temperature=0.0, ignore_eos=True)
    short_p = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    seen = {}
    for concurrency in (None, 1):
        llm = twin_llm(monkeypatch, "hybrid", "cuda", max_concurrency=concurrency, prefill_chunk=128)
        engine = llm.engine
        long, short = Request("long", _prompt(11, 200), long_p), Request("short", _prompt(12, 100), short_p)
        engine.add_request(long)
        first_step = long_left = None
        for step in range(1000):
            if step == 30:
                short.arrival_time = time.perf_counter()
                engine.add_request(short)
            for out in engine.step():
                if out.request_id == "short" and first_step is None and out.new_token_ids:
                    first_step, long_left = step, long_p.max_tokens - len(long.output_ids)
            if not engine.has_unfinished_requests():
                break
        assert short.timings.ttft_s is not None and first_step is not None
        seen[concurrency] = (first_step - 30, long_left, short.timings.ttft_s)
        print(f"\nmax_concurrency {llm.max_concurrency}: short request's first token {first_step - 30} steps "
              f"after it arrived, TTFT {short.timings.ttft_s * 1e3:.1f} ms, {long_left} long tokens left")
        del llm, engine
    steps, left, ttft = seen[None]
    assert steps == 0 and left > 100                    # the step it arrived in; the long one goes on
    assert seen[1][1] == 0                              # one lane: after the whole long generation
    assert ttft < seen[1][2] / 2
