"""`ninfer bench --spec ngram --draft-tokens 1,3,5`: speculative decoding against plain decode
in one run, on a prompt that asks the model to repeat a passage with small edits (n-gram
lookup's case: the output re-quotes the prompt).

One model load: the plain run and each K run the same engine and prompt (prefix reuse off:
the cache is dropped before each run); it prints tok/s, tokens per round (decode forwards),
acceptance, and whether the greedy output equals the plain run's. Knows nothing about kernels.
"""
from __future__ import annotations

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
    """Rows: the plain decode, then n-gram speculation at each K, on the same prompt."""
    engine = llm.engine
    if engine.proposer is None:
        raise SystemExit(f"bench --spec: speculation declined on {llm.backend.name} "
                         f"(no verify graph yet: CPU / eager backends only)")
    proposer = engine.proposer
    prompt = repeat_prompt(llm)
    _run(llm, prompt, 8)                                   # warm-up
    engine.proposer = None
    plain, plain_tok_s = _run(llm, prompt, gen)
    rows: list[dict[str, Any]] = [{"k": 0, "tok_s": plain_tok_s, "tokens": len(plain), "speedup": 1.0}]
    for k in draft_tokens:
        engine.proposer, engine.draft_tokens, engine.spec_stats = proposer, k, SpecStats()
        sys.stderr.write(f"bench: n-gram speculation, K = {k} ...\n")
        tokens, tok_s = _run(llm, prompt, gen)
        s: SpecStats = engine.spec_stats
        rows.append({"k": k, "tok_s": tok_s, "tokens": len(tokens), "speedup": tok_s / plain_tok_s,
                     "tokens_per_round": s.tokens_per_round, "acceptance": s.acceptance,
                     "rounds": s.rounds, "plain_steps": s.plain_steps, "same_output": tokens == plain})
    engine.proposer = proposer
    print(f"\n{llm.model_id} on {llm.device_name}: greedy, prompt {len(prompt)} tokens (repeat a passage "
          f"with small edits), {gen} new tokens at most; n-gram sizes {NgramProposer().max_n}..{NgramProposer().min_n}")
    print(f"{'K':>3}{'tok/s':>9}{'vs plain':>9}{'tok/round':>10}{'accept':>8}{'rounds':>7}{'plain':>6}"
          f"{'tokens':>7}  same output")
    for r in rows:
        if r["k"] == 0:
            print(f"{'off':>3}{r['tok_s']:>9.1f}{1.0:>9.2f}{1.0:>10.2f}{'':>8}{'':>7}{'':>6}{r['tokens']:>7}")
            continue
        print(f"{r['k']:>3}{r['tok_s']:>9.1f}{r['speedup']:>9.2f}{r['tokens_per_round']:>10.2f}"
              f"{r['acceptance']:>8.1%}{r['rounds']:>7}{r['plain_steps']:>6}{r['tokens']:>7}  {r['same_output']}")
    print("tok/round: tokens per decode forward (verify rounds and plain steps; no-match steps are plain)")
    return rows
