"""`ninfer bench --spec oracle` on the CPU: the oracle drafter (the plain run's own greedy
continuation) is accepted in full and reproduces the plain output, with rounds of K + 1 tokens."""
from __future__ import annotations

import json
from pathlib import Path

from ninfer_nb.bench import main


def test_bench_spec_oracle_accepts_every_draft(tmp_path: Path) -> None:
    out = tmp_path / "spec.json"
    assert main(["--random", "tiny-qwen3.5", "--device", "cpu", "--spec", "oracle", "--draft-tokens", "2",
                 "--gen", "13", "--prompt-len", "16", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["spec"]
    assert row["k"] == 2 and row["same_output"] and row["acceptance"] == 1.0
    assert row["rounds"] == 4 and row["tokens_per_round"] == 3.0      # 12 tokens after the first: 4 x (2 + 1)
