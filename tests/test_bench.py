"""`ninfer bench` end to end on the CPU backend with a tiny random preset: the table, the JSON
report and both per-op profiles (decode step and prefill chunk) are produced and consistent."""
from __future__ import annotations

import json
from pathlib import Path

from ninfer_nb.cli import main


def test_bench_reports_every_figure_and_profiles(tmp_path: Path, capsys) -> None:
    out = tmp_path / "bench.json"
    rc = main(["bench", "--random", "tiny-qwen3.5", "--device", "cpu", "--prompt-len", "24,40",
               "--gen", "6", "--prefill-chunk", "16", "--profile", "--json", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["copy_bandwidth_GBps"] > 0
    rows = report["rows"]
    assert [r["prompt_tokens"] for r in rows] == [24, 40]
    for r in rows:
        assert r["prefill_tok_s"] > 0 and r["decode_tok_s"] > 0 and r["ttft_ms"] > 0
        assert r["bytes_per_token"] > 0 and 0 < r["fraction_of_limit"]
    decode, prefill = report["profile"], report["prefill_profile"]
    names = {r["op"] for r in decode}
    assert {"linear", "gated_delta_rule", "attention"} <= names
    assert {"linear", "attention"} <= {r["op"] for r in prefill}
    for prof in (decode, prefill):
        assert abs(sum(r["share"] for r in prof) - 1.0) < 1e-6
        assert all(r["calls"] > 0 and r["time_us"] > 0 for r in prof)
    # the prefill chunk runs 16 tokens through each linear layer: more bytes of activations
    lin = {r["op"]: r for r in decode}["linear"], {r["op"]: r for r in prefill}["linear"]
    assert lin[1]["bytes"] > lin[0]["bytes"]
    text = capsys.readouterr().out
    assert "One decode step by op" in text and "16-token prefill chunk" in text
    assert "ninfer_nb" in text and "of limit" in text
