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

One model load; for each K a plain decode, a warm-up of the verifies of 1..K + 1 tokens
(CUDA: eager, then the graph capture) and of the proposer, then the speculative run, same
engine and prompt (prefix reuse off: the cache is dropped before each run). Prints both
tok/s, the round time against the plain step, tokens per round (decode forwards),
acceptance, whether the greedy output equals the plain run's (where not: the first
divergence and how close a call it was), on CUDA the device time of the verify graph against
the decode graph, and the machine's load average. Knows nothing about kernels.
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


def warm_verifies(llm: Any, prompt: list[int], k: int) -> None:
    """Run a verify of every size 1..K + 1 twice (CUDA: eager, then the graph capture), so the
    timed run only replays: its last round, cut by the token budget, verifies fewer tokens,
    and a rejection re-runs the kept token."""
    gen = llm.engine.generator
    gen.forget()
    gen.prefill(prompt)
    for n in range(1, k + 2):
        for _ in range(2):
            if len(gen.tokens) + n > gen.max_context:
                gen.forget()
                gen.prefill(prompt)
            gen.verify([1000 + i for i in range(n)], llm.valid_vocab)
            gen.rollback(n)
    llm.engine.forget()


def first_divergence(llm: Any, prompt: list[int], plain: list[int], spec: list[int],
                     k: int) -> dict[str, Any] | None:
    """Where greedy speculative output first leaves plain output, and how close a call the plain
    step made there: output index j, both tokens, the plain decode step's logits at j (prefill,
    then one-token steps of plain[:j]), the K + 1 verify's row at j on that state (a verify of
    [plain[j-1], plain[j:j+K]]) and the row of the speculative run's own round (rounds of K + 1
    from the first output token, every draft kept, as the oracle's first pass ran). Logit gaps
    are plain's token minus the spec's; `forward_diff` is max |verify row - plain step row| on
    one identical state (the two forwards' arithmetic), `round_diff` the same for the round's
    row (what the verified rows before it changed too). A gap within a few forward_diff is a
    near-tie (summation order); a gap far above both points at a bug. None when they agree."""
    j = next((i for i, (a, b) in enumerate(zip(plain, spec)) if a != b), None)
    if j is None:
        return None
    gen, vocab = llm.engine.generator, llm.valid_vocab
    out: dict[str, Any] = {"index": j, "plain_token": plain[j], "spec_token": spec[j]}

    def replay(steps: int) -> np.ndarray:
        gen.forget()
        logits, _ = gen.prefill(prompt)
        for t in plain[:steps]:
            logits = gen.decode(t)
        return np.asarray(logits[:vocab], np.float64)

    step = replay(j)
    top2 = np.partition(step, -2)[-2:]
    out.update(plain_gap=float(step[plain[j]] - step[spec[j]]), top2_gap=float(top2[1] - top2[0]),
               logit_std=float(step.std()))
    if j > 0:
        replay(j - 1)
        rows = gen.verify([plain[j - 1]] + plain[j : j + k], 0)
        gen.rollback(1)
        row = np.asarray(rows[0][:vocab], np.float64)
        out.update(verify_gap=float(row[plain[j]] - row[spec[j]]),
                   forward_diff=float(np.abs(row - step).max()))
        # the speculative run's own round: rounds of K + 1 from output 0, every draft kept before j
        r, i = divmod(j - 1, k + 1)
        gen.forget()
        gen.prefill(prompt)
        for q in range(r + 1):
            fed = plain[q * (k + 1) : (q + 1) * (k + 1)]
            rows = gen.verify(fed, 0)
            gen.rollback(len(fed))
        row = np.asarray(rows[i][:vocab], np.float64)
        out.update(round_gap=float(row[plain[j]] - row[spec[j]]), round_token=int(np.argmax(row)),
                   round_diff=float(np.abs(row - step).max()))
    llm.engine.forget()
    return out


