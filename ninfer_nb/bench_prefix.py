"""The prefix cache's benchmark: a conversation's second request after other conversations ran.

Conversation A sends a history of about `context` tokens and gets `gen` tokens; `others`
conversations of the same length run next; then A re-sends its history, the answer and a new
message of `new_tokens` tokens. Reported: each request's TTFT and prefill tokens, and A's second
TTFT as a fraction of its first (issue 27's target: <= 10 % at 16K tokens). A short
conversation first compiles the kernels, and the cache is cleared before A. Token ids only
(random presets work).

    python -m ninfer_nb.bench_prefix --random qwen3.6-27b --context 16384
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

import numpy as np

from .engine.kv_pages import pages_for
from .params import SamplingParams


def run_prefix_bench(llm: Any, context: int, *, others: int = 2, new_tokens: int = 64, gen: int = 8,
                     seed: int = 0, log: Any = None) -> dict[str, Any]:
    """The figures of one run on `llm` (an LLM with a prefix cache: paged lanes)."""
    engine = llm.engine
    if engine.prefix_cache is None:
        raise ValueError("bench_prefix needs the prefix cache (max_concurrency >= 2 or kv_pages)")
    rng = np.random.default_rng(seed)
    hi = min(llm.valid_vocab, 32000)

    def ids(n: int) -> list[int]:
        return [int(t) for t in rng.integers(100, hi, n)]

    params = SamplingParams(max_tokens=gen, temperature=0.0, ignore_eos=True)

    def request(name: str, prompt: list[int]) -> dict[str, Any]:
        before = engine.prefill_tokens
        res = llm.generate(prompt, params)
        row = {"request": name, "prompt_tokens": len(prompt), "prefill_tokens": engine.prefill_tokens - before,
               "cached_tokens": res.timings.cached_tokens, "ttft_ms": res.timings.ttft_s * 1e3,
               "tokens": res.token_ids}
        if log is not None:
            print(f"prefix-bench {name:8s} prompt {len(prompt):6d}  prefilled {row['prefill_tokens']:6d}  "
                  f"cached {row['cached_tokens']:6d}  TTFT {row['ttft_ms']:9.1f} ms", file=log, flush=True)
        return row

    history_len = context - new_tokens - 2 * gen
    if history_len < 1:
        raise ValueError(f"context {context} leaves no room for a history")
    request("warm-up", ids(min(history_len, 2 * llm.engine_config.prefill_chunk + 100)))
    engine.forget()                                   # the cache starts empty
    history = ids(history_len)
    rows = [request("A first", history)]
    for i in range(others):
        rows.append(request(f"other {i + 1}", ids(history_len)))
    followup = history + rows[0]["tokens"] + ids(new_tokens)
    rows.append(request("A second", followup))
    ratio = rows[-1]["ttft_ms"] / rows[0]["ttft_ms"]
    for row in rows:
        del row["tokens"]
    return {"context": context, "others": others, "new_tokens": new_tokens, "rows": rows,
            "ttft_ratio": ratio, "prefix_cache_pages": engine.prefix_cache.num_pages}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ninfer_nb.bench_prefix", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--random", default=None, metavar="PRESET")
    p.add_argument("--device", default="auto")
    p.add_argument("--context", type=int, default=16384, help="tokens of A's second request (about)")
    p.add_argument("--others", type=int, default=2, help="conversations between A's two requests")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--gen", type=int, default=8)
    p.add_argument("--prefill-chunk", type=int, default=2048)
    p.add_argument("--max-concurrency", type=int, default=2)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    from .config import EngineConfig
    from .llm import LLM

    max_context = args.context + args.gen
    # room for every conversation's pages in the cache, and the running one's
    kv_pages = (args.others + 2) * pages_for(max_context)
    model = f"random:{args.random}" if args.random else args.model
    llm = LLM(config=EngineConfig(model, device=args.device, max_context=max_context,
                                  prefill_chunk=args.prefill_chunk, show_progress=False,
                                  max_concurrency=args.max_concurrency, kv_pages=kv_pages))
    print(f"prefix-bench {llm.model_id} on {llm.device_name}: context {args.context}, {args.others} others, "
          f"{kv_pages} KV pages", flush=True)
    out = run_prefix_bench(llm, args.context, others=args.others, new_tokens=args.new_tokens, gen=args.gen,
                           log=sys.stdout)
    print(f"prefix-bench A second / A first TTFT = {out['ttft_ratio'] * 100:.1f} % (target <= 10 %)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
