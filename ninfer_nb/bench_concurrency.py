"""`ninfer bench --concurrency 1,2,4,8`: C requests at once, in-process, for each C.

Each level submits C requests with distinct random prompts of the same length (no shared
prefix) to the engine at one instant, steps it until all finish, and reports: aggregate
decode tok/s (tokens after each request's first, over the window from the first request's
first token to the last request's end), the steady decode tok/s (tokens over the window where
every request is decoding: from the last first token to the first end; prefill chunks of
the others no longer interleave there, so it is the batched rounds' rate), the mean
per-request decode tok/s, TTFT (mean and max: the last request's first token waits for the
others' prefill chunks), the wall time and the tokens per CPU-second of this process
(steadier than wall figures on a shared host).
Each level runs once untimed first (every batch size's graph compiled and captured), and the
caches are dropped between runs. Greedy, ignore_eos. Knows nothing about HTTP (`bench
serve` drives a server).
"""
from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np

from .engine.request import Request
from .params import SamplingParams


def run_level(llm: Any, concurrency: int, prompt_len: int, gen: int, seed: int = 0,
              sampling: dict[str, Any] | None = None) -> dict[str, Any]:
    """One level: `concurrency` requests of prompt_len tokens, gen tokens each (greedy, or
    sampled with `sampling`'s SamplingParams fields, each request its own seed)."""
    engine = llm.engine
    engine.forget()
    rng = np.random.default_rng([seed, concurrency])
    vocab = min(llm.valid_vocab, 32000)
    params = SamplingParams(max_tokens=gen, temperature=0.0, ignore_eos=True).replace(**(sampling or {}))
    reqs = [Request(f"bench-c{concurrency}-{i}", [int(t) for t in rng.integers(100, vocab, prompt_len)],
                    params.replace(seed=i) if sampling else params)
            for i in range(concurrency)]
    engine.batch_sizes.clear()
    t0, cpu0 = time.perf_counter(), time.process_time()
    for req in reqs:
        req.arrival_time = t0
        engine.add_request(req)
    ends: dict[str, float] = {}
    steps: list[tuple[float, int]] = []          # (when a step returned, tokens it produced)
    while engine.has_unfinished_requests():
        outs = engine.step()
        now = time.perf_counter()
        steps.append((now, sum(len(o.new_token_ids) for o in outs)))
        for out in outs:
            if out.finished:
                ends[out.request_id] = now
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    firsts = [r.first_token_time or t0 for r in reqs]
    decoded = sum(max(len(r.output_ids) - 1, 0) for r in reqs)
    window = max(ends.values()) - min(firsts)
    per_req = [(len(r.output_ids) - 1) / (ends[r.request_id] - (r.first_token_time or t0))
               for r in reqs if len(r.output_ids) > 1]
    ttft = [f - t0 for f in firsts]
    # from the end of the step that gave the last request its first token
    all_in, first_end = min(t for t, _ in steps if t >= max(firsts)), min(ends.values())
    steady = sum(n for t, n in steps if all_in < t <= first_end)
    rounds = sum(engine.batch_sizes.values())
    return {"concurrency": concurrency, "prompt_tokens": prompt_len, "gen_tokens": gen,
            "aggregate_decode_tok_s": decoded / window if window > 0 else 0.0,
            "steady_decode_tok_s": steady / (first_end - all_in) if first_end > all_in and steady else 0.0,
            "per_request_decode_tok_s": float(np.mean(per_req)) if per_req else 0.0,
            "ttft_mean_s": float(np.mean(ttft)), "ttft_max_s": float(np.max(ttft)), "wall_s": wall,
            "mean_batch": (sum(b * n for b, n in engine.batch_sizes.items()) / rounds) if rounds else 1.0,
            "max_batch": max(engine.batch_sizes, default=1),
            # this process's CPU time (all threads): on a shared host, a figure other load moves less
            "cpu_s": cpu, "tok_per_cpu_s": sum(len(r.output_ids) for r in reqs) / cpu if cpu > 0 else 0.0}


def run_concurrency_bench(llm: Any, levels: list[int], prompt_len: int, gen: int,
                          sampling: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every level in order; each row also gets its aggregate relative to the first level's.
    sampling: each level also runs sampled right after greedy (a row "sampled" with its
    aggregate as a share of greedy's at that level)."""
    rows = []
    for c in levels:
        # untimed first: every batch size up to C takes its first round eagerly (compiles) and
        # captures its graph on the second, outside the greedy run the sampled one is held to
        run_level(llm, c, prompt_len, min(gen, c + 3), seed=1)
        rows.append(run_level(llm, c, prompt_len, gen))
        _progress(rows[-1], "greedy")
        if sampling:
            s = run_level(llm, c, prompt_len, gen, sampling=sampling)
            s["sampled_vs_greedy"] = s["aggregate_decode_tok_s"] / (rows[-1]["aggregate_decode_tok_s"] or 1.0)
            s["steady_sampled_vs_greedy"] = s["steady_decode_tok_s"] / (rows[-1]["steady_decode_tok_s"] or 1.0)
            rows.append(s)
            _progress(s, f"sampled ({s['sampled_vs_greedy']:.1%} of greedy; steady "
                         f"{s['steady_sampled_vs_greedy']:.1%})")
    base = rows[0]["aggregate_decode_tok_s"] or 1.0
    for row in rows:
        row["vs_first"] = row["aggregate_decode_tok_s"] / base
    return rows


def _progress(row: dict[str, Any], what: str) -> None:
    """One line on stderr as each level ends (a run cut short still reports what it measured)."""
    sys.stderr.write(f"bench: C={row['concurrency']} {what}: {row['aggregate_decode_tok_s']:.1f} tok/s aggregate, "
                     f"{row['steady_decode_tok_s']:.1f} steady (all decoding), "
                     f"{row['per_request_decode_tok_s']:.1f} per request, mean batch {row['mean_batch']:.2f}, "
                     f"wall {row['wall_s']:.1f} s\n")
    sys.stderr.flush()


def print_rows(rows: list[dict[str, Any]], title: str) -> None:
    print(title)
    print(f"{'C':>4}{'aggregate t/s':>15}{'x C1':>7}{'steady t/s':>12}{'per-req t/s':>13}{'TTFT mean ms':>14}"
          f"{'TTFT max ms':>13}{'mean batch':>12}{'wall s':>8}{'tok/cpu-s':>11}")
    for r in rows:
        share = r.get("sampled_vs_greedy")
        print(f"{r['concurrency']:>4}{r['aggregate_decode_tok_s']:>15.1f}{r['vs_first']:>7.2f}{r['steady_decode_tok_s']:>12.1f}"
              f"{r['per_request_decode_tok_s']:>13.1f}{r['ttft_mean_s'] * 1e3:>14.0f}"
              f"{r['ttft_max_s'] * 1e3:>13.0f}{r['mean_batch']:>12.2f}{r['wall_s']:>8.1f}{r['tok_per_cpu_s']:>11.1f}"
              + (f"  sampled: {share:.1%} of greedy (steady {r['steady_sampled_vs_greedy']:.1%})"
                 if share is not None else ""))
