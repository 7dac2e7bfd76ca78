"""One request on paged lanes vs the one-sequence graph, in one process on one backend (GPU).

    python dev/lanes_c1.py [PRESET] [PROMPT] [GEN] [C[,C...]]      (LANES_QUICK=1: greedy C = 1 only)

Loads PRESET's random weights once; engine L: paged lanes (max_concurrency C), engine S: the
one-sequence path (max_concurrency 1) on the same weights. Prints per case the decode tok/s
of one request (greedy, then sampled), whether L's greedy tokens equal S's, the graph device
time per token (B = 1 round vs the one-sequence step), L with rounds fed by the host (no
queue-ahead: the previous engine), the #30 fairness case (the TTFT of a short request arriving
while a long one decodes, vs alone), and per C: C requests started together on L (aggregate
decode tok/s from the first first token to the last end; steady: while all C decode).
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any

import numpy as np

from ninfer_nb import LLM, SamplingParams
from ninfer_nb.config import EngineConfig
from ninfer_nb.engine.llm_engine import LLMEngine
from ninfer_nb.engine.request import Request

T0 = time.time()


def say(msg: str) -> None:
    print(f"[{time.time() - T0:5.0f}s] {msg}", flush=True)


def run(engine: Any, reqs: list[tuple[int, Request]]) -> dict[str, float]:
    """Step until every request finished, adding each at its step; per request decode tok/s."""
    engine.forget()
    pending = sorted(reqs, key=lambda x: x[0])
    step, t0 = 0, time.perf_counter()
    ends: dict[str, float] = {}
    steps: list[tuple[float, int]] = []
    while pending or engine.has_unfinished_requests():
        while pending and pending[0][0] <= step:
            req = pending.pop(0)[1]
            req.arrival_time = time.perf_counter()
            engine.add_request(req)
        outs = engine.step()
        now = time.perf_counter()
        steps.append((now, sum(len(o.new_token_ids) for o in outs)))
        for out in outs:
            if out.finished:
                ends[out.request_id] = now
        step += 1
        if time.perf_counter() - t0 > 60:
            raise SystemExit("lanes_c1: a run took over 60 s")
    rates = {}
    for _, r in reqs:
        n = len(r.output_ids) - 1
        rates[r.request_id] = n / (ends[r.request_id] - r.first_token_time) if n > 0 and r.first_token_time else 0.0
    firsts = [r.first_token_time for _, r in reqs if r.first_token_time]
    rates["aggregate"] = sum(len(r.output_ids) - 1 for _, r in reqs) / (max(ends.values()) - min(firsts))
    lo, hi = max(firsts), min(ends.values())
    rates["steady"] = sum(n for t, n in steps if lo < t <= hi) / (hi - lo) if hi > lo else 0.0
    return rates


def main() -> None:
    preset = sys.argv[1] if len(sys.argv) > 1 else "qwen3.6-35b-a3b"
    plen = int(sys.argv[2]) if len(sys.argv) > 2 else 512
    gen = int(sys.argv[3]) if len(sys.argv) > 3 else 64
    levels = [int(c) for c in (sys.argv[4] if len(sys.argv) > 4 else "8").split(",")]
    conc = max(levels)
    quick = os.environ.get("LANES_QUICK") == "1"
    llm = LLM(config=EngineConfig(f"random:{preset}", device=os.environ.get("LANES_DEVICE", "cuda"), max_context=plen + 4 * gen + 64,
                                  prefill_chunk=2048, show_progress=False, max_concurrency=conc,
                                  kv_cache_fraction=0.5))
    lanes = llm.engine
    gen0 = lanes.generator
    solo = LLMEngine(llm.model_config, gen0.decoder, llm.backend, max_context=lanes.max_context,
                     prefill_chunk=2048, valid_vocab=lanes.valid_vocab, eos_ids=lanes.eos_ids,
                     kv_dtype="bf16", decode=lanes.decode, max_concurrency=1)
    say(f"{preset} loaded; lanes {conc}, one-seq engine built")
    rng = np.random.default_rng(0)
    ids = [int(t) for t in rng.integers(100, 30000, plen)]
    greedy = SamplingParams(max_tokens=gen, temperature=0.0, ignore_eos=True)
    sampled = SamplingParams(max_tokens=gen, temperature=0.7, top_k=20, top_p=0.95, presence_penalty=1.0,
                             seed=1, ignore_eos=True)
    toks: dict[str, list[int]] = {}
    c1s: dict[tuple[str, str], float] = {}
    for name, engine in (("one-seq", solo), ("lanes", lanes)):
        run(engine, [(0, Request(f"w-{name}", ids, greedy))])                 # compile + capture
        say(f"{name} warm")
        for label, p in (("greedy", greedy),) + ((("sampled", sampled),) if not quick else ()):
            best = 0.0
            for rep in range(2):
                req = Request(f"{name}-{label}-{rep}", ids, p)
                best = max(best, run(engine, [(0, req)])[req.request_id])
                if label == "greedy":
                    toks[name] = req.output_ids
            say(f"C=1 {name:8s} {label:8s} {best:7.1f} tok/s")
            c1s[name, label] = best
    a, b = toks["one-seq"], toks["lanes"]
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    say(f"lanes greedy tokens {'equal to one-seq' if first is None else f'differ from token {first}'}")
    be = llm.backend
    rounds = getattr(be, "time_decode_rounds", lambda b: None)
    say(f"device us/token: one-seq step {be.time_decode_steps(plen + gen) or 0:.1f}, "
        f"B=1 round {rounds(1) or 0:.1f}")
    if not quick:
        ahead, lanes._rows_ahead = lanes._rows_ahead, False
        req = Request("host-fed", ids, greedy)
        say(f"C=1 lanes host-fed greedy {run(lanes, [(0, req)])['host-fed']:7.1f} tok/s (no queue-ahead)")
        lanes._rows_ahead = ahead
    short = [int(t) for t in rng.integers(100, 30000, 64)]
    alone = Request("short-alone", short, greedy.replace(max_tokens=4))
    run(lanes, [(0, alone)])
    long = Request("long", ids, greedy.replace(max_tokens=4 * gen))
    late = Request("short-late", short, greedy.replace(max_tokens=4))
    run(lanes, [(0, long), (40, late)])
    say(f"#30 fairness: short request TTFT alone {alone.timings.ttft_s * 1e3:.1f} ms, while a long one "
        f"decodes {late.timings.ttft_s * 1e3:.1f} ms")
    c1 = c1s["lanes", "greedy"]
    for c in levels:
        for rep in range(2):                        # the first run captures every batch size's graph
            lanes.batch_sizes.clear()
            reqs = [(0, Request(f"c{c}-{rep}-{i}", [int(t) for t in rng.integers(100, 30000, plen)], greedy))
                    for i in range(c)]
            rates = run(lanes, reqs)
        agg, steady = rates.pop("aggregate"), rates.pop("steady")
        say(f"C={c} lanes: aggregate {agg:.1f} tok/s ({agg / c1:.2f}x C=1), steady {steady:.1f} "
            f"({steady / c1:.2f}x), per-request mean {np.mean(list(rates.values())):.1f}; "
            f"rounds {dict(sorted(lanes.batch_sizes.items()))}")

if __name__ == "__main__":
    main()