def verify_profile(llm: Any, n: int, position: int) -> dict[str, float]:
    """Device us per op family (linear layers per weight shape) of one eager n-token forward
    with logits at every row (a verify's forward; n = 1: a decode step's), each op timed alone
    in a graph (bench.py's profiler). Rewrites the caches: the engine forgets its prefix."""
    from ...bench import _ProfiledOps
    from ..batch import ForwardBatch
    from ..generator import RUNNING_SLOT

    gen = llm.engine.generator
    prof = _ProfiledOps(gen.backend)
    gen.backend.begin_step()
    ids, pos = gen.backend.ids([1000 + i for i in range(n)], position)
    gen.decoder.forward(prof, ForwardBatch.single(ids, pos, RUNNING_SLOT, all_logits=True), gen.state)
    llm.engine.forget()
    return {k: 1e6 * v[0] for k, v in prof.stats.items()}


def round_breakdown(llm: Any, prompt: list[int], k: int, reps: int = 8) -> dict[str, float] | None:
    """Host-side costs of a K + 1 verify round on CUDA, in ms: `verify_wall` one
    Generator.verify + rollback (all kept) from the call to the argmax ids on the host;
    `state_copy_host` / `state_copy_wall` the GDN copy taken before a verify (host launch time
    / with its device time); `replay_host` the verify graph's launch call alone. None off CUDA."""
    import time

    b = llm.backend
    if b.name != "cuda" or not (n := k + 1) or (n, llm.valid_vocab) not in getattr(b, "_multi", {}):
        return None
    gen = llm.engine.generator
    reps = min(reps, (gen.max_context - len(prompt) - 1) // n)
    if reps < 1:
        return None
    gen.forget()
    gen.prefill(prompt)
    sync = b.stream.synchronize
    out: dict[str, float] = {}
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        gen.verify([1000 + i for i in range(n)], llm.valid_vocab)
        gen.rollback(n)
    out["verify_wall"] = 1e3 * (time.perf_counter() - t0) / reps
    slot = getattr(gen, "_verify_slot", None)
    if slot is not None and gen.slots.num_slots:
        sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            gen.slots.snapshot(gen.running_slot, slot)
        out["state_copy_host"] = 1e3 * (time.perf_counter() - t0) / reps
        sync()
        out["state_copy_wall"] = 1e3 * (time.perf_counter() - t0) / reps
    graph = b._multi[(n, llm.valid_vocab)].graph
    if graph is not None:
        sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            graph.replay()
        out["replay_host"] = 1e3 * (time.perf_counter() - t0) / reps
        sync()
    llm.engine.forget()
    return out


def _device_us(llm: Any, n: int, position: int) -> tuple[float | None, float | None]:
    """(decode step, n-token verify) device times in us from their graphs replayed back to back
    (CUDA; None elsewhere); the replays rewrite the caches, so the engine forgets its prefix."""
    b = llm.backend
    verify = b.time_verify_steps(n, llm.valid_vocab)
    step = b.time_decode_steps(position)
    llm.engine.forget()
    return step, verify


def run_spec_bench(llm: Any, kind: str, draft_tokens: list[int], gen: int,
                   prompt_len: int = 512, profile: bool = False) -> list[dict[str, Any]]:
    """Rows: speculation of `kind` (oracle | ngram | mtp) at each K, each against a plain decode
    of the same prompt run just before it (a loaded machine's speed drifts; adjacent runs share
    the drift). profile: also the verify's op families against a decode step's and the round's
    host costs (round_breakdown), printed after the table."""
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
        recorded, passes, first = plain, 0, None
        while True:                            # oracle: until every draft is kept (at most 3 passes)
            passes += 1
            engine.proposer = OracleProposer(tuple(prompt), tuple(recorded)) if kind == "oracle" else proposer
            if passes == 1:
                warm_verifies(llm, prompt, k)
            _run(llm, prompt, 3 * (k + 1) + 2)     # warm-up: the proposer and the engine's round
            engine.spec_stats = SpecStats()
            tokens, tok_s, spec_s = _run(llm, prompt, gen)
            st: SpecStats = engine.spec_stats
            first = tokens if first is None else first
            # a verify's argmax can differ from the plain step's (other kernels for K + 1 rows):
            # the oracle then re-records the speculative run's own output and runs again
            if kind != "oracle" or tokens == recorded or passes == 3:
                break
            recorded = tokens
        forwards = st.rounds + st.plain_steps
        diverged = first_divergence(llm, prompt, plain, first, k) if first != plain else None
        step_us, verify_us = _device_us(llm, k + 1, len(prompt) + gen // 2)
        extra: dict[str, Any] = {}
        if profile:
            extra["host_ms"] = round_breakdown(llm, prompt, k)
            extra["ops_us"] = {n: verify_profile(llm, n, len(prompt)) for n in (1, k + 1)}
        rows.append({"k": k, "plain_tok_s": plain_tok_s, "tok_s": tok_s, "tokens": len(tokens),
                     "speedup": tok_s / plain_tok_s if plain_tok_s else 0.0,
                     "tokens_per_round": st.tokens_per_round, "acceptance": st.acceptance,
                     "accepted_at": list(st.accepted_at), "rounds": st.rounds, "plain_steps": st.plain_steps,
                     "round_ms": 1e3 * spec_s / forwards if forwards else 0.0,
                     "plain_step_ms": 1e3 * plain_s / max(len(plain) - 1, 1),
                     "device_step_us": step_us, "device_verify_us": verify_us,
                     "same_output": tokens == plain, "oracle_passes": passes, "divergence": diverged,
                     "snapshot_rollback": engine.generator._snapshot_verify(k + 1), **extra})
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
        d = r["divergence"]
        if d is None:
            continue
        print(f"K={r['k']}: first divergence at output token {d['index']}: plain {d['plain_token']}, "
              f"speculative {d['spec_token']}; plain step logit gap {d['plain_gap']:.3g} (its top-2 gap "
              f"{d['top2_gap']:.3g}, logit std {d['logit_std']:.3g})", end="")
        if "forward_diff" in d:
            tie = abs(d["plain_gap"]) <= 4 * d["forward_diff"]
            grown = abs(d["plain_gap"]) <= d["round_diff"]
            verdict = ("a near-tie (summation order)" if tie else
                       "the verified rows before it moved the logits past the gap (numerics such as MoE "
                       "routing near-ties, or a multi-row bug)" if grown else "NOT a near-tie: suspect a bug")
            print(f"; one-state verify row gap {d['verify_gap']:.3g}, max |verify - step| {d['forward_diff']:.3g}; "
                  f"the run's own round: argmax {d['round_token']}, gap {d['round_gap']:.3g}, max |row - step| "
                  f"{d['round_diff']:.3g}: {verdict}")
        else:
            print("; at the first token (prefill): NOT a verify difference: suspect nondeterminism")
    for r in rows:
        if r.get("host_ms"):
            print(f"K={r['k']}: host ms per round: " + ", ".join(f"{n} {v:.2f}" for n, v in r["host_ms"].items()))
        if r.get("ops_us"):
            one, many = r["ops_us"][1], r["ops_us"][r["k"] + 1]
            print(f"K={r['k']}: op families, us each alone, 1 token vs {r['k'] + 1} "
                  f"(sum {sum(one.values()):.0f} vs {sum(many.values()):.0f}):")
            for name in sorted(many, key=lambda n: -(many[n] - one.get(n, 0.0)))[:8]:
                print(f"  {name:<28}{one.get(name, 0.0):>9.0f}{many[name]:>9.0f}")
    for r in rows:
        if r["device_verify_us"]:
            bound = (r["k"] + 1) * r["device_step_us"] / r["device_verify_us"]
            r["device_bound_speedup"] = bound
            print(f"K={r['k']}: device verify {r['device_verify_us']:.0f} us, decode step "
                  f"{r['device_step_us']:.0f} us: every draft kept would give {bound:.2f}x the plain "
                  f"decode on the device alone; accepted at draft position {r['accepted_at']} of "
                  f"{r['rounds']} rounds; rollback by "
                  f"{'per-token GDN snapshots' if r['snapshot_rollback'] else 'copy + re-run'}")
    return rows
