"""`ninfer bench serve` against the real server (tiny Qwen3.5 on the CPU backend)."""
from __future__ import annotations

import json
from pathlib import Path

from ninfer_nb.bench import main as bench_main
from ninfer_nb.bench_serve import parse_args, run
from tests.server.conftest import API_KEY
from tests.server.harness import LiveServer


def test_bench_serve_runs_each_concurrency(real_server: LiveServer, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    rc = bench_main(["serve", "--url", real_server.url, "--api-key", API_KEY,
                     "--concurrency", "1,2", "--num-prompts", "3", "--input-len", "8",
                     "--output-len", "4", "--range-ratio", "0.5", "--output-json", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert [r["concurrency"] for r in data["runs"]] == [1, 2]
    for r in data["runs"]:
        assert r["completed"] == 3 and r["failed"] == 0
        assert r["total_output_tokens"] == sum(data_lens(data))
        assert 0 < r["mean_ttft_ms"] <= r["mean_e2el_ms"] and r["p99_itl_ms"] > 0
        assert r["output_throughput"] > 0


def data_lens(data: dict) -> list[int]:
    """The output lengths the workload drew (same seed)."""
    from ninfer_nb.bench_serve import make_workload

    c = data["config"]
    return make_workload(c["num_prompts"], c["input_len"], c["output_len"], c["range_ratio"],
                         c["seed"], 100000, False).output_lens


def test_bench_serve_chat_and_failures(real_server: LiveServer) -> None:
    args = parse_args(["--url", real_server.url, "--api-key", API_KEY, "--endpoint", "chat",
                       "--num-prompts", "2", "--input-len", "4", "--output-len", "3",
                       "--warmup", "0"])
    runs = run(args)["runs"]
    assert runs[0]["completed"] == 2 and runs[0]["total_output_tokens"] == 6
    bad = ["serve", "--url", real_server.url, "--api-key", "wrong", "--num-prompts", "1"]
    assert bench_main(bad) == 2                      # the server refused: a user error
