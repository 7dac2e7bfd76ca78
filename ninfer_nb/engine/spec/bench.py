"""`ninfer bench --spec oracle|ngram|mtp --draft-tokens 1,3,5`: speculative decoding against
plain decode in one run.

- ngram / mtp: a prompt that asks the model to repeat a passage with small edits (n-gram
  lookup's case: the output re-quotes the prompt); MTP needs a checkpoint with `mtp.*` weights.
- oracle: the drafter proposes the target's own greedy continuation recorded from the plain
  run just before (engine/spec/oracle.py) on a random-token prompt: acceptance 100 %, so the
  figures are the UPPER BOUND of the verify machinery (what a perfect drafter would give), not
  a drafter's real speed-up; works with random weights. Where the K + 1 verify's greedy tokens
  differ from plain decode's (other kernels, near-ties of random weights), the oracle
  re-records the speculative run's own output and runs again (3 passes at most).

One model load; for each K a warm-up of the K + 1 verify (CUDA: eager, then the graph
capture), a plain decode, then the speculative one, same engine and prompt (prefix reuse off:
the cache is dropped before each run). Prints both tok/s, the round time against the plain
step, tokens per round (decode forwards), acceptance, whether the greedy output equals the
plain run's, on CUDA the device time of the verify graph against the decode graph, and the
machine's load average. Knows nothing about kernels.
"""
from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

from ...params import SamplingParams
from .ngram import NgramProposer
from .oracle import OracleProposer
from .stats import SpecStats

PASSAGE = (
    "The lighthouse at Carrow Point was built in 1872 by a company of masons from Aberdeen, who "
    "carried the granite blocks across the bay on flat-bottomed barges during the calm weeks of "
    "late summer. Its first keeper, Thomas Hale, kept a journal of every ship that passed, the "
    "direction of the wind, and the hours he spent trimming the wicks of the great oil lamp. In "
    "the winter of 1881 a storm tore the iron railing from the gallery and flooded the lower "
    "rooms, but the light never went out: Hale and his daughter Margaret carried oil up the "
    "hundred and twelve steps every two hours for three nights. The lamp was replaced by an "
    "electric lantern in 1926, and the keepers left for good in 1961, when the light was made "
    "automatic. Today the tower belongs to a small trust that opens it to visitors on summer "
    "weekends. From the gallery one can see the whole curve of the bay, the ruined chapel on the "
    "headland, and, on a clear day, the blue line of the islands forty miles to the west. The "
    "journals of Thomas Hale are kept in the town library, where anyone may read them, and the "
    "trust has printed a short guide that tells the story of the storm, the keepers and the "
    "families who lived beside the sea for almost ninety years."
)
EDITS = 'replace "Thomas Hale" with "Thomas Vale" and "Margaret" with "Elspeth"'


def repeat_prompt(llm: Any) -> list[int]:
    """The chat prompt's token ids: repeat PASSAGE with EDITS."""
    message = f"Repeat the following passage exactly, but {EDITS}.\n\n{PASSAGE}"
    return llm.encode_chat([{"role": "user", "content": message}])


def random_prompt(llm: Any, length: int) -> list[int]:
    """`length` random token ids (the oracle's prompt: any model, any weights)."""
    rng = np.random.default_rng(length)
    return [int(t) for t in rng.integers(100, llm.valid_vocab - 1, length)]


def _run(llm: Any, prompt: list[int], gen: int) -> tuple[list[int], float, float]:
    """(tokens, decode tok/s, decode seconds) of one greedy run from an empty cache."""
    llm.engine.forget()
    out = llm.generate(prompt, SamplingParams(max_tokens=gen, temperature=0.0, ignore_eos=True))
    return list(out.token_ids), out.timings.decode_tok_s, out.timings.decode_s


def _device_us(llm: Any, n: int, position: int) -> tuple[float | None, float | None]:
    """(decode step, n-token verify) device times in us from their graphs replayed back to back
    (CUDA; None elsewhere); the replays rewrite the caches, so the engine forgets its prefix."""
    b = llm.backend
    verify = b.time_verify_steps(n, llm.valid_vocab)
    step = b.time_decode_steps(position)
    llm.engine.forget()
    return step, verify


