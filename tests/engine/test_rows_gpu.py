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
