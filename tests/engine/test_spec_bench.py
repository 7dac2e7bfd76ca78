"""`ninfer bench --spec oracle` on the CPU: the oracle drafter (the plain run's own greedy
continuation) is accepted in full and reproduces the plain output, with rounds of K + 1 tokens."""
from __future__ import annotations

import json
from pathlib import Path

from ninfer_nb.bench import main
from ninfer_nb.params import SamplingParams


def test_bench_spec_oracle_accepts_every_draft(tmp_path: Path) -> None:
    out = tmp_path / "spec.json"
    assert main(["--random", "tiny-qwen3.5", "--device", "cpu", "--spec", "oracle", "--draft-tokens", "2",
                 "--gen", "13", "--prompt-len", "16", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["spec"]
    assert row["k"] == 2 and row["same_output"] and row["acceptance"] == 1.0
    assert row["rounds"] == 4 and row["tokens_per_round"] == 3.0      # 12 tokens after the first: 4 x (2 + 1)


def test_first_divergence_measures_the_plain_steps_margin() -> None:
    """A spec output that leaves the plain one at token 5: the diagnostic finds index 5, the
    plain step's gap between its token and the other is its argmax margin (> 0), and the verify
    row on the same state, and the row of the run's own round (rounds of K + 1), differ from the
    plain step's row by float rounding only."""
    from ninfer_nb import LLM
    from ninfer_nb.engine.spec.bench import first_divergence, random_prompt

    llm = LLM("random:tiny-qwen3.5", device="cpu", max_context=64, spec="ngram", draft_tokens=2)
    prompt = random_prompt(llm, 12)
    llm.engine.proposer = None
    plain = list(llm.generate(prompt, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)).token_ids)
    spec = plain[:5] + [plain[5] + 1] + plain[6:]
    d = first_divergence(llm, prompt, plain, spec, 2)
    assert d is not None and d["index"] == 5 and d["spec_token"] == plain[5] + 1
    assert d["plain_gap"] > 0 and d["top2_gap"] > 0 and d["verify_gap"] > 0
    assert d["forward_diff"] < 1e-3 * d["logit_std"]
    assert d["round_token"] == plain[5] and d["round_gap"] > 0 and d["round_diff"] < 1e-3 * d["logit_std"]
    assert first_divergence(llm, prompt, plain, plain, 2) is None
