"""`ninfer bench` flags for issue 29's targets: --json-schema (constrained vs plain decode in one
run) and --concurrency with the sampling flags (sampled vs greedy per level), on the CPU."""
from __future__ import annotations

import json
from pathlib import Path

from ninfer_nb.cli import main


def test_bench_json_schema_and_logprobs_rows(tmp_path: Path, tiny_qwen35_dir: Path, capsys) -> None:
    """json-schema and logprobs rows after the plain one, each with its decode rate as a share
    of the plain one's; the grammar may end its run early."""
    out = tmp_path / "bench.json"
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "required": ["ok"], "additionalProperties": False,
                                  "properties": {"ok": {"type": "boolean"}}}))
    rc = main(["bench", "--model", str(tiny_qwen35_dir), "--device", "cpu", "--prompt-len", "16", "--gen", "24",
               "--repeat", "1", "--json-schema", str(schema), "--logprobs", "5", "--json", str(out)])
    assert rc == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["engine"] for r in rows] == ["ninfer_nb", "json-schema", "logprobs=5"]
    plain, constrained, with_lp = rows
    assert with_lp["generated"] == 24 and with_lp["decode_vs_plain"] > 0
    assert plain["generated"] == 24 and 3 <= constrained["generated"] <= 24
    assert constrained["decode_vs_plain"] == constrained["decode_tok_s"] / plain["decode_tok_s"] > 0
    assert "of unconstrained greedy" in capsys.readouterr().out


def test_bench_concurrency_sampled_vs_greedy(tmp_path: Path, capsys) -> None:
    """--concurrency with --temperature and the filters: each level runs greedy, then sampled,
    with its share of greedy's aggregate, and a line on stderr as each run ends."""
    out = tmp_path / "conc.json"
    rc = main(["bench", "--random", "tiny-qwen3.5", "--device", "cpu", "--prompt-len", "12", "--gen", "5",
               "--concurrency", "1,2", "--temperature", "0.7", "--top-k", "20", "--top-p", "0.95",
               "--presence-penalty", "1.0", "--json", str(out)])
    assert rc == 0
    rows = json.loads(out.read_text())["concurrency"]
    assert [r["concurrency"] for r in rows] == [1, 1, 2, 2]
    for greedy, sampled in (rows[:2], rows[2:]):
        assert "sampled_vs_greedy" not in greedy
        assert sampled["sampled_vs_greedy"] == sampled["aggregate_decode_tok_s"] / greedy["aggregate_decode_tok_s"]
        assert 0 < greedy["steady_decode_tok_s"] and 0 < sampled["steady_sampled_vs_greedy"]
    err = capsys.readouterr().err
    assert "C=1 greedy" in err and "C=2 sampled" in err


def test_bench_prefix_cache_flag(tmp_path: Path) -> None:
    """--prefix-cache CTX runs bench_prefix.py: A's second request reuses its first's pages."""
    out = tmp_path / "prefix.json"
    rc = main(["bench", "--random", "tiny-qwen3.5", "--device", "cpu", "--prefix-cache", "300", "--json", str(out)])
    assert rc == 0
    rows = {r["request"]: r for r in json.loads(out.read_text())["rows"]}
    first, second = rows["A first"], rows["A second"]
    assert first["prefill_tokens"] == first["prompt_tokens"]
    assert second["cached_tokens"] >= first["prompt_tokens"] - 64 and second["prefill_tokens"] < 100
