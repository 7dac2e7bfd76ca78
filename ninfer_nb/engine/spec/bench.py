"""`ninfer bench --spec ngram --draft-tokens 1,3,5`: speculative decoding against plain decode
in one run, on a prompt that asks the model to repeat a passage with small edits (n-gram
lookup's case: the output re-quotes the prompt).

One model load; for each K a plain decode then the speculative one, same engine and prompt
(prefix reuse off: the cache is dropped before each run); it prints both tok/s, tokens per
round (decode forwards), acceptance, whether the greedy output equals the plain run's, and
the machine's load average. Knows nothing about kernels.
"""
from __future__ import annotations

import os
import sys
from typing import Any

from ...params import SamplingParams
from .ngram import NgramProposer
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


def _run(llm: Any, prompt: list[int], gen: int) -> tuple[list[int], float]:
    llm.engine.forget()
    out = llm.generate(prompt, SamplingParams(max_tokens=gen, temperature=0.0))
    return list(out.token_ids), out.timings.decode_tok_s


def run_spec_bench(llm: Any, draft_tokens: list[int], gen: int) -> list[dict[str, Any]]:
    """Rows: n-gram speculation at each K, each against a plain decode of the same prompt run
    just before it (a loaded machine's speed drifts; adjacent runs share the drift)."""
    engine = llm.engine
    if engine.proposer is None:
        raise SystemExit(f"bench --spec: speculation declined on {llm.backend.name} "
                         f"(no verify graph yet: CPU / eager backends only)")
    proposer = engine.proposer
    prompt = repeat_prompt(llm)
    _run(llm, prompt, 8)                                   # warm-up
    load = [os.getloadavg()[0]]
    rows: list[dict[str, Any]] = []
    for k in draft_tokens:
        sys.stderr.write(f"bench: plain decode, then n-gram speculation at K = {k} ...\n")
        engine.proposer = None
        plain, plain_tok_s = _run(llm, prompt, gen)
        engine.proposer, engine.draft_tokens, engine.spec_stats = proposer, k, SpecStats()
        tokens, tok_s = _run(llm, prompt, gen)
        s: SpecStats = engine.spec_stats
        rows.append({"k": k, "plain_tok_s": plain_tok_s, "tok_s": tok_s, "tokens": len(tokens),
                     "speedup": tok_s / plain_tok_s, "tokens_per_round": s.tokens_per_round,
                     "acceptance": s.acceptance, "rounds": s.rounds, "plain_steps": s.plain_steps,
                     "same_output": tokens == plain})
        load.append(os.getloadavg()[0])
    engine.proposer = proposer
    print(f"\n{llm.model_id} on {llm.device_name}: greedy, prompt {len(prompt)} tokens (repeat a passage "
          f"with small edits), {gen} new tokens at most; n-gram sizes {NgramProposer().max_n}..{NgramProposer().min_n}; "
          f"1-min load average {' -> '.join(f'{x:.1f}' for x in load)} on {os.cpu_count()} CPUs")
    print(f"{'K':>3}{'plain t/s':>10}{'spec t/s':>9}{'speedup':>8}{'tok/round':>10}{'accept':>8}{'rounds':>7}"
          f"{'plain':>6}{'tokens':>7}  same output")
    for r in rows:
        print(f"{r['k']:>3}{r['plain_tok_s']:>10.1f}{r['tok_s']:>9.1f}{r['speedup']:>8.2f}{r['tokens_per_round']:>10.2f}"
              f"{r['acceptance']:>8.1%}{r['rounds']:>7}{r['plain_steps']:>6}{r['tokens']:>7}  {r['same_output']}")
    print("plain t/s: a plain decode run just before each K; tok/round: tokens per decode forward "
          "(verify rounds and plain steps, the steps with no n-gram match)")
    return rows
