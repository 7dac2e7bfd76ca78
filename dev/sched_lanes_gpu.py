"""GPU check of the scheduler's lanes (not a test: prints what it finds). `random:tiny-qwen3.5`
on CUDA with max_concurrency 4: six requests (prompts 20..300 tokens, greedy and seeded
sampled) started together vs the same requests one at a time on the same engine; prints per
request whether the tokens agree (and where they first differ), the decode-round sizes, and
that every KV page is free after forget(). Usage: python dev/sched_lanes_gpu.py"""
from __future__ import annotations

import numpy as np

from ninfer_nb import LLM, SamplingParams
from ninfer_nb.config import EngineConfig
from ninfer_nb.engine.request import Request


def main() -> None:
    llm = LLM(config=EngineConfig("random:tiny-qwen3.5", device="cuda", max_context=512, show_progress=False,
                                  max_concurrency=4))
    rng = np.random.default_rng(0)
    specs = []
    for i, n in enumerate([20, 300, 64, 130, 33, 250]):
        p = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
        if i % 3 == 2:
            p = SamplingParams(max_tokens=16, temperature=0.8, seed=i, ignore_eos=True)
        specs.append((f"r{i}", [int(t) for t in rng.integers(100, 30000, n)], p))
    engine = llm.engine
    alone = {}
    for rid, ids, p in specs:
        engine.forget()
        alone[rid] = llm.generate(ids, p).token_ids
    engine.forget()
    engine.batch_sizes.clear()
    reqs = [Request(rid, ids, p) for rid, ids, p in specs]
    for r in reqs:
        engine.add_request(r)
    while engine.has_unfinished_requests():
        engine.step()
    same = 0
    for r in reqs:
        a, b = alone[r.request_id], r.output_ids
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        same += first is None and len(a) == len(b)
        print(f"sched-gpu {r.request_id}: prompt {len(r.prompt_ids)}, {len(b)} tokens, "
              f"{'equal to alone' if first is None else f'first differs at token {first}'}")
    engine.forget()
    alloc = engine.scheduler.allocator
    print(f"sched-gpu: {same}/{len(reqs)} requests equal to their solo run; round sizes {dict(engine.batch_sizes)}; "
          f"pages free after forget {alloc.num_free}/{alloc.num_pages}" if alloc else "no page pool")


if __name__ == "__main__":
    main()