def run_spec_bench(llm: Any, kind: str, draft_tokens: list[int], gen: int,
                   prompt_len: int = 512) -> list[dict[str, Any]]:
    """Rows: speculation of `kind` (oracle | ngram | mtp) at each K, each against a plain decode
    of the same prompt run just before it (a loaded machine's speed drifts; adjacent runs share
    the drift)."""
    engine = llm.engine
    if engine.proposer is None:
        raise SystemExit(f"bench --spec {kind}: the engine has no proposer (spec off?)")
    proposer = engine.proposer
    text = kind != "oracle" and llm.tokenizer is not None         # random:PRESET models have no tokenizer
    prompt = repeat_prompt(llm) if text else random_prompt(llm, prompt_len)
    load = [os.getloadavg()[0]]
    rows: list[dict[str, Any]] = []
    for k in draft_tokens:
        sys.stderr.write(f"bench: plain decode, then {kind} speculation at K = {k} ...\n")
        engine.proposer = None
        _run(llm, prompt, 8)                                           # warm-up: the decode graph
        plain, plain_tok_s, plain_s = _run(llm, prompt, gen)
        engine.draft_tokens = k
        recorded, passes = plain, 0
        while True:                            # oracle: until every draft is kept (at most 3 passes)
            passes += 1
            engine.proposer = OracleProposer(tuple(prompt), tuple(recorded)) if kind == "oracle" else proposer
            _run(llm, prompt, 3 * (k + 1) + 2)     # warm-up: the K + 1 verify, eager then captured
            engine.spec_stats = SpecStats()
            tokens, tok_s, spec_s = _run(llm, prompt, gen)
            st: SpecStats = engine.spec_stats
            # a verify's argmax can differ from the plain step's (other kernels for K + 1 rows):
            # the oracle then re-records the speculative run's own output and runs again
            if kind != "oracle" or tokens == recorded or passes == 3:
                break
            recorded = tokens
        forwards = st.rounds + st.plain_steps
        step_us, verify_us = _device_us(llm, k + 1, len(prompt) + gen // 2)
        rows.append({"k": k, "plain_tok_s": plain_tok_s, "tok_s": tok_s, "tokens": len(tokens),
                     "speedup": tok_s / plain_tok_s if plain_tok_s else 0.0,
                     "tokens_per_round": st.tokens_per_round, "acceptance": st.acceptance,
                     "accepted_at": list(st.accepted_at), "rounds": st.rounds, "plain_steps": st.plain_steps,
                     "round_ms": 1e3 * spec_s / forwards if forwards else 0.0,
                     "plain_step_ms": 1e3 * plain_s / max(len(plain) - 1, 1),
                     "device_step_us": step_us, "device_verify_us": verify_us,
                     "same_output": tokens == plain, "oracle_passes": passes})
        load.append(os.getloadavg()[0])
    engine.proposer = proposer
    what = {"oracle": "random-token prompt; ORACLE drafts = the plain run's own continuation: "
                      "the upper bound of the verify machinery, not a drafter's speed-up",
            "ngram": f"n-gram sizes {NgramProposer().max_n}..{NgramProposer().min_n}",
            "mtp": "the checkpoint's MTP head drafts (random weights: acceptance means nothing)"}[kind]
    if kind != "oracle":
        what = ("repeat a passage with small edits; " if text else "random-token prompt; ") + what
    print(f"\n{llm.model_id} on {llm.device_name}: greedy, prompt {len(prompt)} tokens ({what}), "
          f"{gen} new tokens at most; 1-min load average {' -> '.join(f'{x:.1f}' for x in load)} "
          f"on {os.cpu_count()} CPUs")
    print(f"{'K':>3}{'plain t/s':>10}{'spec t/s':>9}{'speedup':>8}{'tok/round':>10}{'accept':>8}"
          f"{'round ms':>9}{'step ms':>8}{'rnd/step':>9}{'dev vfy/step':>13}{'rounds':>7}{'plain':>6}  same output")
    for r in rows:
        dev = (f"{r['device_verify_us'] / r['device_step_us']:>13.2f}"
               if r["device_verify_us"] and r["device_step_us"] else f"{'-':>13}")
        print(f"{r['k']:>3}{r['plain_tok_s']:>10.1f}{r['tok_s']:>9.1f}{r['speedup']:>8.2f}{r['tokens_per_round']:>10.2f}"
              f"{r['acceptance']:>8.1%}{r['round_ms']:>9.2f}{r['plain_step_ms']:>8.2f}"
              f"{r['round_ms'] / r['plain_step_ms'] if r['plain_step_ms'] else 0.0:>9.2f}{dev}"
              f"{r['rounds']:>7}{r['plain_steps']:>6}  {r['same_output']}")
    print("plain t/s / step ms: a plain decode run just before each K; round ms: a speculative run's "
          "decode time per forward (verify rounds and plain steps: steps with no draft); dev vfy/step: "
          "the K + 1 verify graph's device time over the decode graph's (CUDA)")
    for r in rows:
        if r["oracle_passes"] > 1:
            print(f"K={r['k']}: the verify's greedy tokens differ from plain decode's; the oracle re-recorded "
                  f"the speculative output and ran {r['oracle_passes']} times (same output: the last pass "
                  f"against the plain run)")
    for r in rows:
        if r["device_verify_us"]:
            bound = (r["k"] + 1) * r["device_step_us"] / r["device_verify_us"]
            r["device_bound_speedup"] = bound
            print(f"K={r['k']}: device verify {r['device_verify_us']:.0f} us, decode step "
                  f"{r['device_step_us']:.0f} us: every draft kept would give {bound:.2f}x the plain "
                  f"decode on the device alone; accepted at draft position {r['accepted_at']} of "
                  f"{r['rounds']} rounds")
    return rows
